// The ops ConvNeXt adds: grouped convolution (its depthwise 7x7, groups = channels, and a case
// of two channels a group) and layer scale, each forward against a reference in double written
// here, backward against central finite differences of L = sum(out * R) for a fixed random R
// (so dL/dout = R), and their FLOP counts against the arithmetic stated here.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "ops/conv.h"
#include "ops/layerscale.h"

#define FWD_ATOL 1e-4
#define GRAD_RTOL 1e-2
#define GRAD_ATOL_SCALE 1e-2
// Both ops are linear in each input and parameter: a wide step has no truncation error.
#define EPS_LINEAR 1e-1f

typedef struct {
  void (*forward)(void *op, ExecCtx *ctx, const float *in);
  void *op;
  ExecCtx *ctx;
  const float *in;
  float *const *out;  // the op's output field (it names the call's slot)
  const float *R;
  size_t n_out;
} LossCtx;

static double loss_fn(void *vctx) {
  LossCtx *c = vctx;
  c->forward(c->op, c->ctx, c->in);
  return dot_out(*c->out, c->R, c->n_out);
}

static void expect_grad(LossCtx *lc, float *x, const float *g, size_t n, const char *label) {
  assert_non_null(g);
  double err = gradcheck(loss_fn, lc, x, g, n, n, EPS_LINEAR, GRAD_ATOL_SCALE, label);
  assert_true(err < GRAD_RTOL);
}

// ---- grouped convolution ----

typedef struct {
  int N, C, H, W, OC, K, stride, pad, groups;
} GroupCase;

// out (N, OH, OW, OC) from in (N, H, W, C), w (OC, C / G, K, K) as PyTorch's Conv2d(groups = G).
static void grouped_reference(const GroupCase *c, int OH, int OW, const float *in, const float *w,
                              const float *bias, double *out) {
  const int icg = c->C / c->groups, ocg = c->OC / c->groups;
  for (int n = 0; n < c->N; n++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int oc = 0; oc < c->OC; oc++) {
          double s = bias[oc];
          const int g = oc / ocg;
          for (int j = 0; j < icg; j++)
            for (int kh = 0; kh < c->K; kh++)
              for (int kw = 0; kw < c->K; kw++) {
                const int ih = oh * c->stride - c->pad + kh, iw = ow * c->stride - c->pad + kw;
                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                s += (double)in[((size_t)(n * c->H + ih) * c->W + iw) * c->C + g * icg + j] *
                     w[((size_t)(oc * icg + j) * c->K + kh) * c->K + kw];
              }
          out[((size_t)(n * OH + oh) * OW + ow) * c->OC + oc] = s;
        }
}

static void conv_fwd(void *l, ExecCtx *ctx, const float *in) { conv2d_forward(l, ctx, in); }

static void check_grouped(const GroupCase *c) {
  const size_t n_w = (size_t)c->OC * (c->C / c->groups) * c->K * c->K;
  Env e;
  env_init(&e, n_w + (size_t)c->OC, OP_TRAIN);
  Conv2d l;
  conv2d_init_grouped(&l, &e.b, "dw", c->N, c->C, c->H, c->W, c->OC, c->K, c->stride, c->pad,
                      c->groups, 1, 1);
  assert_int_equal(e.ps.used, n_w + (size_t)c->OC);  // weight (OC, C/G, K, K) and bias
  const int OH = (c->H + 2 * c->pad - c->K) / c->stride + 1;
  assert_int_equal(l.OH, OH);
  const size_t n_in = (size_t)c->N * c->H * c->W * c->C, n_out = (size_t)c->N * OH * OH * c->OC;
  float *in = new_tensor(n_in), *R = new_tensor(n_out);
  double *ref = malloc(n_out * sizeof *ref);
  fill_uniform(in, n_in, -1.0f, 1.0f, 1);
  fill_uniform(R, n_out, -1.0f, 1.0f, 2);
  fill_uniform(l.bias, (size_t)c->OC, -0.5f, 0.5f, 3);
  conv2d_forward(&l, &e.ctx, in);
  grouped_reference(c, OH, OH, in, l.weight, l.bias, ref);
  expect_close(l.out, ref, n_out, FWD_ATOL);
  // A multiply-add per output, tap and input channel of its group; the bias an add per output.
  const double pass = 2.0 * n_out * (c->C / c->groups) * c->K * c->K;
  assert_float_equal(e.ctx.flops_forward[0], pass + (double)n_out, 0.0);
  paramset_zero_grad(&e.ps, 0);
  conv2d_backward(&l, &e.ctx, R);
  assert_float_equal(e.ctx.flops_backward[0], 2 * pass + (double)n_out, 0.0);
  LossCtx lc = {conv_fwd, &l, &e.ctx, in, &l.out, R, n_out};
  expect_grad(&lc, in, l.din, n_in, "grouped conv din");
  expect_grad(&lc, l.weight, l.dweight, n_w, "grouped conv dweight");
  expect_grad(&lc, l.bias, l.dbias, (size_t)c->OC, "grouped conv dbias");
  conv2d_destroy(&l);
  tl_free(in);
  tl_free(R);
  free(ref);
  env_destroy(&e);
}

static void test_depthwise_7x7(void **state) {
  (void)state;
  check_grouped(&(GroupCase){2, 6, 7, 7, 6, 7, 1, 3, 6});  // ConvNeXt's: groups = channels
}

static void test_groups_of_two_channels(void **state) {
  (void)state;
  check_grouped(&(GroupCase){2, 4, 6, 6, 6, 3, 2, 1, 2});  // 2 in, 3 out a group, stride 2
}

// One group is conv2d_init's convolution: the same weights give the same output.
static void test_one_group_is_the_plain_convolution(void **state) {
  (void)state;
  Env e;
  env_init(&e, 2 * (size_t)(4 * 3 * 9 + 4), OP_INFER);
  Conv2d a, g;
  conv2d_init(&a, &e.b, "a", 1, 3, 5, 5, 4, 3, 1, 1, 1, 0);
  conv2d_init_grouped(&g, &e.b, "g", 1, 3, 5, 5, 4, 3, 1, 1, 1, 1, 0);
  memcpy(g.weight, a.weight, sizeof(float) * 4 * 3 * 9);
  float in[75];
  fill_uniform(in, 75, -1.0f, 1.0f, 4);
  conv2d_forward(&a, &e.ctx, in);
  conv2d_forward(&g, &e.ctx, in);
  assert_memory_equal(a.out, g.out, sizeof(float) * 25 * 4);
  conv2d_destroy(&a);
  conv2d_destroy(&g);
  env_destroy(&e);
}

// ---- layer scale ----

enum { LS_M = 10, LS_C = 6 };

static void ls_fwd(void *l, ExecCtx *ctx, const float *in) { layerscale_forward(l, ctx, in); }

static void test_layerscale(void **state) {
  (void)state;
  Env e;
  env_init(&e, LS_C, OP_TRAIN);
  LayerScale l;
  layerscale_init(&l, &e.b, "block.layer_scale", LS_M, LS_C, 1e-6f, 1);
  assert_int_equal(e.ps.used, LS_C);
  assert_int_equal(e.ps.entries[0].ndim, 3);  // torchvision's (C, 1, 1)
  for (int c = 0; c < LS_C; c++) assert_float_equal(l.gamma[c], 1e-6, 0.0);
  fill_uniform(l.gamma, LS_C, -2.0f, 2.0f, 5);
  float in[LS_M * LS_C], R[LS_M * LS_C];
  double ref[LS_M * LS_C];
  fill_uniform(in, LS_M * LS_C, -1.0f, 1.0f, 6);
  fill_uniform(R, LS_M * LS_C, -1.0f, 1.0f, 7);
  layerscale_forward(&l, &e.ctx, in);
  for (int i = 0; i < LS_M * LS_C; i++) ref[i] = (double)in[i] * l.gamma[i % LS_C];
  expect_close(l.out, ref, LS_M * LS_C, 1e-6);
  assert_float_equal(e.ctx.flops_forward[0], LS_M * LS_C, 0.0);  // a multiply each
  paramset_zero_grad(&e.ps, 0);
  layerscale_backward(&l, &e.ctx, R);
  // din: a multiply each; dgamma: a multiply and an add each.
  assert_float_equal(e.ctx.flops_backward[0], 3.0 * LS_M * LS_C, 0.0);
  for (int c = 0; c < LS_C; c++) {  // the column sums of R * in, written out
    double s = 0;
    for (int m = 0; m < LS_M; m++) s += (double)R[m * LS_C + c] * in[m * LS_C + c];
    assert_float_equal(l.dgamma[c], s, 1e-5);
  }
  LossCtx lc = {ls_fwd, &l, &e.ctx, in, &l.out, R, LS_M * LS_C};
  expect_grad(&lc, in, l.din, LS_M * LS_C, "layerscale din");
  expect_grad(&lc, l.gamma, l.dgamma, LS_C, "layerscale dgamma");
  layerscale_destroy(&l);
  env_destroy(&e);
}

// Two calls before backward (two views): each backward takes its own call's input, and the
// second adds its dgamma to the first's.
static void test_layerscale_two_calls(void **state) {
  (void)state;
  Env e;
  env_init(&e, LS_C, OP_TRAIN);
  e.b.calls = 2;
  LayerScale l;
  layerscale_init(&l, &e.b, "ls", LS_M, LS_C, 0.5f, 0);
  assert_null(l.din);
  float a[LS_M * LS_C], b2[LS_M * LS_C], R[LS_M * LS_C];
  fill_uniform(a, LS_M * LS_C, -1.0f, 1.0f, 8);
  fill_uniform(b2, LS_M * LS_C, -1.0f, 1.0f, 9);
  fill_uniform(R, LS_M * LS_C, -1.0f, 1.0f, 10);
  paramset_zero_grad(&e.ps, 0);
  layerscale_forward(&l, &e.ctx, a);
  layerscale_forward(&l, &e.ctx, b2);
  layerscale_backward(&l, &e.ctx, R);
  layerscale_backward(&l, &e.ctx, R);
  for (int c = 0; c < LS_C; c++) {
    double s = 0;
    for (int m = 0; m < LS_M; m++)
      s += (double)R[m * LS_C + c] * ((double)a[m * LS_C + c] + b2[m * LS_C + c]);
    assert_float_equal(l.dgamma[c], s, 1e-5);
  }
  layerscale_destroy(&l);
  env_destroy(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_depthwise_7x7),
      cmocka_unit_test(test_groups_of_two_channels),
      cmocka_unit_test(test_one_group_is_the_plain_convolution),
      cmocka_unit_test(test_layerscale),
      cmocka_unit_test(test_layerscale_two_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
