// Label-free embedding measures (eval/quality.h) on constructed embeddings whose singular values
// and spreads are known by hand: a collapsed set, a full-rank set and a set of two unequal
// directions rotated off the axes.
// cmocka needs these first, in this order.
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec_ctx.h"
#include "eval/quality.h"

static ExecCtx ctx;

// RankMe from the singular values' shares p_k (each + 1e-7, as the paper), written out here.
static double rankme_of(const double *p, int d) {
  double h = 0;
  for (int k = 0; k < d; k++) h -= (p[k] + 1e-7) * log(p[k] + 1e-7);
  return exp(h);
}

// Eight copies of one vector: one singular value, nothing spread.
static void test_collapsed(void **state) {
  (void)state;
  enum { N = 8, D = 4 };
  float f[N * D];
  for (int i = 0; i < N; i++)
    for (int k = 0; k < D; k++) f[i * D + k] = (float)(k + 1) * 0.5f;
  EmbeddingQuality q;
  assert_int_equal(embedding_quality(f, N, D, &ctx, &q), 0);
  const double p[D] = {1, 0, 0, 0};
  assert_float_equal(q.rankme, rankme_of(p, D), 1e-6);
  assert_true(q.rankme < 1.0001);
  assert_float_equal(q.embedding_std, 0, 1e-7);
  assert_float_equal(q.embedding_std_reference, 0.5, 1e-12);
  assert_true(embedding_quality_collapsed(&q));
}

// +e_k and -e_k for every k: the Gram matrix is 2I, every direction an equal share (rankme = d),
// and each normalized dimension is +1 once, -1 once and 0 elsewhere: std sqrt(2 / 2d) = 1/sqrt(d).
static void test_full_rank(void **state) {
  (void)state;
  enum { D = 64, N = 2 * D };
  float *f = calloc((size_t)N * D, sizeof *f);
  for (int k = 0; k < D; k++) {
    f[(size_t)(2 * k) * D + k] = 3.0f;
    f[(size_t)(2 * k + 1) * D + k] = -3.0f;
  }
  EmbeddingQuality q;
  assert_int_equal(embedding_quality(f, N, D, &ctx, &q), 0);
  double p[D];
  for (int k = 0; k < D; k++) p[k] = 1.0 / D;
  assert_float_equal(q.rankme, rankme_of(p, D), 1e-6);
  assert_float_equal(q.rankme, D, 0.01);  // the 1e-7 terms add 0.0013
  assert_float_equal(q.embedding_std, 1 / sqrt((double)D), 1e-7);
  assert_false(embedding_quality_collapsed(&q));
  free(f);
}

// Four rows of length 3 along (1, 1, 0)/sqrt 2 and four of length 1 along (1, -1, 0)/sqrt 2: the
// Gram matrix is not diagonal, its eigenvalues 4 * 9 and 4 * 1, so the singular values are 6 and
// 2 and 0: shares 3/4, 1/4 and 0.
static void test_two_directions_off_axis(void **state) {
  (void)state;
  enum { N = 8, D = 3 };
  float f[N * D];
  const double h = 1 / sqrt(2.0);
  for (int i = 0; i < N; i++) {
    const double len = i < 4 ? 3 : 1, sign = i < 4 ? 1 : -1;
    f[i * D + 0] = (float)(len * h);
    f[i * D + 1] = (float)(sign * len * h);
    f[i * D + 2] = 0;
  }
  EmbeddingQuality q;
  assert_int_equal(embedding_quality(f, N, D, &ctx, &q), 0);
  const double p[D] = {0.75, 0.25, 0};
  assert_float_equal(q.rankme, rankme_of(p, D), 1e-5);
  // Normalized: every row is (h, ±h, 0), half of each sign in dimension 1: std 0, h, 0.
  assert_float_equal(q.embedding_std, h / 3, 1e-6);
}

// Fewer rows than dimensions, spread over a wide range: row i is 2^(-i/4) times the i-th row of
// the 256-point Walsh-Hadamard matrix over 16 (orthonormal, every entry +-1/16), so the
// singular values are 2^(-i/4) exactly and the other 216 are 0. A (d, d) Gram matrix in f32
// leaves rounding noise of about 1e-7 of the largest eigenvalue in each of those 216, whose square
// roots are 3e-4 of the largest singular value: enough to lift rankme by several directions.
static void test_fewer_rows_than_dimensions(void **state) {
  (void)state;
  enum { N = 40, D = 256 };
  float *f = malloc(sizeof *f * N * D);
  double p[D] = {0}, total = 0;
  for (int i = 0; i < N; i++) {
    const double s = pow(2, -i / 4.0);
    for (int k = 0; k < D; k++)
      f[i * D + k] = (float)(s * (__builtin_popcount((unsigned)(i & k)) % 2 ? -1 : 1) / 16.0);
    p[i] = s;
    total += s;
  }
  for (int i = 0; i < N; i++) p[i] /= total;
  EmbeddingQuality q;
  assert_int_equal(embedding_quality(f, N, D, &ctx, &q), 0);
  assert_float_equal(q.rankme, rankme_of(p, D), 1e-3);
  free(f);
}

static void test_refuses(void **state) {
  (void)state;
  float f[4] = {1, 2, NAN, 4};
  EmbeddingQuality q;
  assert_int_equal(embedding_quality(f, 2, 2, &ctx, &q), -1);
  assert_int_equal(embedding_quality(f, 1, 2, &ctx, &q), -1);
}

int main(void) {
  exec_ctx_init(&ctx);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collapsed),
      cmocka_unit_test(test_full_rank),
      cmocka_unit_test(test_two_directions_off_axis),
      cmocka_unit_test(test_fewer_rows_than_dimensions),
      cmocka_unit_test(test_refuses),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  exec_ctx_destroy(&ctx);
  return rc;
}
