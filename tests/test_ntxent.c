// NT-Xent loss and gradient: a 2-sample case worked out by hand, a larger case against
// finite differences, and a case against fixtures written by tests/reference/ntxent_reference.py
// (PyTorch's cross_entropy on the masked similarity matrix).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/ntxent_reference.h"
#include "gradcheck.h"
#include "objectives/ntxent.h"
#include "ops/l2norm.h"

typedef struct {
  ExecCtx ctx;
  NtXent loss;
  L2Norm unit;  // z's rows normalized; u and dz are copies of its output and input gradient
  int rows, d;
  float *z, *u, *du, *dz;
} Case;

static void case_init(Case *c, int rows, int d, float temperature) {
  memset(c, 0, sizeof *c);
  exec_ctx_init(&c->ctx);
  c->rows = rows;
  c->d = d;
  ntxent_init(&c->loss, &c->ctx, rows, rows, d, temperature);
  const Builder b = {.ctx = &c->ctx, .mode = OP_TRAIN, .component = COMP_LOSS};
  l2norm_init(&c->unit, &b, rows, d, 1);
  size_t n = (size_t)rows * d;
  c->z = calloc(n, sizeof(float));
  c->u = calloc(n, sizeof(float));
  c->du = calloc(n, sizeof(float));
  c->dz = calloc(n, sizeof(float));
}

static void case_destroy(Case *c) {
  ntxent_destroy(&c->loss);
  l2norm_destroy(&c->unit);
  exec_ctx_destroy(&c->ctx);
  free(c->z);
  free(c->u);
  free(c->du);
  free(c->dz);
}

// Mean loss over all rows, and dz (one replica: column-role gradients are its own).
static double case_run(Case *c) {
  const size_t n = (size_t)c->rows * c->d;
  l2norm_forward(&c->unit, &c->ctx, c->z);
  memcpy(c->u, c->unit.out, n * sizeof(float));
  double sum = ntxent_forward_backward(&c->loss, &c->ctx, c->u, c->u, 0, c->du);
  for (size_t i = 0; i < n; i++) c->du[i] += c->loss.du_col[i];
  l2norm_backward(&c->unit, &c->ctx, c->du);
  memcpy(c->dz, c->unit.din, n * sizeof(float));
  return sum / c->rows;
}

static double case_loss(void *arg) { return case_run(arg); }

// Two samples, two views, temperature 1. Rows: [A view 0, B view 0, A view 1, B view 1] with
// unit vectors (1,0), (0,1), (1,0), (0,1). Every row sees similarity 1 to its positive and 0 to
// both negatives, so loss = log(2 + e) - 1. For row 0, by the softmax gradient (p - y)/4 in
// both its row and column roles, du0 = (-1, 1) / (2 + e); through the normalization
// dz0 = du0 - u0 (u0 . du0) = (0, 1) / (2 + e).
static void test_two_samples_by_hand(void **state) {
  (void)state;
  Case c;
  case_init(&c, 4, 2, 1.0f);
  const float z[8] = {1, 0, 0, 1, 1, 0, 0, 1};
  memcpy(c.z, z, sizeof z);
  double loss = case_run(&c);
  const double e = exp(1.0), a = 1.0 / (2.0 + e);
  assert_float_equal(loss, log(2.0 + e) - 1.0, 1e-6);
  assert_float_equal(c.du[0], -a, 1e-6);
  assert_float_equal(c.du[1], a, 1e-6);
  assert_float_equal(c.dz[0], 0.0, 1e-6);
  assert_float_equal(c.dz[1], a, 1e-6);
  // Row 1 = (0,1): by symmetry du1 = (1, -1) a and dz1 = (1, 0) a.
  assert_float_equal(c.dz[2], a, 1e-6);
  assert_float_equal(c.dz[3], 0.0, 1e-6);
  case_destroy(&c);
}

static void test_finite_differences(void **state) {
  (void)state;
  Case c;
  case_init(&c, 12, 5, 0.3f);
  Rng r = rng_stream(7, RNG_TEST, 0, 0);
  for (int i = 0; i < 12 * 5; i++) c.z[i] = rng_normal(&r);
  case_run(&c);
  float *analytic = malloc(sizeof(float) * 60);
  memcpy(analytic, c.dz, sizeof(float) * 60);
  double err = gradcheck(case_loss, &c, c.z, analytic, 60, 60, 1e-3f, 1e-4, "ntxent dz");
  assert_true(err < 1e-2);
  free(analytic);
  case_destroy(&c);
}

static void test_against_reference(void **state) {
  (void)state;
  Case c;
  case_init(&c, NTXENT_REF_ROWS, NTXENT_REF_DIM, NTXENT_REF_TEMPERATURE);
  memcpy(c.z, ntxent_ref_z, sizeof ntxent_ref_z);
  double loss = case_run(&c);
  assert_float_equal(loss, NTXENT_REF_LOSS, 1e-5);
  for (int i = 0; i < NTXENT_REF_ROWS * NTXENT_REF_DIM; i++)
    assert_float_equal(c.dz[i], ntxent_ref_dz[i], 1e-5);
  case_destroy(&c);
}

// A temperature far below the similarities' spread: rows whose positive is much less similar
// than their nearest negative have a probability no float holds. The loss must still be the
// exact cross entropy, summed here in double from the definition, and the gradient finite.
static void test_cold_temperature(void **state) {
  (void)state;
  Case c;
  const int rows = 12, d = 5;
  const float t = 0.004f;
  case_init(&c, rows, d, t);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (int i = 0; i < rows * d; i++) c.z[i] = rng_normal(&r);
  double got = case_run(&c) * rows;
  double want = 0;
  int tiny = 0;
  for (int j = 0; j < rows; j++) {
    double s[12], mx = -INFINITY, z = 0;
    for (int k = 0; k < rows; k++) {
      double dot = 0;
      for (int e = 0; e < d; e++) dot += (double)c.u[j * d + e] * c.u[k * d + e];
      s[k] = dot / t;
      if (k != j) mx = fmax(mx, s[k]);
    }
    for (int k = 0; k < rows; k++) z += k == j ? 0.0 : exp(s[k] - mx);
    double lj = mx + log(z) - s[(j + rows / 2) % rows];
    tiny += lj > 69;  // the positive's probability is below 1e-30
    want += lj;
  }
  assert_true(tiny > 0);  // the case this test is for
  assert_true(fabs(got - want) <= 1e-4 * fabs(want));
  for (int i = 0; i < rows * d; i++) assert_true(isfinite(c.dz[i]));
  case_destroy(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_samples_by_hand),
      cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_against_reference),
      cmocka_unit_test(test_cold_temperature),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
