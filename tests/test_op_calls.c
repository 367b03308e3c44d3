// A module run on two inputs before backward (ops built for two calls, or a second instance over
// the same weights at another batch and image size) gives, per input, the output and input
// gradient it gives alone, and parameter gradients that are the sum of the two separate runs' —
// on a transformer block, a ResNet (with BatchNorm groups and a pad_to frame) and a ViT with a
// cls token. The set hears each gradient slice once, after the last contribution; the kept
// buffers double and nothing else does; a step whose backward was skipped leaves nothing behind
// for the next.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model_test_util.h"
#include "nn/backbone.h"
#include "nn/transformer.h"
#include "op_test_util.h"
#include "ops/linear.h"

enum { N = 4, S = 8, C = 3, MAX_SLICES = 256 };

// How often the set was told each slice is ready, by offset.
typedef struct {
  int n, calls[MAX_SLICES];
  size_t offset[MAX_SLICES];
} ReadyLog;

static void on_ready(void *user, size_t offset, size_t count) {
  (void)count;
  ReadyLog *log = user;
  for (int i = 0; i < log->n; i++)
    if (log->offset[i] == offset) {
      log->calls[i]++;
      return;
    }
  assert_true(log->n < MAX_SLICES);
  log->offset[log->n] = offset;
  log->calls[log->n++] = 1;
}

// A module behind two function pointers, so one test body serves blocks and backbones.
typedef struct {
  ExecCtx ctx;
  BuildPolicy policy;
  ParamSet ps;
  void *module;
  size_t in_floats, out_floats;
  const float *(*forward)(void *m, ExecCtx *ctx, const float *in);
  const float *(*backward)(void *m, ExecCtx *ctx, const float *dout);  // the input gradient or NULL
  void (*destroy)(void *m);
} Module;

static const float *bb_forward(void *m, ExecCtx *ctx, const float *in) {
  Backbone *bb = m;
  bb->forward(bb, ctx, in);
  return bb->feature;
}
static const float *bb_backward(void *m, ExecCtx *ctx, const float *dout) {
  Backbone *bb = m;
  bb->backward(bb, ctx, dout);
  return NULL;
}
static void bb_destroy(void *m) { ((Backbone *)m)->destroy(m); }

static const float *blk_forward(void *m, ExecCtx *ctx, const float *in) {
  return transformer_block_forward(m, ctx, in);
}
static const float *blk_backward(void *m, ExecCtx *ctx, const float *dout) {
  return transformer_block_backward(m, ctx, dout);
}
static void blk_destroy(void *m) {
  transformer_block_destroy(m);
  free(m);
}

enum { BLK_T = 5, BLK_D = 8 };

// The tiny networks, the ViT two blocks deep (a block's output feeds another's input).
static void spec_for(ModelSpec *m, const char *type) {
  *m = tiny_model_spec(type);
  if (strcmp(type, "vit") == 0)
    m->depth = 2;
  else
    m->pad_to = S + 4;  // the frame is a kept input of its own
}

// `type`: "block", "resnet" or "vit". Parameters from seed 3, so every build of a type starts
// from the same weights. `bf16`: convolutions and linear layers keep a bf16 copy of each call's
// input.
static void module_open(Module *m, const char *type, int calls, int bf16) {
  memset(m, 0, sizeof *m);
  exec_ctx_init(&m->ctx);
  m->policy = build_policy_default();
  m->policy.bf16 = bf16;
  m->policy.bn_splits = 2;  // BatchNorm statistics over two groups of each call's batch
  if (strcmp(type, "block") == 0) {
    // norm1, qkv, proj, norm2, fc1 (D -> 2D), fc2, by hand.
    size_t count = 2 * layernorm_floats(BLK_D) + linear_floats(BLK_D, 3 * BLK_D, 1) +
                   linear_floats(BLK_D, BLK_D, 1) + linear_floats(BLK_D, 2 * BLK_D, 1) +
                   linear_floats(2 * BLK_D, BLK_D, 1);
    paramset_alloc(&m->ps, count, 3);
    Builder b = {
        .ctx = &m->ctx, .params = &m->ps, .mode = OP_TRAIN, .calls = calls, .policy = &m->policy};
    TransformerBlock *blk = calloc(1, sizeof *blk);
    transformer_block_init(blk, &b, "blk", N, BLK_T, BLK_D, 2, 2, 1);
    m->module = blk;
    m->in_floats = m->out_floats = (size_t)N * BLK_T * BLK_D;
    m->forward = blk_forward, m->backward = blk_backward, m->destroy = blk_destroy;
  } else {
    ModelSpec spec;
    spec_for(&spec, type);
    paramset_alloc(&m->ps, backbone_param_count(&spec, S, C), 3);
    Builder b = {
        .ctx = &m->ctx, .params = &m->ps, .mode = OP_TRAIN, .calls = calls, .policy = &m->policy};
    Backbone *bb = backbone_create(&spec, &b, N, S, C);
    assert_non_null(bb);
    m->module = bb;
    m->in_floats = (size_t)N * S * S * C;
    m->out_floats = (size_t)N * bb->feature_dim;
    m->forward = bb_forward, m->backward = bb_backward, m->destroy = bb_destroy;
  }
  assert_int_equal(m->ps.used, m->ps.count);
}

static void module_close(Module *m) {
  m->destroy(m->module);
  paramset_free(&m->ps);
  exec_ctx_destroy(&m->ctx);
}

static float *copy_of(const float *x, size_t n) {
  if (!x) return NULL;
  float *c = malloc(n * sizeof(float));
  memcpy(c, x, n * sizeof(float));
  return c;
}

static void assert_close(const float *a, const float *b, size_t n, double rtol, const char *what) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > rtol * (scale + 1e-6)) {
      print_error("%s[%zu]: %.8g vs %.8g (scale %.3g)\n", what, i, a[i], b[i], scale);
      fail();
    }
}

static void check_two_calls(const char *type, int bf16) {
  Module one, two;
  module_open(&one, type, 1, bf16);
  module_open(&two, type, 2, bf16);
  const size_t ni = one.in_floats, no = one.out_floats, np = one.ps.count;
  float *xa = malloc(ni * sizeof(float)), *xb = malloc(ni * sizeof(float));
  float *da = malloc(no * sizeof(float)), *db = malloc(no * sizeof(float));
  fill_uniform(xa, ni, -1, 1, 1);
  fill_uniform(xb, ni, -2, 1, 2);  // another distribution: another set of batch statistics
  fill_uniform(da, no, -1, 1, 3);
  fill_uniform(db, no, -1, 1, 4);

  // Alone: A, then B, each its own step.
  paramset_zero_grad(&one.ps, 0);
  float *out_a = copy_of(one.forward(one.module, &one.ctx, xa), no);
  float *din_a = copy_of(one.backward(one.module, &one.ctx, da), ni);
  float *grad_sum = copy_of(one.ps.grad, np);
  paramset_zero_grad(&one.ps, 0);
  float *out_b = copy_of(one.forward(one.module, &one.ctx, xb), no);
  float *din_b = copy_of(one.backward(one.module, &one.ctx, db), ni);
  for (size_t i = 0; i < np; i++) grad_sum[i] += one.ps.grad[i];

  // Together. A forward whose backward never came leaves nothing behind for the next step.
  paramset_zero_grad(&two.ps, 0);
  two.forward(two.module, &two.ctx, xb);
  ReadyLog log = {0};
  two.ps.grad_ready = on_ready;
  two.ps.grad_ready_user = &log;
  paramset_zero_grad(&two.ps, 0);
  float *out2_a = copy_of(two.forward(two.module, &two.ctx, xa), no);
  float *out2_b = copy_of(two.forward(two.module, &two.ctx, xb), no);
  float *din2_b = copy_of(two.backward(two.module, &two.ctx, db), ni);
  assert_int_equal(log.n, 0);  // B's gradients alone are not the step's
  float *din2_a = copy_of(two.backward(two.module, &two.ctx, da), ni);

  assert_close(out2_a, out_a, no, 1e-5, "output A");
  assert_close(out2_b, out_b, no, 1e-5, "output B");
  if (din_a) {
    assert_close(din2_a, din_a, ni, 1e-4, "input gradient A");
    assert_close(din2_b, din_b, ni, 1e-4, "input gradient B");
  }
  assert_close(two.ps.grad, grad_sum, np, 1e-4, "parameter gradients");
  // Every trainable slice, once: counted from the set's own entries.
  int trainable = 0;
  for (int e = 0; e < two.ps.n_entries; e++) trainable += !two.ps.entries[e].is_buffer;
  assert_int_equal(log.n, trainable);
  for (int i = 0; i < log.n; i++) assert_int_equal(log.calls[i], 1);

  float *bufs[] = {xa,    xb,    da,     db,     out_a,  din_a, grad_sum,
                   out_b, din_b, out2_a, out2_b, din2_b, din2_a};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  module_close(&one);
  module_close(&two);
}

static void test_block_two_calls(void **state) {
  (void)state;
  check_two_calls("block", 0);
}

static void test_resnet_two_calls(void **state) {
  (void)state;
  check_two_calls("resnet", 0);
}

static void test_resnet_two_calls_bf16(void **state) {
  (void)state;
  check_two_calls("resnet", 1);
}

static void test_vit_two_calls(void **state) {
  (void)state;
  check_two_calls("vit", 0);
}

static void test_vit_two_calls_bf16(void **state) {
  (void)state;
  check_two_calls("vit", 1);
}

// A second instance of a backbone over the same weights, at another batch and image size (a view
// of the first's set: multi-crop's small crops), run between the first's forward and backward:
// each instance's output is its own, the parameter gradients are the sum of the two separate
// runs', and the set hears each slice once, only after both backwards.
enum { N_SMALL = 3, S_SMALL = 12 };

static Backbone *backbone_at(const ModelSpec *spec, ExecCtx *ctx, const BuildPolicy *policy,
                             ParamSet *ps, int n, int s) {
  Builder b = {.ctx = ctx, .params = ps, .mode = OP_TRAIN, .policy = policy};
  Backbone *bb = backbone_create(spec, &b, n, s, C);
  assert_non_null(bb);
  return bb;
}

static void check_shared(const char *type, int bf16) {
  ModelSpec spec;
  spec_for(&spec, type);
  spec.pad_to = 0;  // each instance at its own size
  const size_t np = backbone_param_count(&spec, S, C);
  assert_int_equal(backbone_param_count(&spec, S_SMALL, C), np);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  BuildPolicy policy = build_policy_default();
  policy.bf16 = bf16;
  const size_t na = (size_t)N * S * S * C, nb = (size_t)N_SMALL * S_SMALL * S_SMALL * C;
  float *xa = malloc(na * sizeof(float)), *xb = malloc(nb * sizeof(float));
  fill_uniform(xa, na, -1, 1, 1);
  fill_uniform(xb, nb, -2, 1, 2);

  // Alone: each size on a set of its own (the same weights: seed 3), one step each.
  ParamSet alone_a, alone_b;
  paramset_alloc(&alone_a, np, 3);
  paramset_alloc(&alone_b, np, 3);
  Backbone *a = backbone_at(&spec, &ctx, &policy, &alone_a, N, S);
  Backbone *b = backbone_at(&spec, &ctx, &policy, &alone_b, N_SMALL, S_SMALL);
  const size_t da_n = (size_t)N * a->feature_dim, db_n = (size_t)N_SMALL * b->feature_dim;
  float *da = malloc(da_n * sizeof(float)), *db = malloc(db_n * sizeof(float));
  fill_uniform(da, da_n, -1, 1, 3);
  fill_uniform(db, db_n, -1, 1, 4);
  paramset_zero_grad(&alone_a, 0);
  paramset_zero_grad(&alone_b, 0);
  a->forward(a, &ctx, xa);
  float *out_a = copy_of(a->feature, da_n);
  a->backward(a, &ctx, da);
  b->forward(b, &ctx, xb);
  float *out_b = copy_of(b->feature, db_n);
  b->backward(b, &ctx, db);
  float *grad_sum = copy_of(alone_a.grad, np);
  for (size_t i = 0; i < np; i++) grad_sum[i] += alone_b.grad[i];

  // Together: the small instance on a view of the large one's set.
  ParamSet shared, view;
  paramset_alloc(&shared, np, 3);
  Backbone *large = backbone_at(&spec, &ctx, &policy, &shared, N, S);
  paramset_view(&view, &shared, 0);
  Backbone *small = backbone_at(&spec, &ctx, &policy, &view, N_SMALL, S_SMALL);
  assert_int_equal(view.used, np);
  ReadyLog log = {0};
  shared.grad_ready = on_ready;
  shared.grad_ready_user = &log;
  paramset_zero_grad(&shared, 0);
  large->forward(large, &ctx, xa);
  small->forward(small, &ctx, xb);
  assert_close(large->feature, out_a, da_n, 1e-5, "large instance's output");
  assert_close(small->feature, out_b, db_n, 1e-5, "small instance's output");
  small->backward(small, &ctx, db);
  assert_int_equal(log.n, 0);  // the small crops' gradients alone are not the step's
  large->backward(large, &ctx, da);
  assert_close(shared.grad, grad_sum, np, 1e-4, "parameter gradients");
  int trainable = 0;
  for (int e = 0; e < shared.n_entries; e++) trainable += !shared.entries[e].is_buffer;
  assert_int_equal(log.n, trainable);
  for (int i = 0; i < log.n; i++) assert_int_equal(log.calls[i], 1);

  Backbone *all[] = {a, b, large, small};
  for (int i = 0; i < 4; i++) all[i]->destroy(all[i]);
  paramset_free(&view);
  paramset_free(&shared);
  paramset_free(&alone_a);
  paramset_free(&alone_b);
  float *bufs[] = {xa, xb, da, db, out_a, out_b, grad_sum};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  exec_ctx_destroy(&ctx);
}

static void test_resnet_shared(void **state) {
  (void)state;
  check_shared("resnet", 0);
}

static void test_resnet_shared_bf16(void **state) {
  (void)state;
  check_shared("resnet", 1);
}

static void test_vit_shared(void **state) {
  (void)state;
  check_shared("vit", 0);
}

static void test_vit_shared_bf16(void **state) {
  (void)state;
  check_shared("vit", 1);
}

// A linear layer (M rows, IC -> OC, fp32) built for three calls keeps three outputs and nothing
// else more: its activations are 3 * M * OC floats, its input gradient one M * IC, and the set
// holds scratch for one call's weight and bias gradients.
// A view of a counting set freed before its owner leaves the owner's reserved window mapped:
// the owner unmaps it once, when it is freed itself. (Unmapped by the view too, the window was
// unmapped twice, the second time taking whatever another replica's thread had mapped there.)
static void test_counting_view_freed_first(void **state) {
  (void)state;
  ParamSet owner, view;
  paramset_alloc_counting(&owner, 1);
  paramset_view(&view, &owner, 0);
  float *data = owner.data, *grad = owner.grad;
  paramset_free(&view);
  unsigned char resident;
  // mincore fails with ENOMEM on an address that is not mapped.
  assert_int_equal(mincore(data, 4096, &resident), 0);
  assert_int_equal(mincore(grad, 4096, &resident), 0);
  paramset_free(&owner);
  assert_int_equal(mincore(data, 4096, &resident), -1);
}

static void test_linear_buffers_per_call(void **state) {
  (void)state;
  enum { M = 6, IC = 5, OC = 7 };
  size_t act0 = tl_mem_live(MEM_ACT), grad0 = tl_mem_live(MEM_ACT_GRAD);
  Env e;
  env_init(&e, linear_floats(IC, OC, 1), OP_TRAIN);
  e.b.calls = 3;
  size_t work0 = tl_mem_live(MEM_WORKSPACE);
  Linear l;
  linear_init(&l, &e.b, "fc", M, IC, OC, 1, 1, 0.0f);
  assert_int_equal(tl_mem_live(MEM_ACT) - act0, 3 * M * OC * sizeof(float));
  assert_int_equal(tl_mem_live(MEM_ACT_GRAD) - grad0, M * IC * sizeof(float));
  assert_int_equal(e.ps.grad_scratch_count, OC * IC + OC);
  assert_true(tl_mem_live(MEM_WORKSPACE) - work0 >= (OC * IC + OC) * sizeof(float));
  linear_destroy(&l);
  env_destroy(&e);
  assert_int_equal(tl_mem_live(MEM_ACT), act0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_two_calls),
      cmocka_unit_test(test_resnet_two_calls),
      cmocka_unit_test(test_vit_two_calls),
      cmocka_unit_test(test_resnet_two_calls_bf16),
      cmocka_unit_test(test_vit_two_calls_bf16),
      cmocka_unit_test(test_linear_buffers_per_call),
      cmocka_unit_test(test_resnet_shared),
      cmocka_unit_test(test_resnet_shared_bf16),
      cmocka_unit_test(test_vit_shared),
      cmocka_unit_test(test_vit_shared_bf16),
      cmocka_unit_test(test_counting_view_freed_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
