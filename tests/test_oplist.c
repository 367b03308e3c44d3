// An op list (ops/oplist.h) on small lists: what it makes itself (the sum of the gradients
// reaching a value two nodes read), what it lets the planner decide (an op over its input when
// nothing reads the input later), and that recomputing an output before the backward that reads
// it gives that backward the same bits as keeping it. Expected values are worked out by hand.
#include "op_test_util.h"

#include <string.h>

#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/layernorm.h"
#include "ops/layerscale.h"
#include "ops/linear.h"
#include "ops/oplist.h"

enum { N = 2, T = 3, D = 8, OUT = 5 };

// out = relu(x) + x: x is read by the ReLU and the sum, so its gradient is the sum of the two
// paths: dout (x > 0) + dout.
static void test_two_readers_sum_their_gradients(void **state) {
  (void)state;
  Env e;
  env_init(&e, 1, OP_TRAIN);
  BufferPool pool = {0};
  e.b.pool = &pool;
  OpList l = {0};
  const int relu = oplist_add(&l, &op_relu, OPLIST_INPUT, 0, (OpArgs){0});
  oplist_add(&l, &op_add, relu, OPLIST_INPUT, (OpArgs){.flags = OP_ARG_OWN_OUTPUT});
  const BufValue din = buffer_pool_value(&pool, VALUE_GRAD);
  oplist_build(&l, &e.b, (OpShape){N, T, 1, D}, 1, (OpListValues){0, 0, din});
  buffer_pool_finish(&pool, COMP_OTHER);
  assert_non_null(l.values[0].sum);  // the list made the sum; the ReLU's output has one reader
  assert_null(l.values[relu].sum);
  const size_t n = (size_t)N * T * D;
  float *x = new_tensor(n), *dout = new_tensor(n);
  fill_uniform(x, n, -1, 1, 1);
  fill_uniform(dout, n, -1, 1, 2);
  const float *out = oplist_forward(&l, &e.ctx, x);
  for (size_t i = 0; i < n; i++) assert_true(out[i] == (x[i] > 0 ? x[i] : 0) + x[i]);
  paramset_zero_grad(&e.ps, 0);
  const float *dx = oplist_backward(&l, &e.ctx, dout);
  for (size_t i = 0; i < n; i++) assert_true(dx[i] == (x[i] > 0 ? dout[i] : 0) + dout[i]);
  oplist_destroy(&l);
  buffer_pool_free(&pool);
  tl_free(x);
  tl_free(dout);
  env_destroy(&e);
}

// Without the input's gradient wanted there is no sum and backward hands back nothing.
static void test_unwanted_input_gradient_has_no_sum(void **state) {
  (void)state;
  Env e;
  env_init(&e, 1, OP_TRAIN);
  OpList l = {0};
  oplist_add(&l, &op_add, oplist_add(&l, &op_relu, OPLIST_INPUT, 0, (OpArgs){0}), OPLIST_INPUT,
             (OpArgs){0});
  oplist_build(&l, &e.b, (OpShape){N, T, 1, D}, 0, (OpListValues){0, 0, 0});
  assert_null(l.values[0].sum);
  const size_t n = (size_t)N * T * D;
  float *x = new_tensor(n), *dout = new_tensor(n);
  fill_uniform(x, n, -1, 1, 1);
  fill_uniform(dout, n, -1, 1, 2);
  oplist_forward(&l, &e.ctx, x);
  paramset_zero_grad(&e.ps, 0);
  assert_null(oplist_backward(&l, &e.ctx, dout));
  oplist_destroy(&l);
  tl_free(x);
  tl_free(dout);
  env_destroy(&e);
}

// Without backward, relu(relu(x)): the second ReLU may write over the first's output, which
// nothing reads after it, so both outputs are one place in the pool.
static void test_forward_only_chain_runs_in_place(void **state) {
  (void)state;
  Env e;
  env_init(&e, 1, OP_FORWARD);
  BufferPool pool = {0};
  e.b.pool = &pool;
  OpList l = {0};
  const int first = oplist_add(&l, &op_relu, OPLIST_INPUT, 0, (OpArgs){0});
  const int second = oplist_add(&l, &op_relu, first, 0, (OpArgs){0});
  oplist_build(&l, &e.b, (OpShape){N, T, 1, D}, 0, (OpListValues){0, 0, 0});
  buffer_pool_finish(&pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&pool, 0), (size_t)N * T * D * sizeof(float));
  assert_ptr_equal(((Eltwise *)oplist_op(&l, first))->out, ((Eltwise *)oplist_op(&l, second))->out);
  oplist_destroy(&l);
  buffer_pool_free(&pool);
  env_destroy(&e);
}

// linear(layernorm(x)) in training, built with [train] recompute on and off: the norm's output,
// which the linear layer's weight gradient reads, is a pool buffer written again before that
// backward (on) or kept (off), and both give the same gradients to the bit.
typedef struct {
  Env e;
  BufferPool pool;
  OpList l;
  int norm;
} Pair;

static void pair_build(Pair *p, int recompute) {
  memset(p, 0, sizeof *p);
  env_init(&p->e, layernorm_floats(D) + linear_floats(D, OUT, 1), OP_TRAIN);
  p->e.policy.recompute = recompute;
  p->e.b.pool = &p->pool;
  p->norm = oplist_add(&p->l, &op_layernorm, OPLIST_INPUT, 0, (OpArgs){.name = "norm"});
  oplist_add(&p->l, &op_linear, p->norm, 0,
             (OpArgs){.name = "fc", .channels = OUT, .has_bias = 1, .flags = OP_ARG_OWN_OUTPUT});
  const BufValue din = buffer_pool_value(&p->pool, VALUE_GRAD);
  oplist_build(&p->l, &p->e.b, (OpShape){N, T, 1, D}, 1, (OpListValues){0, 0, din});
  buffer_pool_finish(&p->pool, COMP_OTHER);
}

static void pair_destroy(Pair *p) {
  oplist_destroy(&p->l);
  buffer_pool_free(&p->pool);
  env_destroy(&p->e);
}

static void test_recomputed_output_gives_the_kept_ones_gradients(void **state) {
  (void)state;
  Pair on, off;
  pair_build(&on, 1);
  pair_build(&off, 0);
  const LayerNorm *norm_on = oplist_op(&on.l, on.norm), *norm_off = oplist_op(&off.l, off.norm);
  assert_true(norm_on->calls.out_shared);
  assert_false(norm_off->calls.out_shared);
  const size_t n = (size_t)N * T * D, n_out = (size_t)N * T * OUT;
  float *x = new_tensor(n), *dout = new_tensor(n_out);
  fill_uniform(x, n, -1, 1, 3);
  fill_uniform(dout, n_out, -1, 1, 5);
  Pair *pairs[] = {&on, &off};
  const float *dx[2];
  for (int i = 0; i < 2; i++) {
    oplist_forward(&pairs[i]->l, &pairs[i]->e.ctx, x);
    // A pool buffer belongs to whatever the planner puts there next: scribble over it.
    if (i == 0) memset(norm_on->out, 0xff, n * sizeof(float));
    paramset_zero_grad(&pairs[i]->e.ps, 0);
    dx[i] = oplist_backward(&pairs[i]->l, &pairs[i]->e.ctx, dout);
  }
  assert_memory_equal(dx[0], dx[1], n * sizeof(float));
  assert_memory_equal(on.e.ps.grad, off.e.ps.grad, on.e.ps.count * sizeof(float));
  tl_free(x);
  tl_free(dout);
  pair_destroy(&on);
  pair_destroy(&off);
}

// ConvNeXt's kinds: a depthwise 1x1 convolution (groups = channels, no bias) then a layer scale
// starting at 1/2, on (N, T, 1, D): out = w_c x / 2 per channel c. Backward: dx = dout w_c / 2,
// dw_c = the sum over rows of dout x / 2, dgamma_c = of dout w_c x. The layer scale's backward
// reads its input, so in training it writes elsewhere.
static void test_depthwise_conv_and_layer_scale(void **state) {
  (void)state;
  Env e;
  env_init(&e, conv_floats(1, D, 1, 0) + D, OP_TRAIN);
  BufferPool pool = {0};
  e.b.pool = &pool;
  e.b.layout = ACT_LAYOUT_NHWC;
  OpList l = {0};
  const int conv =
      oplist_add(&l, &op_conv, OPLIST_INPUT, 0,
                 (OpArgs){.name = "dw", .channels = D, .kernel = 1, .stride = 1, .groups = D});
  const int scale =
      oplist_add(&l, &op_layerscale, conv, 0,
                 (OpArgs){.name = "scale", .scale_init = 0.5f, .flags = OP_ARG_OWN_OUTPUT});
  const BufValue din = buffer_pool_value(&pool, VALUE_GRAD);
  oplist_build(&l, &e.b, (OpShape){N, T, 1, D}, 1, (OpListValues){0, 0, din});
  buffer_pool_finish(&pool, COMP_OTHER);
  const Conv2d *dw = oplist_op(&l, conv);
  const LayerScale *ls = oplist_op(&l, scale);
  assert_int_equal(dw->groups, D);
  const size_t rows = (size_t)N * T, n = rows * D;
  float *x = new_tensor(n), *dout = new_tensor(n);
  fill_uniform(x, n, -1, 1, 7);
  fill_uniform(dout, n, -1, 1, 8);
  const float *out = oplist_forward(&l, &e.ctx, x);
  assert_ptr_not_equal(out, dw->out);
  double want[N * T * D], dx_want[N * T * D], dw_want[D] = {0}, dg_want[D] = {0};
  for (size_t m = 0; m < rows; m++)
    for (int c = 0; c < D; c++) {
      const size_t i = m * D + c;
      want[i] = 0.5 * dw->weight[c] * x[i];
      dx_want[i] = 0.5 * dw->weight[c] * dout[i];
      dw_want[c] += 0.5 * dout[i] * x[i];
      dg_want[c] += (double)dout[i] * dw->weight[c] * x[i];
    }
  expect_close(out, want, n, 1e-6);
  paramset_zero_grad(&e.ps, 0);
  const float *dx = oplist_backward(&l, &e.ctx, dout);
  expect_close(dx, dx_want, n, 1e-6);
  expect_close(dw->dweight, dw_want, D, 1e-5);
  expect_close(ls->dgamma, dg_want, D, 1e-5);
  oplist_destroy(&l);
  buffer_pool_free(&pool);
  tl_free(x);
  tl_free(dout);
  env_destroy(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_readers_sum_their_gradients),
      cmocka_unit_test(test_unwanted_input_gradient_has_no_sum),
      cmocka_unit_test(test_forward_only_chain_runs_in_place),
      cmocka_unit_test(test_recomputed_output_gives_the_kept_ones_gradients),
      cmocka_unit_test(test_depthwise_conv_and_layer_scale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
