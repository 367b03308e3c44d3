// Transformer block and ViT backbone: forward against a composition written here from the
// separately tested ops (tests/test_ops_vit.c) and naive loops (padding, patch order, sin-cos
// positions, cls token, pooling), backward against central finite differences of
// L = sum(out * R) (dL/dout = R) w.r.t. inputs and parameters of every kind, and the
// visible-only (MAE) encoder: token count, equality with the full encoder, permutation
// equivariance and its FLOP count for 1 + n_keep tokens.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "nn/backbone.h"
#include "nn/transformer.h"
#include "ops/eltwise.h"
#include "nn/vit.h"

#define FWD_ATOL 1e-5
#define GRAD_RTOL 1e-2
#define GRAD_ATOL_SCALE 1e-2
#define EPS 1e-2f

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > worst) worst = d;
  }
  return worst;
}

static void check_grad(gradcheck_loss_fn loss, void *c, float *x, const float *g, size_t n,
                       const char *label) {
  assert_true(gradcheck(loss, c, x, g, n, 24, EPS, GRAD_ATOL_SCALE, label) < GRAD_RTOL);
}

// Moves every parameter away from its special initial value (gamma 1, zero biases), so each
// gradient is generic.
static void perturb_params(ParamSet *ps) {
  Rng r = rng_stream(42, RNG_TEST, 777, 0);
  for (size_t i = 0; i < ps->count; i++) ps->data[i] += rng_uniform_range(&r, -0.2f, 0.2f);
}

// ---- transformer block ----

enum { BN = 2, BT = 5, BD = 8, BH = 2, BR = 2 };

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  TransformerBlock blk;
  float *in, *r;
} BlockCase;

static double block_loss(void *p) {
  BlockCase *c = p;
  transformer_block_forward(&c->blk, &c->ctx, c->in);
  return dot_out(c->blk.out, c->r, BN * BT * BD);
}

// x1 = x + proj(attn(qkv(LN1(x)))), out = x1 + fc2(GELU(fc1(LN2(x1)))), composed here from
// standalone ops bound to the block's parameters (same slices, same order).
static void block_reference(ExecCtx *ctx, ParamSet *ps, const float *x, float *out) {
  ParamSet bound;
  paramset_bind(&bound, ps->data, NULL, ps->count);
  Builder b = {.ctx = ctx, .params = &bound, .mode = OP_INFER};
  int M = BN * BT;
  LayerNorm ln1, ln2;
  Linear qkv, proj, fc1, fc2;
  Attention attn;
  Eltwise gelu;
  layernorm_init(&ln1, &b, "ln1", M, BD);
  linear_init(&qkv, &b, "qkv", M, BD, 3 * BD, 1, 0, 0);
  attention_init(&attn, &b, BN, BT, BD, BH);
  linear_init(&proj, &b, "proj", M, BD, BD, 1, 0, 0);
  layernorm_init(&ln2, &b, "ln2", M, BD);
  linear_init(&fc1, &b, "fc1", M, BD, BR * BD, 1, 0, 0);
  eltwise_init(&gelu, &b, ELTWISE_GELU, (size_t)M * BR * BD, 0);
  linear_init(&fc2, &b, "fc2", M, BR * BD, BD, 1, 0, 0);
  assert_int_equal(bound.used, ps->count);

  float x1[BN * BT * BD];
  layernorm_forward(&ln1, ctx, x);
  linear_forward(&qkv, ctx, ln1.out);
  attention_forward(&attn, ctx, qkv.out);
  linear_forward(&proj, ctx, attn.out);
  for (int i = 0; i < M * BD; i++) x1[i] = x[i] + proj.out[i];
  layernorm_forward(&ln2, ctx, x1);
  linear_forward(&fc1, ctx, ln2.out);
  eltwise_forward(&gelu, ctx, fc1.out);
  linear_forward(&fc2, ctx, gelu.out);
  for (int i = 0; i < M * BD; i++) out[i] = x1[i] + fc2.out[i];

  layernorm_destroy(&ln1);
  linear_destroy(&qkv);
  attention_destroy(&attn);
  linear_destroy(&proj);
  layernorm_destroy(&ln2);
  linear_destroy(&fc1);
  eltwise_destroy(&gelu);
  linear_destroy(&fc2);
  paramset_free(&bound);
}

static void test_transformer_block(void **state) {
  (void)state;
  BlockCase c;
  exec_ctx_init(&c.ctx);
  // Two LayerNorms, qkv, the output projection and the MLP's two Linears, with biases.
  size_t count = 2 * 2 * BD + (BD * 3 * BD + 3 * BD) + (BD * BD + BD) + (BD * BR * BD + BR * BD) +
                 (BR * BD * BD + BD);
  paramset_alloc(&c.ps, count, 11);
  Builder b = {.ctx = &c.ctx, .params = &c.ps, .mode = OP_TRAIN};
  transformer_block_init(&c.blk, &b, "blocks.0", BN, BT, BD, BH, BR, 1);
  assert_int_equal(c.ps.used, count);
  // Xavier-uniform weights (qkv as one (3D, D) matrix, as MAE does), zero biases, unit gamma.
  float qkv_bound = sqrtf(6.0f / (BD + 3 * BD));
  for (int i = 0; i < 3 * BD * BD; i++) assert_true(fabsf(c.blk.qkv->weight[i]) <= qkv_bound);
  for (int i = 0; i < BD; i++) assert_true(c.blk.fc2->bias[i] == 0 && c.blk.norm1->gamma[i] == 1);
  perturb_params(&c.ps);

  size_t n = BN * BT * BD;
  c.in = new_tensor(n);
  c.r = new_tensor(n);
  fill_uniform(c.in, n, -1, 1, 1);
  fill_uniform(c.r, n, -1, 1, 2);
  transformer_block_forward(&c.blk, &c.ctx, c.in);
  float want[BN * BT * BD];
  block_reference(&c.ctx, &c.ps, c.in, want);
  assert_true(max_abs_diff(c.blk.out, want, n) < FWD_ATOL);

  transformer_block_backward(&c.blk, &c.ctx, c.r);
  check_grad(block_loss, &c, c.in, c.blk.din, n, "block din");
  check_grad(block_loss, &c, c.blk.norm1->gamma, c.blk.norm1->dgamma, BD, "block norm1.gamma");
  check_grad(block_loss, &c, c.blk.qkv->weight, c.blk.qkv->dweight, 3 * BD * BD, "block qkv.w");
  check_grad(block_loss, &c, c.blk.qkv->bias, c.blk.qkv->dbias, 3 * BD, "block qkv.b");
  check_grad(block_loss, &c, c.blk.proj->weight, c.blk.proj->dweight, BD * BD, "block proj.w");
  check_grad(block_loss, &c, c.blk.norm2->beta, c.blk.norm2->dbeta, BD, "block norm2.beta");
  check_grad(block_loss, &c, c.blk.fc1->weight, c.blk.fc1->dweight, BR * BD * BD, "block fc1.w");
  check_grad(block_loss, &c, c.blk.fc2->bias, c.blk.fc2->dbias, BD, "block fc2.b");

  transformer_block_destroy(&c.blk);
  tl_free(c.in);
  tl_free(c.r);
  paramset_free(&c.ps);
  exec_ctx_destroy(&c.ctx);
}

// ---- ViT ----

// 6x6 images with 2 channels, padded to 8 and cut into 4x4 patches: a 2x2 grid.
enum { VN = 2, VS = 6, VC = 2, VP = 4, VPAD = 8, VG = 2, VD = 8, VH = 2, VR = 2 };
enum { N_PATCHES = VG * VG, PATCH_DIM = VP * VP * VC };

static ModelSpec tiny_spec(const char *pool) {
  ModelSpec s;
  memset(&s, 0, sizeof s);
  strcpy(s.type, "vit");
  s.patch_size = VP;
  s.pad_to = VPAD;
  s.dim = VD;
  s.depth = 1;
  s.heads = VH;
  s.mlp_ratio = VR;
  strcpy(s.pool, pool);
  return s;
}

// The counting pass against hand arithmetic: patch embedding (weights and bias), the cls token
// when pooling by it, each block's two LayerNorms, qkv, projection and MLP, the final LayerNorm.
static void test_vit_parameter_count(void **state) {
  (void)state;
  const size_t D = VD, H = (size_t)VR * VD, patch = (size_t)VP * VP * VC;
  const size_t block = 2 * 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + (D * H + H) + (H * D + D);
  for (int with_cls = 0; with_cls < 2; with_cls++) {
    ModelSpec s = tiny_spec(with_cls ? "cls" : "mean");
    s.depth = 3;
    size_t expected = patch * D + D + (with_cls ? D : 0) + 3 * block + 2 * D;
    assert_int_equal(backbone_param_count(&s, VS, VC), expected);
  }
}

typedef struct {
  ExecCtx ctx;
  BuildPolicy policy;
  ParamSet ps;
  ModelSpec spec;
  Vit *vit;
  float *images, *r;
} VitCase;

// recompute: [train] recompute, what the blocks keep for backward (BuildPolicy.recompute).
static void vit_case_open(VitCase *c, const char *pool, OpMode mode, int recompute) {
  exec_ctx_init(&c->ctx);
  c->policy = build_policy_default();
  c->policy.recompute = recompute;
  c->spec = tiny_spec(pool);
  paramset_alloc(&c->ps, backbone_param_count(&c->spec, VS, VC), 5);
  Builder b = {.ctx = &c->ctx, .params = &c->ps, .mode = mode, .policy = &c->policy};
  c->vit = (Vit *)vit_create(&c->spec, &b, VN, VS, VC);
  assert_non_null(c->vit);
  assert_int_equal(c->ps.used, c->ps.count);
  perturb_params(&c->ps);
  c->images = new_tensor(VN * VS * VS * VC);
  c->r = new_tensor(VN * (1 + N_PATCHES) * VD);
  fill_uniform(c->images, VN * VS * VS * VC, -1, 1, 3);
  fill_uniform(c->r, VN * (1 + N_PATCHES) * VD, -1, 1, 4);
}

static void vit_case_init(VitCase *c, const char *pool, OpMode mode) {
  vit_case_open(c, pool, mode, 1);
}

static void vit_case_destroy(VitCase *c) {
  c->vit->base.destroy(&c->vit->base);
  tl_free(c->images);
  tl_free(c->r);
  paramset_free(&c->ps);
  exec_ctx_destroy(&c->ctx);
}

// MAE's get_2d_sincos_pos_embed, structured as MAE writes it: the first half of the row is the
// 1-D embedding (dim/2 wide) of grid[0], which np.meshgrid(grid_w, grid_h) makes the column
// index, the second half that of the row index; a 1-D embedding of width E at position p is
// [sin(p w_j), cos(p w_j)], w_j = 1 / 10000^(j / (E/2)), j < E/2.
static double mae_sincos(int grid, int dim, int patch, int j) {
  int gy = patch / grid, gx = patch % grid, half = dim / 2;
  double pos = j < half ? gx : gy;
  int jj = j % half, quarter = half / 2;
  double omega = 1.0 / pow(10000.0, (double)(jj % quarter) / quarter);
  return jj < quarter ? sin(pos * omega) : cos(pos * omega);
}

static void test_sincos_table(void **state) {
  (void)state;
  enum { G = 3, D = 16 };
  float table[G * G * D];
  vit_sincos_pos_embed(table, G, D);
  for (int patch = 0; patch < G * G; patch++)
    for (int j = 0; j < D; j++)
      assert_true(fabs(table[patch * D + j] - mae_sincos(G, D, patch, j)) < 1e-6);
  // By hand, D = 16 (quarter 4, w = 1, 0.1, 0.01, 0.001): patch 5 is row 1, column 2.
  assert_true(fabsf(table[5 * D + 0] - sinf(2.0f)) < 1e-6f);
  assert_true(fabsf(table[5 * D + 5] - cosf(0.2f)) < 1e-6f);
  assert_true(fabsf(table[5 * D + 8] - sinf(1.0f)) < 1e-6f);
  assert_true(fabsf(table[5 * D + 15] - cosf(0.001f)) < 1e-6f);
}

// Explicitly zero-padded (centered: 1 row/column before, 1 after) then cut MAE-style:
// (N, G, P, G, P, C) -> (N, G, G, P, P, C).
static void reference_patches(const float *images, float *patches) {
  enum { BEFORE = (VPAD - VS) / 2 };
  static float padded[VN][VPAD][VPAD][VC];
  memset(padded, 0, sizeof padded);
  for (int n = 0; n < VN; n++)
    for (int y = 0; y < VS; y++)
      for (int x = 0; x < VS; x++)
        for (int ch = 0; ch < VC; ch++)
          padded[n][y + BEFORE][x + BEFORE][ch] = images[((n * VS + y) * VS + x) * VC + ch];
  for (int n = 0; n < VN; n++)
    for (int gy = 0; gy < VG; gy++)
      for (int gx = 0; gx < VG; gx++)
        for (int py = 0; py < VP; py++)
          for (int px = 0; px < VP; px++)
            for (int ch = 0; ch < VC; ch++)
              patches[(((n * VG + gy) * VG + gx) * VP * VP + py * VP + px) * VC + ch] =
                  padded[n][gy * VP + py][gx * VP + px][ch];
}

static void test_vit_patchify(void **state) {
  (void)state;
  VitCase c;
  vit_case_init(&c, "cls", OP_INFER);
  assert_int_equal(c.vit->pad_before, 1);
  float got[VN * N_PATCHES * PATCH_DIM], want[VN * N_PATCHES * PATCH_DIM];
  vit_patchify(c.vit, c.images, got);
  reference_patches(c.images, want);
  assert_memory_equal(got, want, sizeof got);
  // Pixel (0, 0) of image 0 lands in patch 0 at (py, px) = (1, 1).
  assert_true(got[(1 * VP + 1) * VC] == c.images[0]);
  vit_case_destroy(&c);
}

// tokens = LN(block([cls; patches W^T + b + pos])) composed here from standalone ops bound to the
// ViT's parameter block in its documented order.
static void vit_reference_tokens(VitCase *c, int has_cls, float *tokens) {
  enum { T_MAX = 1 + N_PATCHES };
  int T = has_cls + N_PATCHES;
  ParamSet bound;
  paramset_bind(&bound, c->ps.data, NULL, c->ps.count);
  Builder b = {.ctx = &c->ctx, .params = &bound, .mode = OP_INFER, .policy = &c->policy};
  Linear embed;
  linear_init(&embed, &b, "embed", VN * N_PATCHES, PATCH_DIM, VD, 1, 0, 0);
  const float *cls = has_cls ? paramset_take(&bound, "cls", VD, 1, NULL) : NULL;
  TransformerBlock blk;
  transformer_block_init(&blk, &b, "blk", VN, T, VD, VH, VR, 0);
  LayerNorm norm;
  layernorm_init(&norm, &b, "norm", VN * T, VD);
  assert_int_equal(bound.used, c->ps.count);

  static float patches[VN * N_PATCHES * PATCH_DIM];
  reference_patches(c->images, patches);
  linear_forward(&embed, &c->ctx, patches);
  float x[VN * T_MAX * VD];
  for (int n = 0; n < VN; n++) {
    if (has_cls) memcpy(x + n * T * VD, cls, sizeof(float) * VD);
    for (int p = 0; p < N_PATCHES; p++)
      for (int j = 0; j < VD; j++)
        x[(n * T + has_cls + p) * VD + j] =
            embed.out[(n * N_PATCHES + p) * VD + j] + (float)mae_sincos(VG, VD, p, j);
  }
  transformer_block_forward(&blk, &c->ctx, x);
  layernorm_forward(&norm, &c->ctx, blk.out);
  memcpy(tokens, norm.out, sizeof(float) * VN * T * VD);
  linear_destroy(&embed);
  transformer_block_destroy(&blk);
  layernorm_destroy(&norm);
  paramset_free(&bound);
}

static double vit_feature_loss(void *p) {
  VitCase *c = p;
  c->vit->base.forward(&c->vit->base, &c->ctx, c->images);
  return dot_out(c->vit->feature, c->r, VN * VD);
}

static void check_vit(const char *pool) {
  VitCase c;
  vit_case_init(&c, pool, OP_TRAIN);
  Vit *v = c.vit;
  int has_cls = strcmp(pool, "cls") == 0, T = has_cls + N_PATCHES;
  assert_int_equal(v->T, T);
  assert_int_equal(v->base.feature_dim, VD);
  assert_ptr_equal(v->base.feature, v->feature);

  v->base.forward(&v->base, &c.ctx, c.images);
  float want[VN * (1 + N_PATCHES) * VD];
  vit_reference_tokens(&c, has_cls, want);
  assert_true(max_abs_diff(v->tokens, want, (size_t)VN * T * VD) < FWD_ATOL);
  for (int n = 0; n < VN; n++)
    for (int j = 0; j < VD; j++) {
      double f = 0;
      if (has_cls)
        f = want[n * T * VD + j];
      else
        for (int t = 0; t < T; t++) f += want[(n * T + t) * VD + j] / T;
      assert_true(fabs(v->feature[n * VD + j] - f) < FWD_ATOL);
    }

  v->base.backward(&v->base, &c.ctx, c.r);
  TransformerBlock *blk = &v->blocks[0];
  check_grad(vit_feature_loss, &c, v->patch_embed.weight, v->patch_embed.dweight,
             (size_t)VD * PATCH_DIM, "vit patch_embed.w");
  check_grad(vit_feature_loss, &c, v->patch_embed.bias, v->patch_embed.dbias, VD,
             "vit patch_embed.b");
  if (has_cls) check_grad(vit_feature_loss, &c, v->cls, v->dcls, VD, "vit cls_token");
  check_grad(vit_feature_loss, &c, blk->norm1->gamma, blk->norm1->dgamma, VD, "vit norm1.gamma");
  check_grad(vit_feature_loss, &c, blk->qkv->weight, blk->qkv->dweight, 3 * VD * VD, "vit qkv.w");
  check_grad(vit_feature_loss, &c, blk->fc2->weight, blk->fc2->dweight, VR * VD * VD, "vit fc2.w");
  check_grad(vit_feature_loss, &c, v->norm->gamma, v->norm->dgamma, VD, "vit norm.gamma");
  check_grad(vit_feature_loss, &c, v->norm->beta, v->norm->dbeta, VD, "vit norm.beta");
  vit_case_destroy(&c);
}

static void test_vit_cls(void **state) {
  (void)state;
  check_vit("cls");
}

static void test_vit_mean(void **state) {
  (void)state;
  check_vit("mean");
}

// ---- visible-only encoder (MAE) ----

enum { N_KEEP = 3, TK = 1 + N_KEEP };

typedef struct {
  VitCase full;
  Vit *masked;  // bound to full's parameters
  int keep[VN * N_KEEP];
} MaskedCase;

static Vit *masked_on(VitCase *c, int n_keep, OpMode mode, ParamSet *bound) {
  paramset_bind(bound, c->ps.data, c->ps.grad, c->ps.count);
  Builder b = {.ctx = &c->ctx, .params = bound, .mode = mode, .policy = &c->policy};
  Vit *v = vit_create_masked(&c->spec, &b, VN, VS, VC, n_keep);
  assert_non_null(v);
  return v;
}

static double masked_loss(void *p) {
  MaskedCase *m = p;
  vit_forward_visible(m->masked, &m->full.ctx, m->full.images, m->keep);
  return dot_out(m->masked->tokens, m->full.r, VN * TK * VD);
}

static void test_masked_token_count_and_grads(void **state) {
  (void)state;
  MaskedCase m;
  vit_case_init(&m.full, "cls", OP_TRAIN);
  ParamSet bound;
  m.masked = masked_on(&m.full, N_KEEP, OP_TRAIN, &bound);
  Vit *v = m.masked;
  assert_int_equal(v->T, TK);
  assert_int_equal(v->blocks[0].attn->T, TK);
  assert_int_equal(v->patch_embed.M, VN * N_KEEP);
  assert_int_equal(v->norm->M, VN * TK);
  const int keep[VN * N_KEEP] = {3, 0, 2, 1, 2, 3};
  memcpy(m.keep, keep, sizeof keep);

  exec_ctx_reset_flops(&m.full.ctx);
  vit_forward_visible(v, &m.full.ctx, m.full.images, m.keep);
  vit_backward_tokens(v, &m.full.ctx, m.full.r);
  // Analytic count for T = 1 + n_keep tokens, M = N*T rows, hidden = mlp_ratio * D.
  double M = VN * TK, hid = VR * VD, scores = (double)VN * VH * TK * TK;
  double attn_mm = 2.0 * VN * TK * TK * VD;  // one (T x T x Dh) matmul over all heads
  double lin = 2 * M * VD * (3 * VD) + 2 * M * VD * VD + 2 * M * VD * hid + 2 * M * hid * VD;
  double embed = 2.0 * VN * N_KEEP * PATCH_DIM * VD;
  // Forward: patch embedding and position adds; block matmuls and softmax; two norms, GELU and
  // two residual adds; the final norm.
  double fwd = embed + VN * N_KEEP * VD + lin + 2 * attn_mm + SOFTMAX_FWD * scores +
               2 * LN_FWD * M * VD + GELU_FWD * M * hid + 2 * M * VD + LN_FWD * M * VD;
  // Backward: the final norm; weight and input gradients of every block matmul, the softmax
  // gradient; two norms, GELU and the two gradient sums; the cls token's sum over images and the
  // patch embedding's weight gradient (images need none). In fp32 the two norms' and GELU's
  // outputs are not kept but recomputed before the matmuls that read them (nn/transformer.c):
  // their forward counts again, in backward.
  double recompute = 2 * LN_FWD * M * VD + GELU_FWD * M * hid;
  double bwd = LN_BWD * M * VD + 2 * lin + 4 * attn_mm + SOFTMAX_BWD * scores +
               2 * LN_BWD * M * VD + GELU_BWD * M * hid + 2 * M * VD + VN * VD + embed + recompute;
  assert_true(fabs(m.full.ctx.flops_forward[COMP_ENCODER] - fwd) < 1e-9 * fwd);
  assert_true(fabs(m.full.ctx.flops_backward[COMP_ENCODER] - bwd) < 1e-9 * bwd);

  check_grad(masked_loss, &m, v->patch_embed.weight, v->patch_embed.dweight, (size_t)VD * PATCH_DIM,
             "masked patch_embed.w");
  check_grad(masked_loss, &m, v->cls, v->dcls, VD, "masked cls_token");
  check_grad(masked_loss, &m, v->blocks[0].proj->weight, v->blocks[0].proj->dweight, VD * VD,
             "masked proj.w");
  v->base.destroy(&v->base);
  paramset_free(&bound);
  vit_case_destroy(&m.full);
}

// keep_idx = every patch in order reproduces the full encoder; a permutation of the patches
// permutes the patch tokens (attention without masks is permutation-equivariant and each patch
// carries its own position) and leaves the cls token unchanged.
static void test_masked_matches_full(void **state) {
  (void)state;
  VitCase c;
  vit_case_init(&c, "cls", OP_INFER);
  enum { T = 1 + N_PATCHES };
  ParamSet bound;
  Vit *all = masked_on(&c, N_PATCHES, OP_INFER, &bound);
  c.vit->base.forward(&c.vit->base, &c.ctx, c.images);

  const int in_order[VN * N_PATCHES] = {0, 1, 2, 3, 0, 1, 2, 3};
  vit_forward_visible(all, &c.ctx, c.images, in_order);
  assert_true(max_abs_diff(all->tokens, c.vit->tokens, VN * T * VD) == 0);
  assert_true(max_abs_diff(all->feature, c.vit->feature, VN * VD) == 0);

  const int perm[VN * N_PATCHES] = {2, 0, 3, 1, 1, 3, 0, 2};
  vit_forward_visible(all, &c.ctx, c.images, perm);
  for (int n = 0; n < VN; n++) {
    const float *full = c.vit->tokens + n * T * VD, *got = all->tokens + n * T * VD;
    assert_true(max_abs_diff(got, full, VD) < FWD_ATOL);
    for (int k = 0; k < N_PATCHES; k++)
      assert_true(max_abs_diff(got + (1 + k) * VD, full + (1 + perm[n * N_PATCHES + k]) * VD, VD) <
                  FWD_ATOL);
  }
  all->base.destroy(&all->base);
  paramset_free(&bound);
  vit_case_destroy(&c);
}

static void test_vit_bad_specs(void **state) {
  (void)state;
  ModelSpec s = tiny_spec("cls");
  assert_int_equal(vit_check_spec(&s, VS, VC), 0);
  s.pad_to = 4;  // smaller than the image
  assert_int_equal(vit_check_spec(&s, VS, VC), -1);
  s.pad_to = 0;  // 6 is not a multiple of the patch size 4
  assert_int_equal(vit_check_spec(&s, VS, VC), -1);
  s = tiny_spec("cls");
  s.dim = 6;  // heads 2 divide it, but sin-cos needs a multiple of 4
  s.heads = 2;
  assert_int_equal(vit_check_spec(&s, VS, VC), -1);
  assert_non_null(strstr(tl_last_error(), "multiple of 4"));
  s = tiny_spec("max");
  assert_int_equal(vit_check_spec(&s, VS, VC), -1);

  ExecCtx ctx;
  exec_ctx_init(&ctx);
  ParamSet ps;
  s = tiny_spec("cls");
  paramset_alloc(&ps, backbone_param_count(&s, VS, VC), 1);
  Builder b = {.ctx = &ctx, .params = &ps, .mode = OP_INFER};
  assert_null(vit_create_masked(&s, &b, VN, VS, VC, N_PATCHES + 1));
  assert_int_equal(ps.used, 0);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
}

// [train] recompute = 0 keeps each block's two LayerNorm outputs (M x D each) and GELU's output
// (M x mlp_ratio D) for backward; = 1 writes them again before the matmuls that read them. The
// same gradients either way, and the kept activations differ by exactly those three tensors.
static void test_recompute_keeps_gradients(void **state) {
  (void)state;
  const double M = VN * (1 + N_PATCHES);
  size_t act_before = tl_mem_live_comp(MEM_ACT, COMP_ENCODER);
  VitCase keep, again;
  vit_case_open(&keep, "cls", OP_TRAIN, 0);
  size_t act_keep = tl_mem_live_comp(MEM_ACT, COMP_ENCODER) - act_before;
  act_before = tl_mem_live_comp(MEM_ACT, COMP_ENCODER);
  vit_case_open(&again, "cls", OP_TRAIN, 1);
  size_t act_again = tl_mem_live_comp(MEM_ACT, COMP_ENCODER) - act_before;
  assert_int_equal(act_keep - act_again, (size_t)(M * (2 * VD + VR * VD) * sizeof(float)));

  VitCase *cases[] = {&keep, &again};
  for (int i = 0; i < 2; i++) {
    VitCase *c = cases[i];
    paramset_zero_grad(&c->ps, 0);
    exec_ctx_reset_flops(&c->ctx);
    vit_forward_visible(c->vit, &c->ctx, c->images, NULL);
    vit_backward_tokens(c->vit, &c->ctx, c->r);
  }
  assert_int_equal(keep.ps.count, again.ps.count);
  assert_true(max_abs_diff(keep.ps.grad, again.ps.grad, keep.ps.count) == 0);
  // The recomputed forwards count as backward work: two norms and GELU over M rows.
  double extra = 2 * LN_FWD * M * VD + GELU_FWD * M * VR * VD;
  assert_true(fabs(again.ctx.flops_backward[COMP_ENCODER] - keep.ctx.flops_backward[COMP_ENCODER] -
                   extra) < 1e-9 * extra);
  vit_case_destroy(&keep);
  vit_case_destroy(&again);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transformer_block),
      cmocka_unit_test(test_recompute_keeps_gradients),
      cmocka_unit_test(test_vit_parameter_count),
      cmocka_unit_test(test_sincos_table),
      cmocka_unit_test(test_vit_patchify),
      cmocka_unit_test(test_vit_cls),
      cmocka_unit_test(test_vit_mean),
      cmocka_unit_test(test_masked_token_count_and_grads),
      cmocka_unit_test(test_masked_matches_full),
      cmocka_unit_test(test_vit_bad_specs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
