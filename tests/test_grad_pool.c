// Input gradients live only as long as backward needs them: a training ResNet's share three
// buffers, each the size of the largest activation, however deep the network — stated by hand for
// a small network and checked against what the allocator holds. (That nothing still needed is
// overwritten is what the backbone gradient tests check against finite differences.)
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "nn/backbone.h"

// N images of S x S x C framed to P = S + 4; stem 4 channels at P x P, stage 1: 4 blocks of
// 4 channels at stride 1, stage 2: 1 block of 8 channels at stride 2 (P / 2 square).
enum { N = 4, S = 8, C = 3, P = S + 4 };

static size_t act_grad_bytes_of(int blocks_in_stage1) {
  ModelSpec m;
  memset(&m, 0, sizeof m);
  snprintf(m.type, sizeof m.type, "resnet");
  m.pad_to = P;
  m.stem_channels = 4;
  m.stage_channels[0] = 4;
  m.stage_channels[1] = 8;
  m.stage_blocks[0] = blocks_in_stage1;
  m.stage_blocks[1] = 1;
  m.stage_strides[0] = 1;
  m.stage_strides[1] = 2;
  DnnlCtx ctx;
  dnnl_ctx_init(&ctx);
  ParamSet ps;
  paramset_alloc(&ps, backbone_param_count(&m, S, C), 3);
  size_t before = tl_mem_live(MEM_ACT_GRAD);
  Builder b = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN};
  Backbone *bb = backbone_create(&m, &b, N, S, C);
  assert_non_null(bb);
  size_t held = tl_mem_live(MEM_ACT_GRAD) - before;
  bb->destroy(bb);
  assert_int_equal(tl_mem_live(MEM_ACT_GRAD), before);
  paramset_free(&ps);
  dnnl_ctx_destroy(&ctx);
  return held;
}

static void test_resnet_input_gradients_share_three_buffers(void **state) {
  (void)state;
  // The largest activation: the stem's and stage 1's output, N * P * P * 4 floats (stage 2's
  // projection gradient is the same size: its input). Stage 2's output is a quarter of that.
  const size_t largest = (size_t)N * P * P * 4 * sizeof(float);
  assert_int_equal(act_grad_bytes_of(1), 3 * largest);
  assert_int_equal(act_grad_bytes_of(4), 3 * largest);  // depth does not add any
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resnet_input_gradients_share_three_buffers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
