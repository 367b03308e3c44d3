#include "nn/convnext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backbone.h"
#include "ops/oplist.h"

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

// A block's op list (ops/oplist.h) on (N, H, W, C): the depthwise 7x7 convolution (pad 3, with
// bias), the LayerNorm over channels, the linear layers C -> 4C -> C around GELU on the same rows,
// the layer scale, the sum with the block input. The list plans the rest: it keeps what a backward
// reads (the convolution's and the linear layers' inputs for their weight gradients, the
// LayerNorm's, GELU's and the layer scale's inputs), writes the norm's and GELU's outputs (the
// linear layers' inputs: C and 4C a pixel) again just before the linear layer's backward under
// [train] recompute, from the inputs kept anyway, as a transformer block's are (in bf16 the linear
// layers read copies of their own), lets the sum write over the layer scale's output, and sums the
// gradients reaching the block input from both paths.
static void block_list(OpList *l, const char *name, int C) {
  char nm[64];
  snprintf(nm, sizeof nm, "%s.dwconv", name);
  int x = oplist_add(l, &op_conv, OPLIST_INPUT, 0,
                     (OpArgs){.name = nm,
                              .channels = C,
                              .kernel = CN_KERNEL,
                              .stride = 1,
                              .pad = CN_KERNEL / 2,
                              .groups = C,
                              .has_bias = 1});
  snprintf(nm, sizeof nm, "%s.norm", name);
  x = oplist_add(l, &op_layernorm, x, 0, (OpArgs){.name = nm});
  snprintf(nm, sizeof nm, "%s.fc1", name);
  x = oplist_add(
      l, &op_linear, x, 0,
      (OpArgs){.name = nm, .channels = CN_EXPANSION * C, .has_bias = 1, .init_std = CN_LINEAR_STD});
  x = oplist_add(l, &op_gelu, x, 0, (OpArgs){0});
  snprintf(nm, sizeof nm, "%s.fc2", name);
  x = oplist_add(l, &op_linear, x, 0,
                 (OpArgs){.name = nm, .channels = C, .has_bias = 1, .init_std = CN_LINEAR_STD});
  snprintf(nm, sizeof nm, "%s.layer_scale", name);
  x = oplist_add(l, &op_layerscale, x, 0, (OpArgs){.name = nm, .scale_init = CN_LAYER_SCALE_INIT});
  oplist_add(l, &op_add, x, OPLIST_INPUT, (OpArgs){0});
}

// Before stage S > 1: a LayerNorm over the channels, then a 2x2 stride-2 convolution to OC
// channels (with bias). The convolution's backward reads the norm's output kept: recomputing it
// would save one activation a stage.
static void downsample_list(OpList *l, int stage, int OC) {
  char nm[48];
  snprintf(nm, sizeof nm, "stage%d.down.norm", stage);
  const int x =
      oplist_add(l, &op_layernorm, OPLIST_INPUT, 0, (OpArgs){.name = nm, .flags = OP_ARG_KEEP});
  snprintf(nm, sizeof nm, "stage%d.down.conv", stage);
  oplist_add(l, &op_conv, x, 0,
             (OpArgs){.name = nm, .channels = OC, .kernel = 2, .stride = 2, .has_bias = 1});
}

typedef struct {
  Backbone base;
  OpMode mode;
  BufferPool buffers;  // planned buffers: outputs but the feature, input gradients
  // The op lists one after another: the stem (4x4 stride-4 convolution with bias, LayerNorm), each
  // stage's downsampling (from the second stage on) and blocks, the head (global average pooling,
  // LayerNorm: torchvision's classifier.0).
  int n_lists;
  OpList *lists;
} ConvNeXt;

static void convnext_forward(Backbone *bb, ExecCtx *ctx, const float *images) {
  ConvNeXt *r = (ConvNeXt *)bb;
  oplist_chain_forward(r->lists, r->n_lists, ctx, images);
  bb->feature = oplist_out(&r->lists[r->n_lists - 1]);
}

static void convnext_backward(Backbone *bb, ExecCtx *ctx, const float *dfeature) {
  ConvNeXt *r = (ConvNeXt *)bb;
  TL_ASSERT(r->mode == OP_TRAIN);
  oplist_chain_backward(r->lists, r->n_lists, ctx, dfeature);
}

static void convnext_destroy(Backbone *bb) {
  ConvNeXt *r = (ConvNeXt *)bb;
  oplist_chain_destroy(r->lists, r->n_lists);
  buffer_pool_free(&r->buffers);
  free(r);
}

// The stem's list, each stage's downsampling and blocks, the head's.
static void convnext_lists(ConvNeXt *r, const ModelSpec *spec) {
  const int stages = model_spec_list_length(spec->stage_dims);
  r->n_lists = 2 + stages - 1;
  for (int s = 0; s < stages; s++) r->n_lists += spec->stage_depths[s];
  r->lists = calloc((size_t)r->n_lists, sizeof *r->lists);
  if (!r->lists) TL_DIE("out of memory");
  OpList *l = r->lists;
  const int x = oplist_add(l, &op_conv, OPLIST_INPUT, 0,
                           (OpArgs){.name = "stem.conv",
                                    .channels = spec->stage_dims[0],
                                    .kernel = CN_STEM,
                                    .stride = CN_STEM,
                                    .has_bias = 1,
                                    .flags = OP_ARG_INPUT_F32});
  oplist_add(l++, &op_layernorm, x, 0, (OpArgs){.name = "stem.norm"});
  for (int s = 0; s < stages; s++) {
    if (s > 0) downsample_list(l++, s + 1, spec->stage_dims[s]);
    for (int i = 0; i < spec->stage_depths[s]; i++) {
      char name[32];
      snprintf(name, sizeof name, "stage%d.block%d", s + 1, i + 1);
      block_list(l++, name, spec->stage_dims[s]);
    }
  }
  const int pooled = oplist_add(l, &op_avgpool, OPLIST_INPUT, 0, (OpArgs){0});
  // The feature outlives the pass.
  oplist_add(l, &op_layernorm, pooled, 0, (OpArgs){.name = "norm", .flags = OP_ARG_OWN_OUTPUT});
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
  Builder pooled = *b;
  pooled.pool = &r->buffers;
  pooled.layout = ACT_LAYOUT_NHWC;
  pooled.act_type = dnnl_f32;
  b = &pooled;
  convnext_lists(r, spec);
  OpShape shape = {N, image_size, image_size, channels};
  oplist_build_chain(r->lists, r->n_lists, b, &shape, 0, (OpListValues){0});
  r->buffers.arena = b->arena;
  buffer_pool_finish(&r->buffers, b->component);
  r->base = (Backbone){.pad_mean = strcmp(spec->pad_fill, "mean") == 0,
                       .N = N,
                       .channels = channels,
                       .feature_dim = shape.C,
                       .feature = oplist_out(&r->lists[r->n_lists - 1]),
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
