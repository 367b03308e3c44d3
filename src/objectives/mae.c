// mae: masked autoencoder (He et al.). Each image loses mask_ratio of its patches at random; the
// heavy encoder runs on the visible patches only, so its matmuls are (1 - r) * P tokens long;
// a light decoder puts a shared mask token at every masked position, restores the order, adds
// position embeddings and predicts the pixels of every patch. The loss is the mean squared error
// on the masked patches, against per-patch normalized pixels (norm_pix_loss).
#include "objectives/mae.h"

#include <limits.h>
#include <math.h>
#include <stb/stb_image_write.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/transformer.h"
#include "nn/vit.h"

typedef struct {
  Objective base;
  int b;                // images on this replica
  int P, n_keep;        // patches per image, visible patches per image
  int has_cls, Te, Td;  // encoder tokens (has_cls + n_keep), decoder tokens (has_cls + P)
  int D, Dd, patch_dim, depth;
  Vit *encoder;
  Linear embed;                     // (b*Te, D) -> (b*Te, Dd)
  float *mask_token, *dmask_token;  // (Dd) parameter
  float *dec_pos;                   // (P, Dd) fixed sin-cos
  OpList entry;                     // dec_in in the encoder's act_type (bf16 only)
  TransformerBlock *blocks;         // (depth) on (b, Td, Dd)
  BufferPool buffers;               // the decoder's planned buffers (ops/buffer_pool.h)
  OpList tail;  // the final LayerNorm, the prediction (b*Td, Dd) -> (b*Td, patch_dim), in bf16
                // converted into f32
  const float *prediction;  // (b, Td, patch_dim) f32: the last step's, tail's output
  int *keep;                // (b, n_keep) visible patch indices
  int *visible_at;          // (b, P) position of patch p among the visible tokens, or -1
  unsigned char *masked;    // (b, P)
  float *dec_in;            // (b, Td, Dd) decoder input, MEM_ACT decoder
  float *target;            // (b, P, patch_dim) MEM_ACT loss
  float *dpred;             // (b, Td, patch_dim) MEM_ACT_GRAD
  float *dembed;            // (b, Te, Dd) MEM_ACT_GRAD
} Mae;

extern const ObjectiveDef objective_mae;

// [mae]
typedef struct {
  float mask_ratio;   // 0.75: fraction of patches hidden from the encoder
  int norm_pix_loss;  // 1: targets are each patch's pixels normalized by their own mean and std
  int decoder_dim;    // 64
  int decoder_depth;  // 1
  int decoder_heads;  // 4
  int png_every;      // 0 = never; steps between reconstruction grids in the run folder
} MaeSettings;

static int mae_validate(const void *settings, const char *where) {
  const MaeSettings *s = settings;
  if (s->decoder_dim % s->decoder_heads)
    return tl_fail("%s: [mae] decoder_dim = %d is not divisible by decoder_heads = %d", where,
                   s->decoder_dim, s->decoder_heads);
  if (s->decoder_dim % 4)
    return tl_fail("%s: [mae] decoder_dim = %d: must be a multiple of 4 (2-D sin-cos positions)",
                   where, s->decoder_dim);
  return 0;
}

static const KeySpec mae_keys[] = {
    FLOAT_KEY(OWN(MaeSettings, mae, mask_ratio), "0.75", 0, 1, OPEN_MIN | OPEN_MAX,
              "fraction of each image's patches hidden from the encoder"),
    BOOL_KEY(OWN(MaeSettings, mae, norm_pix_loss), "1",
             "1: the targets are each patch's pixels normalized by their own mean and std; 0: "
             "the pixels"),
    INT_KEY(OWN(MaeSettings, mae, decoder_dim), "64", 1, 65536,
            "decoder token width; a multiple of 4 and of `decoder_heads`"),
    INT_KEY(OWN(MaeSettings, mae, decoder_depth), "1", 1, 64, "decoder transformer blocks"),
    INT_KEY(OWN(MaeSettings, mae, decoder_heads), "4", 1, 256, "decoder attention heads"),
    INT_KEY(OWN(MaeSettings, mae, png_every), "0", 0, INT_MAX,
            "steps between reconstruction grids (original, masked, reconstruction) written to "
            "the run folder; 0 = never"),
};
static const ConfigSection mae_settings = CONFIG_SECTION(mae_keys, MaeSettings, mae_validate);

static const MaeSettings *settings(const Config *cfg) {
  return objective_settings(cfg, &objective_mae);
}

static int decoder_dim(const Config *cfg) { return settings(cfg)->decoder_dim; }

int mae_keep_count(int n_patches, float mask_ratio) {
  // As in MAE: len_keep = int(L * (1 - mask_ratio)), at least one visible patch.
  int k = (int)(n_patches * (1.0 - (double)mask_ratio));
  return k < 1 ? 1 : k;
}

static Objective *mae_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const ModelSpec *spec = &cfg->model.spec;
  if (!backbone_def(spec)->masks_tokens) {
    tl_fail("%s: mae needs a vit backbone (this model is '%s')", cfg->model.file, spec->type);
    return NULL;
  }
  Mae *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  const int S = cfg->data.image_size, C = cfg->data.channels, b = o->b;
  Builder bld = {.ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};

  // The encoder: the same parameters, in the same order, as the vit backbone the kNN monitor
  // builds, but sized for the visible patches only.
  o->P = vit_patch_count(spec, S);
  o->n_keep = mae_keep_count(o->P, settings(cfg)->mask_ratio);
  o->encoder = vit_create_masked(spec, &bld, b, S, C, o->n_keep);
  if (!o->encoder) {
    free(o);
    return NULL;
  }
  backbone_set_input_normalization(&o->encoder->base, env->input_mean, env->input_std);
  o->base.online = &o->encoder->base;
  o->has_cls = o->encoder->has_cls;
  o->Te = o->encoder->T;
  o->Td = o->has_cls + o->P;
  o->D = spec->dim;
  o->Dd = decoder_dim(cfg);
  o->patch_dim = o->encoder->patch_dim;
  o->depth = settings(cfg)->decoder_depth;

  bld.component = COMP_DECODER;
  linear_init(&o->embed, &bld, "decoder.embed", b * o->Te, o->D, o->Dd, 1, 1, 0.0f);
  o->mask_token =
      paramset_take(env->params, "decoder.mask_token", (size_t)o->Dd, 1, &o->dmask_token);
  paramset_init_normal(env->params, o->mask_token, (size_t)o->Dd, 0.02f);
  paramset_grad_expect(env->params, o->dmask_token, 1);  // written whole by each backward
  o->blocks = calloc((size_t)o->depth, sizeof *o->blocks);
  // The decoder's op list: the scatter into its input (whose backward reads the first block's
  // input gradient), the blocks, the final norm, the prediction (read by the loss). Blocks, norm
  // and prediction keep their activations in the encoder's type, converted from the scattered
  // input and, the prediction, back to f32 for the loss.
  Builder pooled = bld;
  pooled.pool = &o->buffers;
  pooled.act_type = o->encoder->act_type;
  const int convert = pooled.act_type != dnnl_f32;
  const OpShape dec = {b, o->Td, 1, o->Dd};
  const BufValue g_in = builder_grad_value(&pooled), g_blocks = builder_grad_value(&pooled);
  builder_input(&pooled, g_in);
  BufValue x = 0, g_x = g_in;
  if (convert) {
    g_x = builder_grad_value(&pooled);
    oplist_add(&o->entry, &op_convert, OPLIST_INPUT, 0, (OpArgs){.flags = OP_ARG_INPUT_F32});
    x = oplist_build(&o->entry, &pooled, dec, 1, (OpListValues){0, g_x, g_in});
  }
  x = transformer_stack_init(o->blocks, o->depth, &pooled, "decoder.blocks", b, o->Td, o->Dd,
                             settings(cfg)->decoder_heads, spec->mlp_ratio, x, g_blocks, g_x);
  const int norm = oplist_add(&o->tail, &op_layernorm, OPLIST_INPUT, 0,
                              (OpArgs){.name = "decoder.norm", .flags = OP_ARG_KEEP});
  const int pred = oplist_add(&o->tail, &op_linear, norm, 0,
                              (OpArgs){.name = "decoder.pred",
                                       .channels = o->patch_dim,
                                       .has_bias = 1,
                                       .flags = convert ? 0 : OP_ARG_OWN_OUTPUT});
  if (convert)
    oplist_add(&o->tail, &op_convert, pred, 0,
               (OpArgs){.flags = OP_ARG_OUTPUT_F32 | OP_ARG_OWN_OUTPUT});
  oplist_build(&o->tail, &pooled, dec, 1, (OpListValues){x, 0, g_blocks});
  buffer_pool_finish(&o->buffers, COMP_DECODER);
  o->dec_pos = tl_alloc(sizeof(float) * (size_t)o->P * o->Dd, MEM_PARAM, COMP_DECODER);
  vit_sincos_pos_embed(o->dec_pos, o->encoder->grid, o->Dd);
  o->dec_in = tl_alloc(sizeof(float) * (size_t)b * o->Td * o->Dd, MEM_ACT, COMP_DECODER);
  o->dembed = tl_alloc(sizeof(float) * (size_t)b * o->Te * o->Dd, MEM_ACT_GRAD, COMP_DECODER);

  o->keep = tl_alloc(sizeof(int) * (size_t)b * o->n_keep, MEM_ACT, COMP_LOSS);
  o->visible_at = tl_alloc(sizeof(int) * (size_t)b * o->P, MEM_ACT, COMP_LOSS);
  o->masked = tl_alloc((size_t)b * o->P, MEM_ACT, COMP_LOSS);
  o->target = tl_alloc(sizeof(float) * (size_t)b * o->P * o->patch_dim, MEM_ACT, COMP_LOSS);
  o->dpred = tl_alloc(sizeof(float) * (size_t)b * o->Td * o->patch_dim, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

void mae_random_mask(uint64_t seed, long step, int image_index, int n_patches, int n_keep,
                     int *keep, unsigned char *masked) {
  // noise -> argsort ascending -> the first n_keep are kept (random_masking in models_mae.py).
  float noise[4096];
  int order[4096];
  TL_ASSERT(n_patches <= 4096);
  Rng r = rng_stream(seed, RNG_MASK, (uint64_t)step, (uint64_t)image_index);
  for (int p = 0; p < n_patches; p++) {
    noise[p] = rng_uniform(&r);
    order[p] = p;
  }
  // Insertion sort keeps ties in index order; P is at most a few hundred.
  for (int i = 1; i < n_patches; i++) {
    int v = order[i], j = i - 1;
    while (j >= 0 && noise[order[j]] > noise[v]) {
      order[j + 1] = order[j];
      j--;
    }
    order[j + 1] = v;
  }
  for (int p = 0; p < n_patches; p++) masked[p] = 1;
  for (int i = 0; i < n_keep; i++) {
    keep[i] = order[i];
    masked[order[i]] = 0;
  }
}

// MAE's norm_pix_loss target: each patch normalized by its own mean and (unbiased) variance.
static void normalize_patches(float *patches, int n, int dim) {
  for (int i = 0; i < n; i++) {
    float *x = patches + (size_t)i * dim;
    double mean = 0, var = 0;
    for (int j = 0; j < dim; j++) mean += x[j];
    mean /= dim;
    for (int j = 0; j < dim; j++) var += (x[j] - mean) * (x[j] - mean);
    var /= dim > 1 ? dim - 1 : 1;
    double inv = 1.0 / sqrt(var + 1e-6);
    for (int j = 0; j < dim; j++) x[j] = (float)((x[j] - mean) * inv);
  }
}

// Patches (n_patches, P*P*C) of one image back into a (G*P, G*P, C) image (vit_patchify's order).
static void unpatchify(const float *patches, int grid, int patch, int channels, float *image) {
  const int side = grid * patch;
  for (int gy = 0; gy < grid; gy++)
    for (int gx = 0; gx < grid; gx++)
      for (int py = 0; py < patch; py++)
        for (int px = 0; px < patch; px++)
          for (int c = 0; c < channels; c++)
            image[((size_t)(gy * patch + py) * side + gx * patch + px) * channels + c] =
                patches[((size_t)(gy * grid + gx) * patch * patch + py * patch + px) * channels +
                        c];
}

// Writes RUN/mae-step-NNNNNN.png: for up to 8 images of this step, the original, the masked input
// (masked patches grey) and the reconstruction (predicted patches where masked, with norm_pix
// mapped back through each patch's own mean and std).
static void write_reconstruction_grid(Mae *o, const Batch *batch, long step) {
  const Config *cfg = o->base.env.cfg;
  const int P = o->P, pd = o->patch_dim, C = cfg->data.channels, patch = cfg->model.spec.patch_size;
  const int grid = o->encoder->grid, side = grid * patch, scale = 3, rows = o->b < 8 ? o->b : 8;
  const int panel = side * scale, width = 3 * panel + 2 * scale, height = rows * (panel + scale);
  unsigned char *png = calloc((size_t)width * height * C, 1);
  float *patches = malloc(sizeof(float) * (size_t)P * pd * 3);
  float *image = malloc(sizeof(float) * (size_t)side * side * C);
  float *all = malloc(sizeof(float) * (size_t)o->b * P * pd);
  if (!png || !patches || !image || !all) TL_DIE("out of memory");
  vit_patchify(o->encoder, batch->views, all);
  for (int i = 0; i < rows; i++) {
    const float *orig = all + (size_t)i * P * pd;
    float *masked_in = patches + (size_t)P * pd, *recon = patches + 2 * (size_t)P * pd;
    memcpy(patches, orig, sizeof(float) * (size_t)P * pd);
    float lo = orig[0], hi = orig[0];
    for (int k = 0; k < P * pd; k++) lo = fminf(lo, orig[k]), hi = fmaxf(hi, orig[k]);
    for (int p = 0; p < P; p++) {
      const float *src = orig + (size_t)p * pd;
      const float *pred = o->prediction + ((size_t)i * o->Td + o->has_cls + p) * pd;
      int is_masked = o->masked[(size_t)i * P + p];
      double mean = 0, var = 0;
      for (int c = 0; c < pd; c++) mean += src[c];
      mean /= pd;
      for (int c = 0; c < pd; c++) var += (src[c] - mean) * (src[c] - mean);
      double std = sqrt(var / (pd > 1 ? pd - 1 : 1) + 1e-6);
      for (int c = 0; c < pd; c++) {
        float y = settings(cfg)->norm_pix_loss ? (float)(pred[c] * std + mean) : pred[c];
        masked_in[(size_t)p * pd + c] = is_masked ? 0.5f * (lo + hi) : src[c];
        recon[(size_t)p * pd + c] = is_masked ? y : src[c];
      }
    }
    for (int k = 0; k < 3; k++) {
      unpatchify(patches + (size_t)k * P * pd, grid, patch, C, image);
      for (int y = 0; y < panel; y++)
        for (int x = 0; x < panel; x++)
          for (int c = 0; c < C; c++) {
            float v = image[((size_t)(y / scale) * side + x / scale) * C + c];
            float u = hi > lo ? (v - lo) / (hi - lo) : 0.5f;
            u = u < 0 ? 0 : u > 1 ? 1 : u;
            size_t at =
                ((size_t)(i * (panel + scale) + y) * width + k * (panel + scale) + x) * C + c;
            png[at] = (unsigned char)(255.0f * u + 0.5f);
          }
    }
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/mae-step-%06ld.png", o->base.env.out_dir, step);
  if (!stbi_write_png(path, width, height, C, png, width * C))
    fprintf(stderr, "tally: %s: could not write the reconstruction grid\n", path);
  free(png);
  free(patches);
  free(image);
  free(all);
}

double mae_masked_mse(const float *pred, int rows_per_image, int first_row, float *target,
                      const unsigned char *masked, int n_images, int n_patches, int dim,
                      int norm_pix, float *dpred, long *n_masked) {
  if (norm_pix) normalize_patches(target, n_images * n_patches, dim);
  long count = 0;
  for (size_t i = 0; i < (size_t)n_images * n_patches; i++) count += masked[i];
  memset(dpred, 0, sizeof(float) * (size_t)n_images * rows_per_image * dim);
  const double scale = 2.0 / ((double)dim * count);
  double loss_sum = 0;
  for (int i = 0; i < n_images; i++)
    for (int p = 0; p < n_patches; p++) {
      if (!masked[(size_t)i * n_patches + p]) continue;
      size_t row = (size_t)i * rows_per_image + first_row + p;
      const float *y = pred + row * dim, *t = target + ((size_t)i * n_patches + p) * dim;
      float *dy = dpred + row * dim;
      double se = 0;
      for (int c = 0; c < dim; c++) {
        double diff = (double)y[c] - t[c];
        se += diff * diff;
        dy[c] = (float)(scale * diff);
      }
      loss_sum += se / dim;
    }
  *n_masked = count;
  return loss_sum;
}

// Each image's mask for this step, and where each visible patch sits among the kept ones.
static void draw_masks(Mae *o, const Batch *batch) {
  const int P = o->P;
  for (int i = 0; i < o->b; i++) {
    mae_random_mask(o->base.env.cfg->train.seed, batch->global_step, batch->indices[i], P,
                    o->n_keep, o->keep + (size_t)i * o->n_keep, o->masked + (size_t)i * P);
    for (int p = 0; p < P; p++) o->visible_at[(size_t)i * P + p] = -1;
    for (int j = 0; j < o->n_keep; j++)
      o->visible_at[(size_t)i * P + o->keep[(size_t)i * o->n_keep + j]] = j;
  }
}

// Decoder input: visible tokens back at their positions, the mask token elsewhere, plus
// position embeddings; the cls token (if any) stays first with no position embedding.
static void fill_decoder_input(Mae *o) {
  const int b = o->b, P = o->P, Dd = o->Dd, Te = o->Te, Td = o->Td;
  for (int i = 0; i < b; i++) {
    const float *emb = o->embed.out + (size_t)i * Te * Dd;
    float *row = o->dec_in + (size_t)i * Td * Dd;
    if (o->has_cls) memcpy(row, emb, sizeof(float) * Dd);
    for (int p = 0; p < P; p++) {
      int visible = o->visible_at[(size_t)i * P + p];
      float *dst = row + (size_t)(o->has_cls + p) * Dd;
      const float *src = visible >= 0 ? emb + (size_t)(o->has_cls + visible) * Dd : o->mask_token;
      for (int c = 0; c < Dd; c++) dst[c] = src[c] + o->dec_pos[(size_t)p * Dd + c];
    }
  }
}

// Scatter the decoder input gradient d back: visible rows to their tokens, masked rows into the
// shared mask token.
static void scatter_decoder_grad(Mae *o, const float *d) {
  const int b = o->b, P = o->P, Dd = o->Dd, Te = o->Te, Td = o->Td;
  memset(o->dmask_token, 0, sizeof(float) * Dd);
  for (int i = 0; i < b; i++) {
    const float *drow = d + (size_t)i * Td * Dd;
    float *demb = o->dembed + (size_t)i * Te * Dd;
    if (o->has_cls) memcpy(demb, drow, sizeof(float) * Dd);
    for (int p = 0; p < P; p++) {
      int visible = o->visible_at[(size_t)i * P + p];
      const float *src = drow + (size_t)(o->has_cls + p) * Dd;
      if (visible >= 0)
        memcpy(demb + (size_t)(o->has_cls + visible) * Dd, src, sizeof(float) * Dd);
      else
        for (int c = 0; c < Dd; c++) o->dmask_token[c] += src[c];
    }
  }
}

// What masking leaves the encoder (LEDGER_ENCODED): every patch is decoded, few are encoded.
enum { MAE_PATCHES_TOTAL, MAE_PATCHES_ENCODED, MAE_PATCHES_DECODED };
static const LedgerOwnFields mae_fields = {
    3,
    {
        {"patches_total", LEDGER_ENCODED, UNIT_COUNT, 0},    // in the views patchified
        {"patches_encoded", LEDGER_ENCODED, UNIT_COUNT, 0},  // the encoder processed
        {"patches_decoded", LEDGER_ENCODED, UNIT_COUNT, 0},  // positions the decoder processed
    },
};

static ObjectiveLoss mae_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Mae *o = (Mae *)base;
  const Config *cfg = base->env.cfg;
  ExecCtx *ctx = base->env.ctx;
  const int b = o->b, P = o->P, Dd = o->Dd, Td = o->Td, pd = o->patch_dim;
  TL_ASSERT(batch->n == b && batch->n_views == 1);

  if (!ctx->dry_run) draw_masks(o, batch);
  vit_forward_visible(o->encoder, ctx, batch->views, o->keep);

  linear_forward(&o->embed, ctx, o->encoder->tokens);
  if (!ctx->dry_run) fill_decoder_input(o);
  const float *x = o->entry.n ? oplist_forward(&o->entry, ctx, o->dec_in) : o->dec_in;
  for (int i = 0; i < o->depth; i++) x = transformer_block_forward(&o->blocks[i], ctx, x);
  o->prediction = oplist_forward(&o->tail, ctx, x);

  // Every image has exactly P - n_keep patches masked.
  long n_masked = (long)b * (P - o->n_keep);
  double loss_sum = 0;
  if (!ctx->dry_run) {
    vit_patchify(o->encoder, batch->views, o->target);
    loss_sum = mae_masked_mse(o->prediction, Td, o->has_cls, o->target, o->masked, b, P, pd,
                              settings(cfg)->norm_pix_loss, o->dpred, &n_masked);
  }
  ctx->flops_forward[COMP_LOSS] += 3.0 * n_masked * pd;
  objective_backward_begins(base);

  const float *d = oplist_backward(&o->tail, ctx, o->dpred);
  for (int i = o->depth - 1; i >= 0; i--) d = transformer_block_backward(&o->blocks[i], ctx, d);
  if (o->entry.n) d = oplist_backward(&o->entry, ctx, d);
  if (!ctx->dry_run) scatter_decoder_grad(o, d);
  paramset_grad_contributed(base->env.params, o->dmask_token, (size_t)Dd);
  linear_backward(&o->embed, ctx, o->dembed);
  vit_backward_tokens(o->encoder, ctx, o->embed.din);

  rec->views_grad = b;
  rec->views_nograd = 0;
  rec->own[MAE_PATCHES_TOTAL] = (double)b * P;
  rec->own[MAE_PATCHES_ENCODED] = (double)b * o->n_keep;
  rec->own[MAE_PATCHES_DECODED] = (double)b * P;
  rec->negatives_per_query = 0;
  rec->positives_per_query = 0;
  rec->encodings_next_new = (long)b * o->n_keep;
  rec->encodings_next_reused = 0;
  return (ObjectiveLoss){loss_sum, (double)n_masked};
}

// The step's reconstructions as a grid, every png_every steps.
static void mae_write_outputs(Objective *base, const Batch *batch) {
  const MaeSettings *set = settings(base->env.cfg);
  if (set->png_every > 0 && batch->global_step % set->png_every == 0)
    write_reconstruction_grid((Mae *)base, batch, batch->global_step);
}

static void mae_destroy(Objective *base) {
  Mae *o = (Mae *)base;
  base->online->destroy(base->online);
  linear_destroy(&o->embed);
  for (int i = 0; i < o->depth; i++) transformer_block_destroy(&o->blocks[i]);
  free(o->blocks);
  oplist_destroy(&o->entry);
  oplist_destroy(&o->tail);
  buffer_pool_free(&o->buffers);
  tl_free(o->dec_pos);
  tl_free(o->dec_in);
  tl_free(o->dembed);
  tl_free(o->keep);
  tl_free(o->visible_at);
  tl_free(o->masked);
  tl_free(o->target);
  tl_free(o->dpred);
  free(o);
}

const int *mae_last_keep(const Objective *o, int *n_keep) {
  *n_keep = ((const Mae *)o)->n_keep;
  return ((const Mae *)o)->keep;
}

int mae_encoder_tokens(const Objective *o) { return ((const Mae *)o)->encoder->T; }

const ObjectiveDef objective_mae = {
    .name = "mae",
    .settings = &mae_settings,
    .ledger_fields = &mae_fields,
    .description = "Masked autoencoder: encoder on visible patches only, light decoder",
    .n_views = 1,
    .create = mae_create,
    .step = mae_step,
    .write_outputs = mae_write_outputs,
    .after_update = NULL,
    .destroy = mae_destroy,
};
