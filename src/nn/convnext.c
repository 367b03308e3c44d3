#include "nn/convnext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backbone.h"
#include "ops/add.h"
#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/layernorm.h"
#include "ops/layerscale.h"
#include "ops/linear.h"
#include "ops/pool.h"

// Activations are NHWC f32 throughout: a LayerNorm over channels is then the layernorm op over
// the N*H*W rows of C, and the block's pointwise layers are the linear op over the same rows (as
// torchvision permutes to channels-last for them). Under [train] precision = bf16 the
// convolutions and linear layers multiply in bf16 on copies (ops/weighted.h); LayerNorm, GELU,
// layer scale and the sums stay f32.
//
// Stochastic depth (torchvision's StochasticDepth, a block's branch dropped per sample in
// training) is left out: Tally's blocks are what torchvision's are in eval(), which is what an
// export is compared in; convnext_tiny's 0.1 would be a regularizer for ImageNet-scale training.
// Weights start as Tally's ops start them (Kaiming-normal convolutions, linear layers at
// normal(0, 0.02) as torchvision's trunc_normal(0.02) without its truncation, biases 0), the
// layer scale at 1e-6 as torchvision's.
enum { CN_STEM = 4, CN_KERNEL = 7, CN_EXPANSION = 4 };
#define CN_LAYER_SCALE_INIT 1e-6f
#define CN_LINEAR_STD 0.02f

typedef struct {
  Conv2d dw;         // depthwise 7x7, pad 3, with bias
  LayerNorm norm;    // over channels: (N H W, C) rows
  Linear fc1, fc2;   // C -> 4C -> C on the same rows
  Eltwise gelu;      // (N H W, 4C)
  LayerScale scale;  // per-channel gamma
  Add sum;           // the branch plus the block input
  Add dsum;          // the gradient reaching the block input from both paths (OP_TRAIN)
  int train;
} CnBlock;

typedef struct {
  LayerNorm norm;  // over channels
  Conv2d conv;     // 2x2 stride 2, with bias
} CnDownsample;

// A block's ops in the order forward runs them (backward runs them in reverse), each declared to
// the builder's pool before it is built (ops/builder.h). Backward reads: the depthwise
// convolution's and the linear layers' inputs (weight gradients), the LayerNorm's input, GELU's
// input and the layer scale's input (its gamma's gradient). Under [train] recompute the norm's
// and GELU's outputs (the linear layers' inputs: C and 4C a pixel) are written again just before
// the linear layer's backward reads them (block_backward), from the inputs kept anyway, as a
// transformer block's are; in bf16 the linear layers read copies of their own. The sum writes
// over the layer scale's output, read by nothing else. x: the block input, dout: the gradient at
// its output, din: where its input gradient goes; returns the output value.
static BufValue block_init(CnBlock *blk, Builder *b, const char *name, int N, int H, int W, int C,
                           BufValue x, BufValue dout, BufValue din) {
  char nm[64];
  const int train = blk->train = b->mode == OP_TRAIN;
  const int M = N * H * W, hidden = CN_EXPANSION * C;
  const size_t n = (size_t)M * C;
  const BufValue g_branch = builder_grad_value(b), g_c = builder_grad_value(b),
                 g_n = builder_grad_value(b), g_h = builder_grad_value(b),
                 g_g = builder_grad_value(b), g_f = builder_grad_value(b);
  if (train) {
    builder_output(b, 0, 0, OUT_NONE);
    builder_grad(b, din, g_branch, dout);
    add_init(&blk->dsum, b, n, MEM_ACT_GRAD, 1);
  }
  snprintf(nm, sizeof nm, "%s.dwconv", name);
  const BufValue c = builder_output(b, x, 0, 0);
  builder_grad(b, g_branch, g_c, 0);
  conv2d_init_grouped(&blk->dw, b, nm, N, C, H, W, C, CN_KERNEL, 1, CN_KERNEL / 2, C, 1, train);
  if (conv2d_backward_reads_input(&blk->dw)) builder_backward_reads(b, x);
  snprintf(nm, sizeof nm, "%s.norm", name);
  const BufValue nv = builder_output(b, c, 0, OUT_RECOMPUTED);
  builder_grad(b, g_c, g_n, 0);
  builder_backward_reads(b, c);
  layernorm_init(&blk->norm, b, nm, M, C);
  snprintf(nm, sizeof nm, "%s.fc1", name);
  const BufValue h = builder_output(b, nv, 0, 0);
  builder_grad(b, g_n, g_h, 0);
  linear_init(&blk->fc1, b, nm, M, C, hidden, 1, train, CN_LINEAR_STD);
  if (linear_backward_reads_input(&blk->fc1)) builder_backward_reads(b, nv);
  const BufValue g = builder_output(b, h, 0, OUT_IN_PLACE | OUT_RECOMPUTED);
  builder_grad(b, g_h, g_g, 0);
  builder_backward_reads(b, h);
  eltwise_init(&blk->gelu, b, ELTWISE_GELU, (size_t)M * hidden, train);
  snprintf(nm, sizeof nm, "%s.fc2", name);
  const BufValue f = builder_output(b, g, 0, 0);
  builder_grad(b, g_g, g_f, 0);
  linear_init(&blk->fc2, b, nm, M, hidden, C, 1, train, CN_LINEAR_STD);
  if (linear_backward_reads_input(&blk->fc2)) builder_backward_reads(b, g);
  snprintf(nm, sizeof nm, "%s.layer_scale", name);
  const BufValue s = builder_output(b, f, 0, 0);
  builder_grad(b, g_f, dout, 0);
  builder_backward_reads(b, f);
  layerscale_init(&blk->scale, b, nm, M, C, CN_LAYER_SCALE_INIT, train);
  const BufValue out = builder_output(b, s, x, OUT_IN_PLACE);
  add_init(&blk->sum, b, n, builder_out_category(b), 0);
  return out;
}

static const float *block_forward(CnBlock *blk, ExecCtx *ctx, const float *in) {
  conv2d_forward(&blk->dw, ctx, in);
  layernorm_forward(&blk->norm, ctx, blk->dw.out);
  linear_forward(&blk->fc1, ctx, blk->norm.out);
  eltwise_forward(&blk->gelu, ctx, blk->fc1.out);
  linear_forward(&blk->fc2, ctx, blk->gelu.out);
  layerscale_forward(&blk->scale, ctx, blk->fc2.out);
  add_forward(&blk->sum, ctx, blk->scale.out, in);
  return blk->sum.out;
}

// The sum passes dout to both paths; returns the gradient at the block input.
static const float *block_backward(CnBlock *blk, ExecCtx *ctx, const float *dout) {
  layerscale_backward(&blk->scale, ctx, dout);
  if (blk->gelu.calls.out_shared && linear_backward_reads_input(&blk->fc2))
    eltwise_recompute(&blk->gelu, ctx);
  linear_backward(&blk->fc2, ctx, blk->scale.din);
  eltwise_backward(&blk->gelu, ctx, blk->fc2.din);
  if (blk->norm.calls.out_shared && linear_backward_reads_input(&blk->fc1))
    layernorm_recompute(&blk->norm, ctx);
  linear_backward(&blk->fc1, ctx, blk->gelu.din);
  layernorm_backward(&blk->norm, ctx, blk->fc1.din);
  conv2d_backward(&blk->dw, ctx, blk->norm.din);
  add_forward(&blk->dsum, ctx, blk->dw.din, dout);
  return blk->dsum.out;
}

static void block_destroy(CnBlock *blk) {
  conv2d_destroy(&blk->dw);
  layernorm_destroy(&blk->norm);
  linear_destroy(&blk->fc1);
  eltwise_destroy(&blk->gelu);
  linear_destroy(&blk->fc2);
  layerscale_destroy(&blk->scale);
  add_destroy(&blk->sum);
  if (blk->train) add_destroy(&blk->dsum);
}

typedef struct {
  Backbone base;
  OpMode mode;
  BufferPool buffers;  // planned buffers: outputs but the feature, input gradients
  Conv2d stem;         // 4x4 stride 4, with bias
  LayerNorm stem_norm;
  int n_stages;
  int stage_blocks[CONFIG_MAX_STAGES];
  CnDownsample down[CONFIG_MAX_STAGES];  // before stage s >= 1
  CnBlock *blocks;                       // every stage's, in order
  int n_blocks;
  GlobalAvgPool pool;
  LayerNorm head_norm;  // torchvision's classifier.0
} ConvNeXt;

static void convnext_forward(Backbone *bb, ExecCtx *ctx, const float *images) {
  ConvNeXt *r = (ConvNeXt *)bb;
  conv2d_forward(&r->stem, ctx, images);
  layernorm_forward(&r->stem_norm, ctx, r->stem.out);
  const float *x = r->stem_norm.out;
  for (int s = 0, k = 0; s < r->n_stages; s++) {
    if (s > 0) {
      layernorm_forward(&r->down[s].norm, ctx, x);
      conv2d_forward(&r->down[s].conv, ctx, r->down[s].norm.out);
      x = r->down[s].conv.out;
    }
    for (int i = 0; i < r->stage_blocks[s]; i++, k++) x = block_forward(&r->blocks[k], ctx, x);
  }
  gap_forward(&r->pool, ctx, x);
  layernorm_forward(&r->head_norm, ctx, r->pool.out);
  bb->feature = r->head_norm.out;
}

static void convnext_backward(Backbone *bb, ExecCtx *ctx, const float *dfeature) {
  ConvNeXt *r = (ConvNeXt *)bb;
  TL_ASSERT(r->mode == OP_TRAIN);
  layernorm_backward(&r->head_norm, ctx, dfeature);
  gap_backward(&r->pool, ctx, r->head_norm.din);
  const float *d = r->pool.din;
  for (int s = r->n_stages - 1, k = r->n_blocks - 1; s >= 0; s--) {
    for (int i = 0; i < r->stage_blocks[s]; i++, k--) d = block_backward(&r->blocks[k], ctx, d);
    if (s > 0) {
      conv2d_backward(&r->down[s].conv, ctx, d);
      layernorm_backward(&r->down[s].norm, ctx, r->down[s].conv.din);
      d = r->down[s].norm.din;
    }
  }
  layernorm_backward(&r->stem_norm, ctx, d);
  conv2d_backward(&r->stem, ctx, r->stem_norm.din);
}

static void convnext_destroy(Backbone *bb) {
  ConvNeXt *r = (ConvNeXt *)bb;
  conv2d_destroy(&r->stem);
  layernorm_destroy(&r->stem_norm);
  for (int s = 1; s < r->n_stages; s++) {
    layernorm_destroy(&r->down[s].norm);
    conv2d_destroy(&r->down[s].conv);
  }
  for (int i = 0; i < r->n_blocks; i++) block_destroy(&r->blocks[i]);
  free(r->blocks);
  gap_destroy(&r->pool);
  layernorm_destroy(&r->head_norm);
  buffer_pool_free(&r->buffers);
  free(r);
}

// A LayerNorm over the channels of x, then a 2x2 stride-2 convolution to OC channels; g_x: the
// gradient at x, g_out: at the output. Returns the output value; H and W become the output's.
static BufValue downsample_init(CnDownsample *d, Builder *b, int stage, int N, int *H, int *W,
                                int C, int OC, BufValue x, BufValue g_x, BufValue g_out) {
  char nm[48];
  const int train = b->mode == OP_TRAIN;
  const BufValue g_n = builder_grad_value(b);
  snprintf(nm, sizeof nm, "stage%d.down.norm", stage);
  const BufValue v = builder_output(b, x, 0, 0);
  builder_grad(b, g_x, g_n, 0);
  builder_backward_reads(b, x);
  layernorm_init(&d->norm, b, nm, N * *H * *W, C);
  snprintf(nm, sizeof nm, "stage%d.down.conv", stage);
  const BufValue out = builder_output(b, v, 0, 0);
  builder_grad(b, g_n, g_out, 0);
  conv2d_init(&d->conv, b, nm, N, C, *H, *W, OC, 2, 2, 0, 1, train);
  if (conv2d_backward_reads_input(&d->conv)) builder_backward_reads(b, v);
  *H = d->conv.OH;
  *W = d->conv.OW;
  return out;
}

// The stem divides the side by 4 and each later stage by 2 (rounding down, as torchvision's
// convolutions do): the last stage must keep at least a pixel. Also checked when an instance is
// built, for the sizes the model file does not name (dino's and swav's local crops).
static int convnext_check_size(const ModelSpec *m, int image_size, const char *where) {
  const int stages = model_spec_list_length(m->stage_dims);
  int side = image_size / CN_STEM;
  for (int s = 1; s < stages && side > 0; s++) side /= 2;
  if (side >= 1) return 0;
  return tl_fail(
      "%s: [backbone] convnext with %d stages needs images of at least %d px, not %d: the "
      "stem divides the side by %d and each later stage by 2",
      where, stages, CN_STEM << (stages - 1), image_size, CN_STEM);
}

Backbone *convnext_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  TL_ASSERT(channels <= BACKBONE_MAX_CHANNELS);
  if (convnext_check_size(spec, image_size, "an instance of the model")) return NULL;
  ConvNeXt *r = calloc(1, sizeof *r);
  if (!r) TL_DIE("out of memory");
  r->mode = b->mode;
  const int train = b->mode == OP_TRAIN;
  Builder pooled = *b;
  pooled.pool = &r->buffers;
  pooled.layout = ACT_LAYOUT_NHWC;
  pooled.act_type = dnnl_f32;
  b = &pooled;
  r->n_stages = model_spec_list_length(spec->stage_dims);
  for (int s = 0; s < r->n_stages; s++) r->n_blocks += r->stage_blocks[s] = spec->stage_depths[s];
  r->blocks = calloc((size_t)r->n_blocks, sizeof *r->blocks);
  if (!r->blocks) TL_DIE("out of memory");
  int C = spec->stage_dims[0], H = image_size, W = image_size;
  const BufValue g_stem = builder_grad_value(b);
  BufValue g_x = builder_grad_value(b);
  const BufValue stem = builder_output(b, 0, 0, 0);  // reads the images
  builder_grad(b, 0, g_stem, 0);
  b->input_f32 = 1;
  conv2d_init(&r->stem, b, "stem.conv", N, channels, H, W, C, CN_STEM, CN_STEM, 0, 1, 0);
  b->input_f32 = 0;
  H = r->stem.OH;
  W = r->stem.OW;
  BufValue x = builder_output(b, stem, 0, 0);
  builder_grad(b, g_stem, g_x, 0);
  builder_backward_reads(b, stem);
  layernorm_init(&r->stem_norm, b, "stem.norm", N * H * W, C);
  for (int s = 0, k = 0; s < r->n_stages; s++) {
    if (s > 0) {
      const BufValue g_out = builder_grad_value(b);
      x = downsample_init(&r->down[s], b, s + 1, N, &H, &W, C, spec->stage_dims[s], x, g_x, g_out);
      g_x = g_out;
      C = spec->stage_dims[s];
    }
    for (int i = 0; i < r->stage_blocks[s]; i++, k++) {
      char name[32];
      snprintf(name, sizeof name, "stage%d.block%d", s + 1, i + 1);
      const BufValue g_out = builder_grad_value(b);
      x = block_init(&r->blocks[k], b, name, N, H, W, C, x, g_out, g_x);
      g_x = g_out;
    }
  }
  const BufValue g_pool = builder_grad_value(b);
  const BufValue pooled_v = builder_output(b, x, 0, 0);
  builder_grad(b, g_x, g_pool, 0);
  gap_init(&r->pool, b, N, H, W, C, train);
  builder_output(b, pooled_v, 0, OUT_OWN);  // the feature outlives the pass
  builder_grad(b, g_pool, 0, 0);
  builder_backward_reads(b, pooled_v);
  layernorm_init(&r->head_norm, b, "norm", N, C);
  buffer_pool_finish(&r->buffers, b->component);
  r->base = (Backbone){.pad_mean = strcmp(spec->pad_fill, "mean") == 0,
                       .N = N,
                       .channels = channels,
                       .feature_dim = C,
                       .feature = r->head_norm.out,
                       .forward = convnext_forward,
                       .backward = convnext_backward,
                       .destroy = convnext_destroy};
  return &r->base;
}

#define STAGE_LIST(name, def, lo, hi, meaning) LIST_KEY(BACKBONE(name), def, lo, hi, meaning)

static const KeySpec convnext_keys[] = {
    STAGE_LIST(stage_dims, "96,192,384,768", 1, 4096,
               "convnext: channels of each stage (the stem puts out the first)"),
    STAGE_LIST(stage_depths, "3,3,9,3", 1, 64,
               "convnext: blocks in each stage (as many entries as `stage_dims`)"),
};

static int convnext_validate(const void *settings, int image_size, const char *where) {
  const ModelSpec *m = settings;
  if (model_spec_list_length(m->stage_dims) < 1)
    return tl_fail("%s: [backbone] convnext needs at least one stage (stage_dims)", where);
  if (m->pad_to)
    return tl_fail("%s: [backbone] pad_to = %d: convnext does not frame its images", where,
                   m->pad_to);
  return convnext_check_size(m, image_size, where);
}

static const BackboneSection convnext_section = {
    .name = "convnext",
    .help =
        "a 4×4 stride-4 stem, stages of ConvNeXt blocks (depthwise 7×7, LayerNorm, MLP, "
        "layer scale), global average pool, LayerNorm",
    .keys = convnext_keys,
    .n_keys = sizeof convnext_keys / sizeof convnext_keys[0],
    .validate = convnext_validate,
};

static int convnext_feature_dim(const ModelSpec *spec) {
  return spec->stage_dims[model_spec_list_length(spec->stage_dims) - 1];
}

static const char *convnext_pool_name(const ModelSpec *spec) {
  (void)spec;
  return "avg";
}

// torchvision's ConvNeXt module names: features.0 the stem (0 conv, 1 norm), features.(2S - 1)
// stage S's blocks, features.(2S - 2) the downsampling before it (0 norm, 1 conv); in a block,
// block.0 the depthwise convolution, block.2 the norm, block.3 and block.5 the linear layers,
// layer_scale a tensor of the block; classifier.0 the final norm (classifier.2, the Linear, is
// not the encoder's).
static int convnext_torch_name(const char *name, char *out, size_t cap) {
  static const struct {
    const char *tally, *torch;
  } stem[] = {{"stem.conv.", "features.0.0."},
              {"stem.norm.", "features.0.1."},
              {"norm.", "classifier.0."}},
    block[] = {{"dwconv.", "block.0."},
               {"norm.", "block.2."},
               {"fc1.", "block.3."},
               {"fc2.", "block.5."},
               {"layer_scale", "layer_scale"}};
  for (size_t i = 0; i < sizeof stem / sizeof stem[0]; i++)
    if (strncmp(name, stem[i].tally, strlen(stem[i].tally)) == 0)
      return snprintf(out, cap, "%s%s", stem[i].torch, name + strlen(stem[i].tally)), 1;
  int stage, blk, used = 0;
  if (sscanf(name, "stage%d.down.%n", &stage, &used) == 1 && used) {
    const char *rest = name + used;
    const int norm = strncmp(rest, "norm.", 5) == 0;
    return snprintf(out, cap, "features.%d.%d.%s", 2 * stage - 2, norm ? 0 : 1, rest + 5), 1;
  }
  used = 0;
  if (sscanf(name, "stage%d.block%d.%n", &stage, &blk, &used) != 2 || !used) return 0;
  const char *rest = name + used;
  for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
    if (strncmp(rest, block[i].tally, strlen(block[i].tally)) == 0)
      return snprintf(out, cap, "features.%d.%d.%s%s", 2 * stage - 1, blk - 1, block[i].torch,
                      rest + strlen(block[i].tally)),
             1;
  return 0;
}

const BackboneDef backbone_convnext = {
    .settings = &convnext_section,
    .create = convnext_create,
    .feature_dim = convnext_feature_dim,
    .pool_name = convnext_pool_name,
    .torch_name = convnext_torch_name,
};
