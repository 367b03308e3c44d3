#include "nn/resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backbone.h"
#include "ops/oplist.h"

// N = images, H/W = spatial size at the block's output, IC/OC = channels in/out.
// basic: 3x3 (stride s), 3x3 -> OC. bottleneck (torchvision's v1.5): 1x1 to the width w, 3x3
// (stride s), 1x1 to OC = BOTTLENECK_EXPANSION w.
enum { BLOCK_MAX_CONVS = 3, BOTTLENECK_EXPANSION = 4 };

// A block's convolutions: kernel, stride and output channels of each.
typedef struct {
  int n, stride, kernel[BLOCK_MAX_CONVS], strides[BLOCK_MAX_CONVS], channels[BLOCK_MAX_CONVS];
} BlockShape;

static BlockShape block_shape(int bottleneck, int width, int stride) {
  if (!bottleneck) return (BlockShape){2, stride, {3, 3}, {stride, 1}, {width, width}};
  return (BlockShape){
      3, stride, {1, 3, 1}, {1, stride, 1}, {width, width, BOTTLENECK_EXPANSION * width}};
}

// A block's op list (ops/oplist.h) on (N, IH, IW, IC): each convolution followed by its
// BatchNorm (ReLU fused but in the last), a 1x1 projection and its BatchNorm on the shortcut when
// the shape changes, the residual sum (over the last BatchNorm's output) and the ReLU. The list
// plans the rest: it keeps what a backward reads (the convolutions' inputs for their weight
// gradients, the BatchNorms' inputs, the output whose sign is the last ReLU's gradient), writes
// the inner BatchNorm-ReLUs' outputs again before the next convolution's backward under [train]
// recompute, and sums the gradients reaching the block input from both paths.
static void block_list(OpList *l, int in, const char *name, int IC, BlockShape shape) {
  char nm[64];
  const int n = shape.n, OC = shape.channels[n - 1];
  int x = in;
  for (int i = 0; i < n; i++) {
    snprintf(nm, sizeof nm, "%s.conv%d", name, i + 1);
    x = oplist_add(l, &op_conv, x, 0,
                   (OpArgs){.name = nm,
                            .channels = shape.channels[i],
                            .kernel = shape.kernel[i],
                            .stride = shape.strides[i],
                            .pad = shape.kernel[i] / 2});
    snprintf(nm, sizeof nm, "%s.bn%d", name, i + 1);
    x = oplist_add(l, &op_batchnorm, x, 0, (OpArgs){.name = nm, .fuse_relu = i < n - 1});
  }
  int shortcut = in;
  if (shape.stride != 1 || IC != OC) {
    snprintf(nm, sizeof nm, "%s.proj", name);
    shortcut =
        oplist_add(l, &op_conv, in, 0,
                   (OpArgs){.name = nm, .channels = OC, .kernel = 1, .stride = shape.stride});
    snprintf(nm, sizeof nm, "%s.proj_bn", name);
    shortcut = oplist_add(l, &op_batchnorm, shortcut, 0, (OpArgs){.name = nm});
  }
  oplist_add(l, &op_relu, oplist_add(l, &op_add, x, shortcut, (OpArgs){0}), 0, (OpArgs){0});
}

typedef struct {
  Backbone base;
  OpMode mode;
  int image_size, padded_size;  // S, P_S
  float *padded;                // (N, P_S, P_S, C) the stem's input when pad_to frames the images
  float *padded_slots;          // one per forward call (ops/builder.h)
  OpCalls pad_calls;
  BufferPool buffers;  // planned buffers: outputs but the feature, input gradients
  // The op lists one after another: the stem (3x3 stride 1 convolution, [backbone] stem = small,
  // or 7x7 stride 2 and a 3x3 stride-2 max-pool, imagenet; BatchNorm-ReLU) with the first block,
  // each further block, the global average pooling.
  int n_lists;
  OpList *lists;
} ResNet;

// padded (N, P_S, P_S, C) = images (N, S, S, C) centred in a frame of pad_value.
static size_t padded_bytes(const ResNet *r) {
  return sizeof(float) * (size_t)r->base.N * r->padded_size * r->padded_size * r->base.channels;
}

static void pad_images(const ResNet *r, const float *images) {
  const int S = r->image_size, P = r->padded_size, C = r->base.channels, before = (P - S) / 2;
  const size_t row_floats = (size_t)S * C;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < r->base.N; n++)
    for (int y = 0; y < P; y++) {
      float *row = r->padded + ((size_t)n * P + y) * P * C;
      for (int x = 0; x < P; x++)
        for (int c = 0; c < C; c++) row[(size_t)x * C + c] = r->base.pad_value[c];
      if (y >= before && y < before + S)
        memcpy(row + (size_t)before * C, images + ((size_t)n * S + y - before) * row_floats,
               sizeof(float) * row_floats);
    }
}

static void resnet_forward(Backbone *bb, ExecCtx *ctx, const float *images) {
  ResNet *r = (ResNet *)bb;
  if (r->padded_slots) {
    r->padded = op_slot(r->padded_slots, padded_bytes(r), op_calls_forward(&r->pad_calls, "pad"));
    if (!ctx->dry_run) pad_images(r, images);
  }
  const float *x = r->padded ? r->padded : images;
  oplist_chain_forward(r->lists, r->n_lists, ctx, x);
  bb->feature = oplist_out(&r->lists[r->n_lists - 1]);
}

static void resnet_backward(Backbone *bb, ExecCtx *ctx, const float *dfeature) {
  ResNet *r = (ResNet *)bb;
  TL_ASSERT(r->mode == OP_TRAIN);
  oplist_chain_backward(r->lists, r->n_lists, ctx, dfeature);
}

static void resnet_destroy(Backbone *bb) {
  ResNet *r = (ResNet *)bb;
  tl_free(r->padded_slots);
  oplist_chain_destroy(r->lists, r->n_lists);
  buffer_pool_free(&r->buffers);
  free(r);
}

// Activations stay in oneDNN's blocked nChw16c from the stem's output to the pooled feature when
// every channel count fills whole blocks of 16: the layout the Winograd convolutions need, which
// direct convolution, BatchNorm, ReLU, the residual sum and pooling run on as fast as on nhwc,
// so nothing is reordered between layers. The images enter nhwc (the stem converts them). A
// builder that names a layout (tests: nhwc) has it.
static ActLayout resnet_layout(const ModelSpec *spec, const Builder *b) {
  // Blocks of 16 are AVX-512's: without it oneDNN's fast kernels want nhwc or blocks of 8, and
  // several ops on nChw16c fall back to reference code (valgrind's AVX2-only CPU showed it), while
  // Winograd, the reason for the layout, exists only for AVX-512 anyway.
  if (!cpu_has_avx512()) return ACT_LAYOUT_NHWC;
  // Winograd is fp32 only, and oneDNN 2.6's AMX bf16 convolutions (brgconv) take nhwc: on
  // nChw16c bf16 ran the older avx512_core_bf16 kernels, and an inbatch step on resnet-small took
  // 703 ms against 406 in fp32 (Intel Xeon with AMX, 2026-12-05). With bf16 activations between
  // layers nhwc still wins on both versions (AMD EPYC, 2 cores, AVX512-BF16, no AMX, 2026-12-06,
  // machine shared, inbatch batch 256, oneDNN primitives' ms per step): oneDNN 2.6.3 953 nhwc
  // against 1358 nChw16c (its bf16 BatchNorm 396 + 259 there against 167 + 101); 3.7.2 1245
  // against 7276, the stem's backward weights (a 1-channel nchw bf16 input) falling to reference
  // code on nChw16c.
  if (builder_policy(b).bf16) return ACT_LAYOUT_NHWC;
  if (spec->stem_channels % 16 != 0) return ACT_LAYOUT_NHWC;
  for (int s = 0; s < model_spec_stages(spec); s++)
    if (spec->stage_channels[s] % 16 != 0) return ACT_LAYOUT_NHWC;
  return ACT_LAYOUT_BLOCKED16;
}

// Activations and their gradients are bf16 from the stem's output to the pooling's input under
// [train] precision = bf16 (the images enter f32, the feature leaves f32); evaluation is f32.
static dnnl_data_type_t resnet_act_type(const Builder *b) {
  return builder_policy(b).bf16 && b->mode != OP_INFER ? dnnl_bf16 : dnnl_f32;
}

// The stem's list, each block's, the pooling's.
static void resnet_lists(ResNet *r, const ModelSpec *spec) {
  const int stages = model_spec_stages(spec), imagenet = strcmp(spec->stem, "imagenet") == 0;
  const int bottleneck = strcmp(spec->block, "bottleneck") == 0;
  r->n_lists = 1;
  for (int s = 0; s < stages; s++) r->n_lists += spec->stage_blocks[s];
  r->lists = calloc((size_t)r->n_lists, sizeof *r->lists);
  if (!r->lists) TL_DIE("out of memory");
  OpList *stem = &r->lists[0];
  const int stem_k = imagenet ? 7 : 3;
  int x = oplist_add(stem, &op_conv, OPLIST_INPUT, 0,
                     (OpArgs){.name = "stem.conv",
                              .channels = spec->stem_channels,
                              .kernel = stem_k,
                              .stride = imagenet ? 2 : 1,
                              .pad = stem_k / 2,
                              .flags = OP_ARG_INPUT_F32});
  x = oplist_add(stem, &op_batchnorm, x, 0, (OpArgs){.name = "stem.bn", .fuse_relu = 1});
  if (imagenet)
    x = oplist_add(stem, &op_maxpool, x, 0, (OpArgs){.kernel = 3, .stride = 2, .pad = 1});
  // The first block goes on in the stem's list: the stem's output, which that block's
  // convolutions read in backward, is then written again before them under [train] recompute
  // rather than kept (a list recomputes only what its own nodes read), one tensor of the
  // largest size fewer.
  int k = 0, C = spec->stem_channels;
  for (int s = 0; s < stages; s++)
    for (int i = 0; i < spec->stage_blocks[s]; i++, k++) {
      char name[32];
      snprintf(name, sizeof name, "stage%d.block%d", s + 1, i + 1);
      const BlockShape shape =
          block_shape(bottleneck, spec->stage_channels[s], i == 0 ? spec->stage_strides[s] : 1);
      block_list(&r->lists[k], k == 0 ? x : OPLIST_INPUT, name, C, shape);
      C = shape.channels[shape.n - 1];
    }
  oplist_add(&r->lists[k], &op_avgpool, OPLIST_INPUT, 0, (OpArgs){.flags = OP_ARG_OWN_OUTPUT});
}

Backbone *resnet_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  TL_ASSERT(channels <= BACKBONE_MAX_CHANNELS);
  ResNet *r = calloc(1, sizeof *r);
  if (!r) TL_DIE("out of memory");
  r->mode = b->mode;
  r->image_size = image_size;
  r->padded_size = backbone_padded_size(spec, image_size);
  // The frame is materialized once per forward: the stem's own zero padding still surrounds it,
  // as a convolution with padding 1 sees a padded image in PyTorch. In training the stem keeps
  // its input for the weight gradient, so the frame is an activation like any op's output.
  r->base.N = N;
  r->base.channels = channels;
  op_calls_init(&r->pad_calls, b);
  if (r->padded_size > image_size)
    r->padded = r->padded_slots =
        op_calls_alloc(&r->pad_calls, padded_bytes(r), builder_out_category(b), b->component);
  Builder pooled = *b;
  pooled.pool = &r->buffers;
  if (!pooled.layout) pooled.layout = resnet_layout(spec, b);
  if (!pooled.act_type) pooled.act_type = resnet_act_type(b);
  resnet_lists(r, spec);
  OpShape shape = {N, r->padded_size, r->padded_size, channels};
  // The stem reads the images or their frame, from outside the pool; the feature outlives the
  // pass.
  oplist_build_chain(r->lists, r->n_lists, &pooled, &shape, 0, (OpListValues){0, 0, 0});
  r->buffers.arena = b->arena;
  buffer_pool_finish(&r->buffers, b->component);
  r->base = (Backbone){.pad_mean = strcmp(spec->pad_fill, "mean") == 0,
                       .N = N,
                       .channels = channels,
                       .feature_dim = shape.C,
                       .feature = oplist_out(&r->lists[r->n_lists - 1]),
                       .forward = resnet_forward,
                       .backward = resnet_backward,
                       .destroy = resnet_destroy};
  return &r->base;
}

// List entries are at least 1, so the zeros after a list's end mark its length
// (model_spec_list_length) and config_validate can tell lists of different lengths apart.
#define STAGE_LIST(name, def, lo, hi, meaning) LIST_KEY(BACKBONE(name), def, lo, hi, meaning)

static const KeySpec resnet_keys[] = {
    TEXT_KEY(BACKBONE(stem), "small", "small|imagenet",
             "resnet: `small`: a 3×3 convolution of stride 1, for images of 28-64 px; "
             "`imagenet`: torchvision's 7×7 convolution of stride 2 and 3×3 max-pool of stride "
             "2, the first stage at a quarter of the image side, for images of 128 px and more"),
    INT_KEY(BACKBONE(stem_channels), "32", 1, 4096, "resnet: channels out of the stem"),
    TEXT_KEY(BACKBONE(block), "basic", "basic|bottleneck",
             "resnet: `basic`: two 3×3 convolutions (ResNet-18, 34); `bottleneck`: 1×1 to the "
             "stage's width, 3×3 (with the stride), 1×1 to 4 × the width (ResNet-50, 101, 152, "
             "torchvision's v1.5), so a stage puts out 4 × `stage_channels`"),
    STAGE_LIST(stage_channels, "32,64,128", 1, 4096, "resnet: channels of each stage"),
    STAGE_LIST(stage_blocks, "1,1,1", 1, 64,
               "resnet: basic blocks in each stage (as many entries as `stage_channels`)"),
    STAGE_LIST(stage_strides, "1,2,2", 1, 4,
               "resnet: stride of each stage's first block (as many entries as "
               "`stage_channels`)"),
};

static int resnet_validate(const void *settings, int image_size, const char *where) {
  const ModelSpec *m = settings;
  // config_validate checks next that the lists have one length.
  if (model_spec_stages(m) < 1)
    return tl_fail("%s: [backbone] resnet needs at least one stage (stage_channels)", where);
  if (m->pad_to && (m->pad_to - image_size) % 2)
    return tl_fail(
        "%s: [backbone] pad_to = %d: resnet pads evenly on both sides, so it must differ from "
        "[data] image_size = %d by an even number",
        where, m->pad_to, image_size);
  return 0;
}

static const BackboneSection resnet_section = {
    .name = "resnet",
    .help = "a stem, stages of residual blocks (basic or bottleneck), global average pool",
    .keys = resnet_keys,
    .n_keys = sizeof resnet_keys / sizeof resnet_keys[0],
    .validate = resnet_validate,
};

static int resnet_feature_dim(const ModelSpec *spec) {
  const int bottleneck = strcmp(spec->block, "bottleneck") == 0;
  return block_shape(bottleneck, spec->stage_channels[model_spec_stages(spec) - 1], 1)
      .channels[bottleneck ? 2 : 1];
}

static const char *resnet_pool_name(const ModelSpec *spec) {
  (void)spec;
  return "avg";
}

// torchvision's ResNet module names: stem.conv/bn -> conv1/bn1, stage S block B -> layerS.(B-1),
// proj/proj_bn -> downsample.0/1 (its conv1, bn1, ... keep their names).
static int resnet_torch_name(const char *name, char *out, size_t cap) {
  static const struct {
    const char *tally, *torch;
  } parts[] = {{"proj_bn.", "downsample.1."}, {"proj.", "downsample.0."}};
  int stage, block, used = 0;
  if (strncmp(name, "stem.conv.", 10) == 0) return snprintf(out, cap, "conv1.%s", name + 10), 1;
  if (strncmp(name, "stem.bn.", 8) == 0) return snprintf(out, cap, "bn1.%s", name + 8), 1;
  if (sscanf(name, "stage%d.block%d.%n", &stage, &block, &used) != 2 || !used) return 0;
  const char *rest = name + used;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (strncmp(rest, parts[i].tally, strlen(parts[i].tally)) == 0)
      return snprintf(out, cap, "layer%d.%d.%s%s", stage, block - 1, parts[i].torch,
                      rest + strlen(parts[i].tally)),
             1;
  return snprintf(out, cap, "layer%d.%d.%s", stage, block - 1, rest), 1;
}

const BackboneDef backbone_resnet = {
    .settings = &resnet_section,
    .create = resnet_create,
    .feature_dim = resnet_feature_dim,
    .pool_name = resnet_pool_name,
    .torch_name = resnet_torch_name,
};
