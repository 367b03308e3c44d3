// Max pooling (ops/maxpool.h), ResNet's ImageNet stem pool (3x3, stride 2, padding 1): forward
// against a naive loop over each window that skips the padding, backward against central finite
// differences of L = sum(out * R), FLOP counters against the analytic counts, and the workspace
// kept per forward call in training and not at all without backward.
//
// The inputs are a shuffled ladder of distinct values 0.05 apart, so every window's maximum
// wins by more than the 0.01 perturbation and finite differences see the same argmax.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "ops/maxpool.h"

#define EPS 1e-2f
#define GRAD_RTOL 1e-3
#define GRAD_ATOL_SCALE 1e-2

// Distinct values step * (a permutation of 0..n-1) - an offset, in a fixed shuffled order.
static void fill_ladder(float *x, size_t n, float step, uint64_t stream) {
  for (size_t i = 0; i < n; i++) x[i] = (float)i;
  Rng r = rng_stream(7, RNG_TEST, stream, 0);
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = rng_below(&r, (uint32_t)(i + 1));
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
  for (size_t i = 0; i < n; i++) x[i] = step * x[i] - step * (float)n / 2;
}

// out (N, OH, OW, C): each window's maximum over the input positions it covers.
static void maxpool_reference(const MaxPool *l, const float *in, double *out) {
  for (int n = 0; n < l->N; n++)
    for (int oy = 0; oy < l->OH; oy++)
      for (int ox = 0; ox < l->OW; ox++)
        for (int c = 0; c < l->C; c++) {
          double best = -INFINITY;
          for (int ky = 0; ky < l->K; ky++)
            for (int kx = 0; kx < l->K; kx++) {
              int y = oy * l->S - l->P + ky, x = ox * l->S - l->P + kx;
              if (y < 0 || y >= l->H || x < 0 || x >= l->W) continue;
              double v = in[(((size_t)n * l->H + y) * l->W + x) * l->C + c];
              if (v > best) best = v;
            }
          out[(((size_t)n * l->OH + oy) * l->OW + ox) * l->C + c] = best;
        }
}

typedef struct {
  MaxPool *l;
  ExecCtx *ctx;
  const float *in, *R;
  size_t n_out;
} LossCtx;

static double loss_fn(void *vctx) {
  LossCtx *c = vctx;
  maxpool_forward(c->l, c->ctx, c->in);
  double s = 0;
  for (size_t i = 0; i < c->n_out; i++) s += (double)c->l->out[i] * c->R[i];
  return s;
}

// An odd side (7 -> 4, the last window half padding) and an even one (8 -> 4).
static void check_maxpool(int N, int H, int W, int C) {
  Env e;
  env_init(&e, 1, OP_TRAIN);
  MaxPool l;
  maxpool_init(&l, &e.b, N, H, W, C, 3, 2, 1, 1);
  assert_int_equal(l.OH, (H + 2 - 3) / 2 + 1);  // PyTorch's MaxPool2d(3, 2, 1) output side
  assert_int_equal(l.OW, (W + 2 - 3) / 2 + 1);
  assert_true(l.workspace_bytes > 0);
  const size_t n_in = (size_t)N * H * W * C, n_out = (size_t)N * l.OH * l.OW * C;
  float *in = new_tensor(n_in), *R = new_tensor(n_out);
  double *ref = calloc(n_out, sizeof *ref);
  fill_ladder(in, n_in, 0.05f, (uint64_t)H);
  fill_uniform(R, n_out, -1, 1, 21);
  exec_ctx_reset_flops(&e.ctx);
  maxpool_forward(&l, &e.ctx, in);
  maxpool_reference(&l, in, ref);
  expect_close(l.out, ref, n_out, 1e-6);
  maxpool_backward(&l, &e.ctx, R);
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], (double)n_out * 8, 0.5);
  assert_float_equal(e.ctx.flops_backward[COMP_ENCODER], (double)n_out, 0.5);
  // Each output's gradient lands on its window's maximum: the input gradients sum to sum(R).
  double sum_din = 0, sum_r = 0;
  for (size_t i = 0; i < n_in; i++) sum_din += l.din[i];
  for (size_t i = 0; i < n_out; i++) sum_r += R[i];
  assert_float_equal(sum_din, sum_r, 1e-4);
  LossCtx lc = {&l, &e.ctx, in, R, n_out};
  double err = gradcheck(loss_fn, &lc, in, l.din, n_in, n_in, EPS, GRAD_ATOL_SCALE, "maxpool din");
  assert_true(err < GRAD_RTOL);
  free(ref);
  tl_free(in);
  tl_free(R);
  maxpool_destroy(&l);
  env_destroy(&e);
}

static void test_maxpool_odd(void **state) {
  (void)state;
  check_maxpool(2, 7, 7, 3);
}

static void test_maxpool_even(void **state) {
  (void)state;
  check_maxpool(2, 8, 6, 5);
}

// Two forward calls before backward (two views): each backward routes through its own call's
// argmax, kept in its own workspace slot.
static void test_maxpool_two_calls(void **state) {
  (void)state;
  enum { N = 1, H = 6, W = 6, C = 2, n_in = N * H * W * C, n_out = N * 3 * 3 * C };
  Env e;
  env_init(&e, 1, OP_TRAIN);
  e.b.calls = 2;
  MaxPool l, single;
  maxpool_init(&l, &e.b, N, H, W, C, 3, 2, 1, 1);
  e.b.calls = 1;
  maxpool_init(&single, &e.b, N, H, W, C, 3, 2, 1, 1);
  float *a = new_tensor(n_in), *b = new_tensor(n_in), *R = new_tensor(n_out);
  fill_ladder(a, n_in, 0.05f, 1);
  fill_ladder(b, n_in, 0.05f, 2);
  fill_uniform(R, n_out, -1, 1, 3);
  float want_a[n_in], want_b[n_in];
  maxpool_forward(&single, &e.ctx, a);
  maxpool_backward(&single, &e.ctx, R);
  memcpy(want_a, single.din, sizeof want_a);
  maxpool_forward(&single, &e.ctx, b);
  maxpool_backward(&single, &e.ctx, R);
  memcpy(want_b, single.din, sizeof want_b);
  paramset_zero_grad(e.b.params, 0);
  maxpool_forward(&l, &e.ctx, a);
  maxpool_forward(&l, &e.ctx, b);
  maxpool_backward(&l, &e.ctx, R);  // the second call's
  assert_memory_equal(l.din, want_b, sizeof want_b);
  maxpool_backward(&l, &e.ctx, R);
  assert_memory_equal(l.din, want_a, sizeof want_a);
  tl_free(a);
  tl_free(b);
  tl_free(R);
  maxpool_destroy(&l);
  maxpool_destroy(&single);
  env_destroy(&e);
}

// Without backward there is no workspace and no input gradient.
static void test_maxpool_infer(void **state) {
  (void)state;
  Env e;
  env_init(&e, 1, OP_INFER);
  MaxPool l;
  maxpool_init(&l, &e.b, 2, 7, 7, 3, 3, 2, 1, 1);
  assert_int_equal(l.workspace_bytes, 0);
  assert_null(l.workspace_slots);
  assert_null(l.din);
  float *in = new_tensor(2 * 7 * 7 * 3);
  double ref[2 * 4 * 4 * 3];
  fill_ladder(in, 2 * 7 * 7 * 3, 0.05f, 9);
  maxpool_forward(&l, &e.ctx, in);
  maxpool_reference(&l, in, ref);
  expect_close(l.out, ref, 2 * 4 * 4 * 3, 1e-6);
  tl_free(in);
  maxpool_destroy(&l);
  env_destroy(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_maxpool_odd),
      cmocka_unit_test(test_maxpool_even),
      cmocka_unit_test(test_maxpool_two_calls),
      cmocka_unit_test(test_maxpool_infer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
