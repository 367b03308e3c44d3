// Input gradients live only as long as backward needs them: a training ResNet's share three
// buffers, each the size of the largest activation, however deep the network; and a block keeps
// only the activations its backward reads — stated by hand for a small network and checked
// against what the allocator holds. (That nothing still needed is
// overwritten is what the backbone gradient tests check against finite differences.)
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_test_util.h"
#include "nn/backbone.h"
#include "ops/conv.h"

// N images of S x S x C framed to P = S + 4; stem 4 channels at P x P, stage 1: 4 blocks of
// 4 channels at stride 1, stage 2: 1 block of 8 channels at stride 2 (P / 2 square).
enum { N = 4, S = 8, C = 3, P = S + 4 };

static ModelSpec spec_of(int blocks_in_stage1) {
  ModelSpec m = tiny_model_spec("resnet");
  m.pad_to = P;
  m.stage_blocks[0] = blocks_in_stage1;
  return m;
}

// What a training network of that shape holds in `cat`, bytes, under [train] recompute.
static size_t bytes_held_r(int n, int blocks_in_stage1, MemCategory cat, int recompute) {
  const ModelSpec m = spec_of(blocks_in_stage1);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  BuildPolicy policy = build_policy_default();
  policy.recompute = recompute;
  ParamSet ps;
  paramset_alloc(&ps, backbone_param_count(&m, S, C), 3);
  size_t before = tl_mem_live(cat);
  Builder b = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN, .policy = &policy};
  Backbone *bb = backbone_create(&m, &b, n, S, C);
  assert_non_null(bb);
  size_t held = tl_mem_live(cat) - before;
  bb->destroy(bb);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);  // the scratchpad is the context's
  assert_int_equal(tl_mem_live(cat), before);
  return held;
}

// The pool's workspace and gradients together, with `blocks_in_stage1` and [train] recompute.
static long long pool_bytes_r(int blocks_in_stage1, int recompute) {
  return (long long)(bytes_held_r(N, blocks_in_stage1, MEM_WORKSPACE, recompute) +
                     bytes_held_r(N, blocks_in_stage1, MEM_ACT_GRAD, recompute));
}

static size_t bytes_held(int blocks_in_stage1, MemCategory cat) {
  return bytes_held_r(N, blocks_in_stage1, cat, 0);
}

static void test_resnet_input_gradients_peak_at_three(void **state) {
  (void)state;
  // The largest activation: the stem's and stage 1's output, N * P * P * 4 floats (stage 2's
  // projection gradient is the same size: its input). Stage 2's output is a quarter of that.
  // Three of them are live at once in a block's backward (the gradient reaching it, the one it
  // sends through its residual and the one its convolutions write): the gradients' share of the
  // pool is the most of them live at once. The rest of the pool (forward temporaries, the
  // convolutions' scratchpads) is counted as workspace.
  const size_t largest = (size_t)N * P * P * 4 * sizeof(float);
  const size_t grads = bytes_held(1, MEM_ACT_GRAD);
  assert_int_equal(grads, 3 * largest);
  assert_int_equal(bytes_held(4, MEM_ACT_GRAD), grads);  // depth does not add any
}

// The scratchpad a convolution's pass asks oneDNN for lives in the network's pool, beside the
// gradients and temporaries of the other ops, not in the context's shared scratchpad (which held
// every pass's largest for the whole run): a network whose every convolution needs one leaves
// the context's smaller than one stage-1 convolution needs on its own.
static void test_resnet_convolution_scratchpads_are_pooled(void **state) {
  (void)state;
  ExecCtx alone;
  exec_ctx_init(&alone);
  ParamSet ps;
  paramset_alloc(&ps, 4 * 4 * 3 * 3, 1);
  Builder b = {.ctx = &alone, .params = &ps, .mode = OP_TRAIN};
  Conv2d conv;
  conv2d_init(&conv, &b, "c", N, 4, P, P, 4, 3, 1, 1, 0, 1);
  const size_t one_conv = alone.scratchpad_bytes;
  conv2d_destroy(&conv);
  paramset_free(&ps);
  exec_ctx_destroy(&alone);
  assert_true(one_conv > 0);

  const ModelSpec m = spec_of(2);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  paramset_alloc(&ps, backbone_param_count(&m, S, C), 3);
  Builder bb_b = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN};
  Backbone *bb = backbone_create(&m, &bb_b, N, S, C);
  assert_non_null(bb);
  fprintf(stderr, "a stage-1 convolution alone asks %zu bytes; the network leaves %zu shared\n",
          one_conv, ctx.scratchpad_bytes);
  assert_true(ctx.scratchpad_bytes < one_conv);
  bb->destroy(bb);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
}

// A block keeps four tensors of its output's size for backward (with [train] recompute = 0):
// conv1's and conv2's outputs (the BatchNorms' inputs), bn1's (conv2's input) and the block's
// output (the next convolutions' input, and the final ReLU's gradient from its sign). bn2's output
// and the residual sum, read only on the way forward, share a pool buffer with every block's; so
// does the projection BatchNorm's output (a second one). Besides
// the tensors, a block keeps BatchNorm statistics (mean and variance per channel for bn1 and bn2)
// and bn1's fused-ReLU mask, at most a byte an element (oneDNN's is a byte).
static void test_resnet_block_keeps_four_tensors(void **state) {
  (void)state;
  const size_t tensor = (size_t)N * P * P * 4 * sizeof(float);  // a stage-1 block's output
  const size_t stats = 2 * 2 * 4 * sizeof(float), mask_at_most = tensor / sizeof(float);
  const size_t per_block = bytes_held(2, MEM_ACT) - bytes_held(1, MEM_ACT);
  print_message("a stage-1 block keeps %zu bytes: 4 tensors of %zu, then %zu\n", per_block, tensor,
                per_block - 4 * tensor);
  assert_true(per_block >= 4 * tensor + stats);
  assert_true(per_block <= 4 * tensor + stats + mask_at_most);
  assert_int_equal(bytes_held(4, MEM_ACT) - bytes_held(1, MEM_ACT), 3 * per_block);
  // bn2's and the sum's scratch is shared: what a block adds to the workspace (its
  // convolutions' reordered weights) does not grow with the batch, as a buffer of its own would.
  const size_t ws_block = bytes_held(2, MEM_WORKSPACE) - bytes_held(1, MEM_WORKSPACE);
  assert_int_equal(
      bytes_held_r(2 * N, 2, MEM_WORKSPACE, 0) - bytes_held_r(2 * N, 1, MEM_WORKSPACE, 0),
      ws_block);
  // Recomputing (the default) writes each block's bn1 output again before conv2's backward and
  // the stem's output before the first block's conv1 backward instead of keeping them: a
  // stage-1 tensor a block fewer, plus the stem's (stage 1's size) and the stage-2 block's bn1
  // output (8 channels at P / 2).
  const size_t tensor2 = (size_t)N * (P / 2) * (P / 2) * 8 * sizeof(float);
  assert_int_equal(bytes_held_r(N, 2, MEM_ACT, 1) - bytes_held_r(N, 1, MEM_ACT, 1),
                   per_block - tensor);
  assert_int_equal(bytes_held(1, MEM_ACT) - bytes_held_r(N, 1, MEM_ACT, 1), 2 * tensor + tensor2);
  // What is written again lives in backward beside the gradients, in the pool (workspace and
  // gradients together): it adds at most one stage-1 tensor where the pool is at its fullest,
  // plus what its placement between the others leaves unused (the planner places by size, not
  // optimally), and nothing when the pool is fullest elsewhere (inside a convolution whose
  // scratchpad is larger, as on oneDNN 3.7); whatever the depth.
  const long long growth = pool_bytes_r(1, 1) - pool_bytes_r(1, 0);
  print_message("recomputing adds %lld bytes to the pool (a stage-1 tensor: %zu)\n", growth,
                tensor);
  assert_true(growth >= 0);
  assert_true(growth < 2 * (long long)tensor);
  for (int blocks = 2; blocks <= 4; blocks += 2)
    assert_int_equal(pool_bytes_r(blocks, 1) - pool_bytes_r(blocks, 0), growth);
}

// The parameter gradients of two views (two forward calls, backward in reverse), with and
// without recomputing bn1's output: the same up to float rounding (oneDNN normalizes with given
// statistics in another order of operations than with its own).
static void grads_of(int recompute, float *grads, size_t count) {
  const ModelSpec m = spec_of(2);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  BuildPolicy policy = build_policy_default();
  policy.recompute = recompute;
  ParamSet ps;
  paramset_alloc(&ps, backbone_param_count(&m, S, C), 3);
  assert_int_equal(ps.count, count);
  Builder b = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN, .calls = 2, .policy = &policy};
  Backbone *bb = backbone_create(&m, &b, N, S, C);
  float images[2][N * S * S * C], dfeature[2][N * 8];
  for (int v = 0; v < 2; v++) {
    for (size_t i = 0; i < N * S * S * C; i++)
      images[v][i] = (float)(((i + 31 * v) * 7919) % 101) / 50.0f - 1.0f;
    for (size_t i = 0; i < N * 8; i++)
      dfeature[v][i] = (float)(((i + 7 * v) * 613) % 29) / 14.0f - 1.0f;
  }
  paramset_zero_grad(&ps, 0);
  bb->forward(bb, &ctx, images[0]);
  bb->forward(bb, &ctx, images[1]);
  bb->backward(bb, &ctx, dfeature[1]);
  bb->backward(bb, &ctx, dfeature[0]);
  memcpy(grads, ps.grad, count * sizeof(float));
  bb->destroy(bb);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
}

static void test_resnet_recompute_keeps_gradients(void **state) {
  (void)state;
  const ModelSpec m = spec_of(2);
  const size_t count = backbone_param_count(&m, S, C);
  float *kept = calloc(count, sizeof(float)), *again = calloc(count, sizeof(float));
  grads_of(0, kept, count);
  grads_of(1, again, count);
  double worst = 0, largest = 0;
  for (size_t i = 0; i < count; i++) {
    worst = fmax(worst, fabs(again[i] - kept[i]));
    largest = fmax(largest, fabs(kept[i]));
  }
  print_message("gradients up to %.3g, recomputed differ by %.3g\n", largest, worst);
  assert_true(largest > 0.01);
  assert_true(worst <= 1e-4 * largest);
  free(kept);
  free(again);
}

// A forward-only network (momentum encoder: batch statistics, nothing kept) passes its outputs
// through three buffers, its BatchNorms and residual sums in place; on the same parameters and
// images it computes the training network's features.
static void test_resnet_forward_only_matches_training(void **state) {
  (void)state;
  const ModelSpec m = spec_of(2);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  ParamSet ps, bound;
  paramset_alloc(&ps, backbone_param_count(&m, S, C), 3);
  Builder bt = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN};
  Backbone *train = backbone_create(&m, &bt, N, S, C);
  paramset_bind(&bound, ps.data, NULL, ps.count);
  Builder bf = {.ctx = &ctx, .params = &bound, .mode = OP_FORWARD};
  Backbone *fwd = backbone_create(&m, &bf, N, S, C);
  assert_non_null(train);
  assert_non_null(fwd);
  float images[N * S * S * C], feature[N * 8];
  assert_int_equal(train->feature_dim, 8);
  for (size_t i = 0; i < sizeof images / sizeof *images; i++)
    images[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
  train->forward(train, &ctx, images);
  memcpy(feature, train->feature, sizeof feature);
  fwd->forward(fwd, &ctx, images);
  double worst = 0, largest = 0;
  for (int i = 0; i < N * 8; i++) {
    worst = fmax(worst, fabs(fwd->feature[i] - feature[i]));
    largest = fmax(largest, fabs(feature[i]));
  }
  print_message("features up to %.3g, forward-only differs by %.3g\n", largest, worst);
  assert_true(largest > 0.01);
  assert_true(worst <= 1e-5 * largest);
  fwd->destroy(fwd);
  train->destroy(train);
  paramset_free(&bound);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resnet_input_gradients_peak_at_three),
      cmocka_unit_test(test_resnet_block_keeps_four_tensors),
      cmocka_unit_test(test_resnet_convolution_scratchpads_are_pooled),
      cmocka_unit_test(test_resnet_forward_only_matches_training),
      cmocka_unit_test(test_resnet_recompute_keeps_gradients),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
