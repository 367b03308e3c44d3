#include "nn/vit.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backbone.h"

int vit_patch_count(const ModelSpec *spec, int image_size) {
  int grid = backbone_padded_size(spec, image_size) / spec->patch_size;
  return grid * grid;
}

int vit_check_spec(const ModelSpec *spec, int image_size, int channels) {
  if (image_size <= 0 || channels <= 0 || channels > BACKBONE_MAX_CHANNELS)
    return tl_fail("vit: bad image geometry %dx%d with %d channels", image_size, image_size,
                   channels);
  int padded = backbone_padded_size(spec, image_size);
  if (padded < image_size)
    return tl_fail("vit: pad_to = %d is smaller than the image size %d", spec->pad_to, image_size);
  if (spec->patch_size <= 0 || padded % spec->patch_size)
    return tl_fail("vit: patch_size = %d does not divide the padded image size %d",
                   spec->patch_size, padded);
  if (spec->dim <= 0 || spec->dim % 4)
    return tl_fail("vit: dim = %d must be a positive multiple of 4 (2-D sin-cos positions)",
                   spec->dim);
  if (spec->heads <= 0 || spec->dim % spec->heads)
    return tl_fail("vit: dim = %d is not divisible by heads = %d", spec->dim, spec->heads);
  if (spec->depth < 0 || spec->mlp_ratio < 1)
    return tl_fail("vit: bad depth = %d or mlp_ratio = %d", spec->depth, spec->mlp_ratio);
  if (strcmp(spec->pool, "cls") != 0 && strcmp(spec->pool, "mean") != 0)
    return tl_fail("vit: pool = %s (expected cls or mean)", spec->pool);
  return 0;
}

void vit_sincos_pos_embed(float *table, int grid, int dim) {
  TL_ASSERT(dim % 4 == 0);
  if (tl_alloc_untouched()) return;  // a plan: nothing reads the table
  int quarter = dim / 4;
  for (int gy = 0; gy < grid; gy++)
    for (int gx = 0; gx < grid; gx++) {
      float *row = table + ((size_t)gy * grid + gx) * dim;
      for (int k = 0; k < quarter; k++) {
        double omega = pow(10000.0, -(double)k / quarter);
        row[k] = (float)sin(gx * omega);
        row[quarter + k] = (float)cos(gx * omega);
        row[2 * quarter + k] = (float)sin(gy * omega);
        row[3 * quarter + k] = (float)cos(gy * omega);
      }
    }
}

// patches (N, n_keep, P*P*C): patch keep_idx[n][k] (k when keep_idx is NULL) of image n, read
// from the image framed with pad_value without materializing it.
static void patchify_gather(const Vit *v, const float *images, const int *keep_idx, int n_keep,
                            float *patches) {
  int S = v->image_size, C = v->channels, P = v->patch_size, G = v->grid;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < v->N; n++)
    for (int k = 0; k < n_keep; k++) {
      int patch = keep_idx ? keep_idx[(size_t)n * n_keep + k] : k;
      int gy = patch / G, gx = patch % G;
      float *dst = patches + ((size_t)n * n_keep + k) * v->patch_dim;
      for (int py = 0; py < P; py++) {
        int y = gy * P + py - v->pad_before;
        for (int px = 0; px < P; px++) {
          int x = gx * P + px - v->pad_before;
          float *d = dst + ((size_t)py * P + px) * C;
          if (y < 0 || y >= S || x < 0 || x >= S)
            memcpy(d, v->base.pad_value, sizeof(float) * (size_t)C);
          else
            memcpy(d, images + (((size_t)n * S + y) * S + x) * C, sizeof(float) * (size_t)C);
        }
      }
    }
}

void vit_patchify(const Vit *v, const float *images, float *patches) {
  patchify_gather(v, images, NULL, v->n_patches, patches);
}

// embedded (N, T, D) = [cls,] patch embeddings + the position of each kept patch.
static void add_positions(Vit *v, const int *keep_idx) {
  int D = v->D, T = v->T;
  for (int n = 0; n < v->N; n++) {
    float *tok = v->embedded + (size_t)n * T * D;
    if (v->has_cls) memcpy(tok, v->cls, sizeof(float) * (size_t)D);
    for (int k = 0; k < v->n_keep; k++) {
      int patch = keep_idx ? keep_idx[(size_t)n * v->n_keep + k] : k;
      const float *emb = v->patch_embed.out + ((size_t)n * v->n_keep + k) * D;
      const float *pos = v->pos_embed + (size_t)patch * D;
      float *dst = tok + (size_t)(v->has_cls + k) * D;
      for (int d = 0; d < D; d++) dst[d] = emb[d] + pos[d];
    }
  }
}

// feature (N, D): the cls token, or the mean of the tokens.
static void pool_feature(Vit *v) {
  int D = v->D, T = v->T;
  for (int n = 0; n < v->N; n++) {
    const float *tok = v->tokens + (size_t)n * T * D;
    float *f = v->feature + (size_t)n * D;
    if (v->has_cls) {
      memcpy(f, tok, sizeof(float) * (size_t)D);
      continue;
    }
    for (int d = 0; d < D; d++) f[d] = 0;
    for (int t = 0; t < T; t++)
      for (int d = 0; d < D; d++) f[d] += tok[(size_t)t * D + d];
    for (int d = 0; d < D; d++) f[d] /= (float)T;
  }
}

void vit_forward_visible(Vit *v, ExecCtx *ctx, const float *images, const int *keep_idx) {
  if (!keep_idx && v->n_keep != v->n_patches)
    TL_DIE("vit_forward_visible: keep_idx is required when encoding %d of %d patches", v->n_keep,
           v->n_patches);
  size_t n_idx = (size_t)v->N * v->n_keep;
  if (keep_idx && !ctx->dry_run)
    for (size_t i = 0; i < n_idx; i++)
      if (keep_idx[i] < 0 || keep_idx[i] >= v->n_patches)
        TL_DIE("vit_forward_visible: keep_idx[%zu] = %d outside [0, %d)", i, keep_idx[i],
               v->n_patches);
  int call = op_calls_forward(&v->calls, "vit");
  size_t D = (size_t)v->D, rows = (size_t)v->N * v->n_keep;
  v->patches = op_slot(v->patches_slots, rows * v->patch_dim * sizeof(float), call);
  v->embedded = op_slot(v->embedded_slots, (size_t)v->N * v->T * D * sizeof(float), call);
  v->base.feature = v->feature = op_slot(v->feature_slots, (size_t)v->N * D * sizeof(float), call);
  if (!ctx->dry_run) patchify_gather(v, images, keep_idx, v->n_keep, v->patches);
  linear_forward(&v->patch_embed, ctx, v->patches);
  if (!ctx->dry_run) add_positions(v, keep_idx);
  ctx->flops_forward[v->comp] += (double)n_idx * v->D;  // position embedding adds

  const float *x = v->entry.n ? oplist_forward(&v->entry, ctx, v->embedded) : v->embedded;
  for (int i = 0; i < v->depth; i++) x = transformer_block_forward(&v->blocks[i], ctx, x);
  v->tokens = (float *)oplist_forward(&v->head, ctx, x);

  if (!ctx->dry_run) pool_feature(v);
  if (!v->has_cls) ctx->flops_forward[v->comp] += (double)v->N * v->T * v->D;
}

void vit_backward_tokens(Vit *v, ExecCtx *ctx, const float *dtokens) {
  if (v->mode != OP_TRAIN) TL_DIE("vit_backward_tokens on a ViT built without backward");
  int D = v->D, T = v->T;
  op_calls_backward(&v->calls, "vit");
  const float *d = oplist_backward(&v->head, ctx, dtokens);
  for (int i = v->depth - 1; i >= 0; i--) d = transformer_block_backward(&v->blocks[i], ctx, d);
  if (v->entry.n) d = oplist_backward(&v->entry, ctx, d);
  // d: (N, T, D) gradient of the embedded tokens. The position table is fixed, so the patch
  // rows go straight to the patch embedding; the cls rows sum into the cls token.
  const float *dpatch = d;
  OpGrads g = {{NULL, NULL}, {NULL, NULL}, {0, 0}};
  if (v->has_cls) g = op_grads_begin(&v->calls, v->dcls, (size_t)D, NULL, 0);
  float *dcls = g.target[0];
  if (v->has_cls && !ctx->dry_run) {
    memset(dcls, 0, sizeof(float) * (size_t)D);
    for (int n = 0; n < v->N; n++) {
      const float *row = d + (size_t)n * T * D;
      for (int e = 0; e < D; e++) dcls[e] += row[e];
      memcpy(v->dpatch_tokens + (size_t)n * v->n_keep * D, row + D,
             sizeof(float) * (size_t)v->n_keep * D);
    }
  }
  if (v->has_cls) {
    op_grads_end(ctx, v->comp, &v->calls, &g);
    ctx->flops_backward[v->comp] += (double)v->N * D;
    dpatch = v->dpatch_tokens;
  }
  linear_backward(&v->patch_embed, ctx, dpatch);
}

static void vit_backbone_forward(Backbone *bb, ExecCtx *ctx, const float *images) {
  Vit *v = (Vit *)bb;
  if (v->n_keep != v->n_patches)
    TL_DIE("vit: this encoder sees %d of %d patches; use vit_forward_visible", v->n_keep,
           v->n_patches);
  vit_forward_visible(v, ctx, images, NULL);
}

// The feature's gradient spread back over the tokens it was read from.
static void vit_backbone_backward(Backbone *bb, ExecCtx *ctx, const float *dfeature) {
  Vit *v = (Vit *)bb;
  if (v->mode != OP_TRAIN) TL_DIE("vit: backward on a ViT built without backward");
  int D = v->D, T = v->T;
  for (int n = 0; n < v->N && !ctx->dry_run; n++) {
    float *dtok = v->dtokens_from_feature + (size_t)n * T * D;
    const float *df = dfeature + (size_t)n * D;
    if (v->has_cls) {
      memcpy(dtok, df, sizeof(float) * (size_t)D);
      memset(dtok + D, 0, sizeof(float) * (size_t)(T - 1) * D);
      continue;
    }
    for (int t = 0; t < T; t++)
      for (int d = 0; d < D; d++) dtok[(size_t)t * D + d] = df[d] / (float)T;
  }
  if (!v->has_cls) ctx->flops_backward[v->comp] += (double)v->N * T * D;
  vit_backward_tokens(v, ctx, v->dtokens_from_feature);
}

static void vit_destroy(Backbone *bb) {
  Vit *v = (Vit *)bb;
  tl_free(v->pos_embed);
  tl_free(v->patches_slots);
  linear_destroy(&v->patch_embed);
  tl_free(v->embedded_slots);
  for (int i = 0; i < v->depth; i++) transformer_block_destroy(&v->blocks[i]);
  free(v->blocks);
  oplist_destroy(&v->entry);
  oplist_destroy(&v->head);
  buffer_pool_free(&v->buffers);
  tl_free(v->feature_slots);
  tl_free(v->dtokens_from_feature);
  tl_free(v->dpatch_tokens);
  free(v);
}

// Activations and their gradients are bf16 from the first block's input to the final norm's output
// under [train] precision = bf16 (the tokens enter and leave f32); evaluation is f32.
static dnnl_data_type_t vit_act_type(const Builder *b) {
  return builder_policy(b).bf16 && b->mode != OP_INFER ? dnnl_bf16 : dnnl_f32;
}

// The op list: the embedding (whose backward reads the first block's input gradient), under bf16
// the conversion into the blocks' type, the blocks, the final norm (its output, the tokens,
// outlives the pass; under bf16 its f32 conversion does, and the norm's own output is the pool's).
static void vit_build_stack(Vit *v, const ModelSpec *spec, const Builder *b) {
  Builder pooled = *b;
  pooled.pool = &v->buffers;
  pooled.act_type = v->act_type;
  const int convert = v->act_type != dnnl_f32;
  const OpShape tokens = {v->N, v->T, 1, v->D};
  // The embedding (whose backward reads the first block's input gradient), in bf16 the
  // conversion of its f32 tokens, the blocks, the final norm, in bf16 the conversion of its output
  // back to f32; the tokens outlive the pass.
  const BufValue g_embedded = builder_grad_value(&pooled), g_tokens = builder_grad_value(&pooled);
  builder_input(&pooled, g_embedded);
  BufValue x = 0, g_x = g_embedded;
  if (convert) {
    g_x = builder_grad_value(&pooled);
    oplist_add(&v->entry, &op_convert, OPLIST_INPUT, 0, (OpArgs){.flags = OP_ARG_INPUT_F32});
    x = oplist_build(&v->entry, &pooled, tokens, 1, (OpListValues){0, g_x, g_embedded});
  }
  x = transformer_stack_init(v->blocks, v->depth, &pooled, "blocks", v->N, v->T, v->D, spec->heads,
                             spec->mlp_ratio, x, g_tokens, g_x);
  const int norm = oplist_add(&v->head, &op_layernorm, OPLIST_INPUT, 0,
                              (OpArgs){.name = "norm", .flags = convert ? 0 : OP_ARG_OWN_OUTPUT});
  if (convert)
    oplist_add(&v->head, &op_convert, norm, 0,
               (OpArgs){.flags = OP_ARG_OUTPUT_F32 | OP_ARG_OWN_OUTPUT});
  oplist_build(&v->head, &pooled, tokens, 1, (OpListValues){x, 0, g_tokens});
  v->norm = oplist_op(&v->head, norm);
  v->buffers.arena = b->arena;
  buffer_pool_finish(&v->buffers, v->comp);
  v->tokens = oplist_out(&v->head);
}

Vit *vit_create_masked(const ModelSpec *spec, Builder *b, int N, int image_size, int channels,
                       int n_keep) {
  if (vit_check_spec(spec, image_size, channels)) return NULL;
  int padded = backbone_padded_size(spec, image_size), grid = padded / spec->patch_size;
  if (N <= 0 || n_keep < 1 || n_keep > grid * grid) {
    tl_fail("vit: %d images with %d of %d patches kept", N, n_keep, grid * grid);
    return NULL;
  }
  // Ops index token rows with int (as oneDNN's 2-D shapes do in practice): a step whose tokens
  // overflow it is refused, not wrapped.
  long rows = (long)N * (grid * (long)grid + 1);
  if ((long)grid * grid > INT_MAX || rows > INT_MAX) {
    tl_fail(
        "vit: %d images of %ld patches each make %ld token rows per step, more than one "
        "tensor indexes (%d): lower train.batch_size, or raise patch_size in the model file",
        N, (long)grid * grid, rows, INT_MAX);
    return NULL;
  }
  const size_t param_offset = b->params->used;
  Vit *v = calloc(1, sizeof *v);
  if (!v) TL_DIE("out of memory");
  int train = b->mode == OP_TRAIN;
  MemCategory out_cat = builder_out_category(b);
  v->N = N;
  v->image_size = image_size;
  v->channels = channels;
  v->padded_size = padded;
  v->pad_before = (padded - image_size) / 2;
  v->patch_size = spec->patch_size;
  v->grid = grid;
  v->n_patches = grid * grid;
  v->patch_dim = spec->patch_size * spec->patch_size * channels;
  v->n_keep = n_keep;
  v->has_cls = strcmp(spec->pool, "cls") == 0;
  v->T = v->has_cls + n_keep;
  v->D = spec->dim;
  v->depth = spec->depth;
  v->mode = b->mode;
  v->params = b->params;
  v->comp = b->component;
  v->act_type = vit_act_type(b);
  size_t D = (size_t)v->D, tokens = (size_t)N * v->T;

  v->pos_embed = tl_alloc((size_t)v->n_patches * D * sizeof(float), MEM_WORKSPACE, v->comp);
  vit_sincos_pos_embed(v->pos_embed, grid, v->D);
  op_calls_init(&v->calls, b);
  v->patches = v->patches_slots = op_calls_alloc(
      &v->calls, (size_t)N * n_keep * v->patch_dim * sizeof(float), out_cat, v->comp);
  linear_init(&v->patch_embed, b, "patch_embed", N * n_keep, v->patch_dim, v->D, 1, 0, 0.0f);
  if (v->has_cls) {
    // Like a bias, the cls token is exempt from weight decay.
    v->cls = paramset_take(b->params, "cls_token", D, 1, &v->dcls);
    paramset_init_normal(b->params, v->cls, D, 0.02f);
    op_grads_expect(b, &v->calls, v->dcls, (size_t)D, NULL, 0);
  }
  v->embedded = v->embedded_slots =
      op_calls_alloc(&v->calls, tokens * D * sizeof(float), out_cat, v->comp);
  v->blocks = calloc((size_t)v->depth, sizeof *v->blocks);
  if (!v->blocks && v->depth) TL_DIE("out of memory");
  vit_build_stack(v, spec, b);
  v->feature = v->feature_slots =
      op_calls_alloc(&v->calls, (size_t)N * D * sizeof(float), out_cat, v->comp);
  if (train) {
    v->dtokens_from_feature = tl_alloc(tokens * D * sizeof(float), MEM_ACT_GRAD, v->comp);
    if (v->has_cls)
      v->dpatch_tokens = tl_alloc((size_t)N * n_keep * D * sizeof(float), MEM_ACT_GRAD, v->comp);
  }
  v->base = (Backbone){.pad_mean = strcmp(spec->pad_fill, "mean") == 0,
                       .N = N,
                       .channels = channels,
                       .feature_dim = v->D,
                       .feature = v->feature,
                       .forward = vit_backbone_forward,
                       .backward = vit_backbone_backward,
                       .destroy = vit_destroy,
                       .param_offset = param_offset,
                       .param_floats = b->params->used - param_offset};
  return v;
}

Backbone *vit_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  if (vit_check_spec(spec, image_size, channels)) return NULL;
  Vit *v = vit_create_masked(spec, b, N, image_size, channels, vit_patch_count(spec, image_size));
  return v ? &v->base : NULL;
}

static const KeySpec vit_keys[] = {
    INT_KEY(BACKBONE(patch_size), "4", 1, 256,
            "vit: patch side in pixels; must divide the (padded) image side"),
    INT_KEY(BACKBONE(dim), "128", 1, 65536, "vit: token width; a multiple of 4 and of `heads`"),
    INT_KEY(BACKBONE(depth), "4", 1, 256, "vit: transformer blocks"),
    INT_KEY(BACKBONE(heads), "4", 1, 256, "vit: attention heads per block"),
    INT_KEY(BACKBONE(mlp_ratio), "4", 1, 64, "vit: MLP hidden width as a multiple of `dim`"),
    TEXT_KEY(BACKBONE(pool), "cls", "cls|mean",
             "vit: `cls`: a cls token, whose output after the final LayerNorm is the "
             "representation; `mean`: no cls token, the mean of the patch tokens"),
};

static int vit_validate(const void *settings, int image_size, const char *where) {
  const ModelSpec *m = settings;
  int size = backbone_padded_size(m, image_size);
  if (size % m->patch_size)
    return tl_fail("%s: [backbone] patch_size = %d does not divide the image size %d (%s)", where,
                   m->patch_size, size, m->pad_to ? "pad_to" : "[data] image_size");
  if (m->dim % m->heads)
    return tl_fail("%s: [backbone] dim = %d is not divisible by heads = %d", where, m->dim,
                   m->heads);
  if (m->dim % 4)
    return tl_fail("%s: [backbone] dim = %d: must be a multiple of 4 (2-D sin-cos positions)",
                   where, m->dim);
  return 0;
}

static const BackboneSection vit_section = {
    .name = "vit",
    .help = "patch embedding, pre-norm transformer blocks, fixed 2-D sin-cos positions",
    .keys = vit_keys,
    .n_keys = sizeof vit_keys / sizeof vit_keys[0],
    .validate = vit_validate,
};

static int vit_feature_dim(const ModelSpec *spec) { return spec->dim; }

// An instance that sees smaller images sees them at their own size when its patches tile them:
// pad_to would frame them back to the full side and spend what they save.
static ModelSpec vit_spec_at_size(const ModelSpec *spec, int image_size) {
  ModelSpec at = *spec;
  if (image_size % spec->patch_size == 0) at.pad_to = 0;
  return at;
}

static const char *vit_pool_name(const ModelSpec *spec) { return spec->pool; }

const BackboneDef backbone_vit = {
    .settings = &vit_section,
    .create = vit_create,
    .feature_dim = vit_feature_dim,
    .patch_count = vit_patch_count,
    .masks_tokens = 1,
    .spec_at_size = vit_spec_at_size,
    .pool_name = vit_pool_name,
};
