#include "nn/resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backbone.h"
#include "ops/add.h"
#include "ops/batchnorm.h"
#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/maxpool.h"
#include "ops/pool.h"

// N = images, H/W = spatial size at the block's output, IC/OC = channels in/out.
// basic: 3x3 (stride s), 3x3 -> OC. bottleneck (torchvision's v1.5): 1x1 to the width w, 3x3
// (stride s), 1x1 to OC = BOTTLENECK_EXPANSION w.
enum { BLOCK_MAX_CONVS = 3, BOTTLENECK_EXPANSION = 4 };

typedef struct {
  int n_convs;                    // 2 (basic) or 3 (bottleneck)
  Conv2d conv[BLOCK_MAX_CONVS];   // conv1, conv2[, conv3]
  BatchNorm bn[BLOCK_MAX_CONVS];  // each with fused ReLU but the last, whose ReLU comes after
                                  // the residual sum
  int has_projection;
  Conv2d proj;  // 1x1 stride s, when the shape changes
  BatchNorm proj_bn;
  Add sum;       // (N, H, W, OC) residual sum
  Eltwise relu;  // (N, H, W, OC) block output
  Add dsum;      // (N, IH, IW, IC) gradient reaching the block input from both paths
  int train;
  const float *in;
} Block;

// A block's convolutions: kernel, stride and output channels of each.
typedef struct {
  int n, stride, kernel[BLOCK_MAX_CONVS], strides[BLOCK_MAX_CONVS], channels[BLOCK_MAX_CONVS];
} BlockShape;

static BlockShape block_shape(int bottleneck, int width, int stride) {
  if (!bottleneck) return (BlockShape){2, stride, {3, 3}, {stride, 1}, {width, width}};
  return (BlockShape){
      3, stride, {1, 3, 1}, {1, stride, 1}, {width, width, BOTTLENECK_EXPANSION * width}};
}

// A block's ops in the order forward runs them (backward runs them in reverse), each declared to
// the builder's pool before it is built (ops/builder.h): what it reads, where its output goes,
// which gradient its backward reads and writes. The planner (ops/buffer_pool.h) keeps what a
// backward reads: the convolutions' inputs (the block input, the inner BatchNorm-ReLUs' outputs)
// for their weight gradients, the BatchNorms' inputs and the output, whose sign is the final
// ReLU's gradient. The last BatchNorm's and proj_bn's outputs are read only by the residual
// sum, and the sum's only by the ReLU: they share the pool's buffers, the sum over the last
// BatchNorm's output. So does an inner BatchNorm's output when the next convolution's backward
// reads a copy of its own (bf16 compute on f32 activations), or when [train] recompute writes it
// again just before that backward (from its input and the batch statistics the BatchNorm keeps
// anyway). Without backward the BatchNorms, the sum and the ReLU write over their inputs, except a
// BatchNorm that reads its input again after writing (sync_bn). x: the block input, dout: the
// gradient at its output, din: where its input gradient goes; returns the output value.
static BufValue block_init(Block *blk, Builder *b, const char *name, int N, int IC, int IH, int IW,
                           BlockShape shape, BufValue x, BufValue dout, BufValue din) {
  char nm[64];
  int train = b->mode == OP_TRAIN;
  const unsigned bn_flags = OUT_IN_PLACE | (batchnorm_in_place(b) ? 0 : OUT_READS_LATE);
  const int n = blk->n_convs = shape.n, OC = shape.channels[n - 1];
  blk->train = train;
  blk->has_projection = shape.stride != 1 || IC != OC;
  // g[2i]: conv i's input gradient, g[2i + 1]: bn i's (conv i's output gradient).
  BufValue g[2 * BLOCK_MAX_CONVS];
  const BufValue g_sum = builder_grad_value(b);
  for (int i = 0; i < 2 * n; i++) g[i] = builder_grad_value(b);
  const BufValue g_p = builder_grad_value(b),
                 g_shortcut = blk->has_projection ? builder_grad_value(b) : g_sum;
  size_t in_n = (size_t)N * IH * IW * IC;
  if (train) {  // the gradient reaching the block input from both paths
    builder_output(b, 0, 0, OUT_NONE);
    builder_grad(b, din, g[0], g_shortcut);
    add_init(&blk->dsum, b, in_n, MEM_ACT_GRAD, 1);
  }
  BufValue v = x;
  int C = IC, H = IH, W = IW;
  for (int i = 0; i < n; i++) {
    snprintf(nm, sizeof nm, "%s.conv%d", name, i + 1);
    const BufValue c = builder_output(b, v, 0, 0);
    builder_grad(b, g[2 * i], g[2 * i + 1], 0);
    conv2d_init(&blk->conv[i], b, nm, N, C, H, W, shape.channels[i], shape.kernel[i],
                shape.strides[i], shape.kernel[i] / 2, 0, train);
    if (conv2d_backward_reads_input(&blk->conv[i])) builder_backward_reads(b, v);
    C = shape.channels[i];
    H = blk->conv[i].OH;
    W = blk->conv[i].OW;
    const int inner = i < n - 1;
    snprintf(nm, sizeof nm, "%s.bn%d", name, i + 1);
    v = builder_output(b, c, 0, bn_flags | (inner ? OUT_RECOMPUTED : 0));
    builder_grad(b, g[2 * i + 1], inner ? g[2 * i + 2] : g_sum, 0);
    builder_backward_reads(b, c);
    batchnorm_init(&blk->bn[i], b, nm, N, C, H, W, inner, train);
  }
  BufValue shortcut = x;
  if (blk->has_projection) {
    snprintf(nm, sizeof nm, "%s.proj", name);
    const BufValue pj = builder_output(b, x, 0, 0);
    builder_grad(b, g_shortcut, g_p, 0);
    conv2d_init(&blk->proj, b, nm, N, IC, IH, IW, OC, 1, shape.stride, 0, 0, train);
    if (conv2d_backward_reads_input(&blk->proj)) builder_backward_reads(b, x);
    snprintf(nm, sizeof nm, "%s.proj_bn", name);
    shortcut = builder_output(b, pj, 0, bn_flags);
    builder_grad(b, g_p, g_sum, 0);
    builder_backward_reads(b, pj);
    batchnorm_init(&blk->proj_bn, b, nm, N, OC, H, W, 0, train);
  }
  size_t out_n = (size_t)N * H * W * OC;
  const BufValue sum = builder_output(b, v, shortcut, OUT_IN_PLACE);
  add_init(&blk->sum, b, out_n, builder_out_category(b), 0);
  const BufValue out = builder_output(b, sum, 0, OUT_IN_PLACE);
  builder_grad(b, g_sum, dout, 0);
  builder_backward_reads(b, out);
  eltwise_init(&blk->relu, b, ELTWISE_RELU, out_n, train);
  return out;
}

static const Conv2d *block_last_conv(const Block *blk) { return &blk->conv[blk->n_convs - 1]; }

static const float *block_forward(Block *blk, ExecCtx *ctx, const float *in) {
  blk->in = in;
  const float *x = in;
  for (int i = 0; i < blk->n_convs; i++) {
    conv2d_forward(&blk->conv[i], ctx, x);
    batchnorm_forward(&blk->bn[i], ctx, blk->conv[i].out);
    x = blk->bn[i].out;
  }
  const float *shortcut = in;
  if (blk->has_projection) {
    conv2d_forward(&blk->proj, ctx, in);
    batchnorm_forward(&blk->proj_bn, ctx, blk->proj.out);
    shortcut = blk->proj_bn.out;
  }
  add_forward(&blk->sum, ctx, x, shortcut);
  eltwise_forward(&blk->relu, ctx, blk->sum.out);
  return blk->relu.out;
}

// Returns the gradient with respect to the block input.
static const float *block_backward(Block *blk, ExecCtx *ctx, const float *dout) {
  eltwise_backward(&blk->relu, ctx, dout);
  const float *dsum = blk->relu.din;  // reaches both the residual branch and the shortcut
  const float *dshortcut = dsum;
  if (blk->has_projection) {
    batchnorm_backward(&blk->proj_bn, ctx, dsum);
    conv2d_backward(&blk->proj, ctx, blk->proj_bn.din);
    dshortcut = blk->proj.din;
  }
  const float *d = dsum;
  for (int i = blk->n_convs - 1; i >= 0; i--) {
    batchnorm_backward(&blk->bn[i], ctx, d);
    if (i > 0 && blk->bn[i - 1].calls.out_shared && conv2d_backward_reads_input(&blk->conv[i]))
      batchnorm_recompute(&blk->bn[i - 1], ctx);
    conv2d_backward(&blk->conv[i], ctx, blk->bn[i].din);
    d = blk->conv[i].din;
  }
  add_forward(&blk->dsum, ctx, d, dshortcut);
  return blk->dsum.out;
}

static void block_destroy(Block *blk) {
  for (int i = 0; i < blk->n_convs; i++) {
    conv2d_destroy(&blk->conv[i]);
    batchnorm_destroy(&blk->bn[i]);
  }
  if (blk->has_projection) {
    conv2d_destroy(&blk->proj);
    batchnorm_destroy(&blk->proj_bn);
  }
  add_destroy(&blk->sum);
  eltwise_destroy(&blk->relu);
  if (blk->train) add_destroy(&blk->dsum);
}

typedef struct {
  Backbone base;
  OpMode mode;
  int image_size, padded_size;  // S, P_S
  float *padded;                // (N, P_S, P_S, C) the stem's input when pad_to frames the images
  float *padded_slots;          // one per forward call (ops/builder.h)
  OpCalls pad_calls;
  BufferPool buffers;  // planned buffers: outputs but the feature, input gradients (block_init)
  Conv2d stem;         // 3x3 stride 1 ([backbone] stem = small) or 7x7 stride 2 (imagenet)
  BatchNorm stem_bn;   // with fused ReLU
  int stem_pool;       // stem = imagenet: a 3x3 stride-2 max-pool follows
  MaxPool stem_maxpool;
  int n_blocks;
  Block *blocks;
  GlobalAvgPool pool;
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
  conv2d_forward(&r->stem, ctx, r->padded ? r->padded : images);
  batchnorm_forward(&r->stem_bn, ctx, r->stem.out);
  const float *x = r->stem_bn.out;
  if (r->stem_pool) {
    maxpool_forward(&r->stem_maxpool, ctx, x);
    x = r->stem_maxpool.out;
  }
  for (int i = 0; i < r->n_blocks; i++) x = block_forward(&r->blocks[i], ctx, x);
  gap_forward(&r->pool, ctx, x);
  bb->feature = r->pool.out;
}

static void resnet_backward(Backbone *bb, ExecCtx *ctx, const float *dfeature) {
  ResNet *r = (ResNet *)bb;
  TL_ASSERT(r->mode == OP_TRAIN);
  gap_backward(&r->pool, ctx, dfeature);
  const float *d = r->pool.din;
  for (int i = r->n_blocks - 1; i >= 0; i--) d = block_backward(&r->blocks[i], ctx, d);
  if (r->stem_pool) {
    maxpool_backward(&r->stem_maxpool, ctx, d);
    d = r->stem_maxpool.din;
  }
  batchnorm_backward(&r->stem_bn, ctx, d);
  conv2d_backward(&r->stem, ctx, r->stem_bn.din);
}

static void resnet_destroy(Backbone *bb) {
  ResNet *r = (ResNet *)bb;
  tl_free(r->padded_slots);
  conv2d_destroy(&r->stem);
  batchnorm_destroy(&r->stem_bn);
  if (r->stem_pool) maxpool_destroy(&r->stem_maxpool);
  for (int i = 0; i < r->n_blocks; i++) block_destroy(&r->blocks[i]);
  free(r->blocks);
  gap_destroy(&r->pool);
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

Backbone *resnet_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  TL_ASSERT(channels <= BACKBONE_MAX_CHANNELS);
  ResNet *r = calloc(1, sizeof *r);
  if (!r) TL_DIE("out of memory");
  r->mode = b->mode;
  int train = b->mode == OP_TRAIN;
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
  b = &pooled;
  const unsigned bn_flags = OUT_IN_PLACE | (batchnorm_in_place(b) ? 0 : OUT_READS_LATE);
  int C = spec->stem_channels, H = r->padded_size, W = r->padded_size;
  const BufValue g_stem = builder_grad_value(b);
  BufValue g_x = builder_grad_value(b);
  r->stem_pool = strcmp(spec->stem, "imagenet") == 0;
  const BufValue g_pool = r->stem_pool ? builder_grad_value(b) : 0;
  const BufValue stem = builder_output(b, 0, 0, 0);  // reads the images or their frame
  builder_grad(b, 0, g_stem, 0);
  b->input_f32 = 1;  // the images
  const int stem_k = r->stem_pool ? 7 : 3, stem_stride = r->stem_pool ? 2 : 1;
  conv2d_init(&r->stem, b, "stem.conv", N, channels, H, W, C, stem_k, stem_stride, stem_k / 2, 0,
              0);
  b->input_f32 = 0;
  H = r->stem.OH;
  W = r->stem.OW;
  BufValue x = builder_output(b, stem, 0, bn_flags);
  builder_grad(b, g_stem, r->stem_pool ? g_pool : g_x, 0);
  builder_backward_reads(b, stem);
  batchnorm_init(&r->stem_bn, b, "stem.bn", N, C, H, W, 1, train);
  if (r->stem_pool) {  // its backward reads the argmax it keeps, not its input or output
    x = builder_output(b, x, 0, 0);
    builder_grad(b, g_pool, g_x, 0);
    maxpool_init(&r->stem_maxpool, b, N, H, W, C, 3, 2, 1, train);
    H = r->stem_maxpool.OH;
    W = r->stem_maxpool.OW;
  }
  const int stages = model_spec_stages(spec);
  const int bottleneck = strcmp(spec->block, "bottleneck") == 0;
  for (int s = 0; s < stages; s++) r->n_blocks += spec->stage_blocks[s];
  r->blocks = calloc((size_t)r->n_blocks, sizeof *r->blocks);
  if (!r->blocks) TL_DIE("out of memory");
  int k = 0;
  for (int s = 0; s < stages; s++)
    for (int i = 0; i < spec->stage_blocks[s]; i++, k++) {
      char name[32];
      snprintf(name, sizeof name, "stage%d.block%d", s + 1, i + 1);
      int stride = i == 0 ? spec->stage_strides[s] : 1;
      const BufValue g_out = builder_grad_value(b);
      const BlockShape shape = block_shape(bottleneck, spec->stage_channels[s], stride);
      x = block_init(&r->blocks[k], b, name, N, C, H, W, shape, x, g_out, g_x);
      g_x = g_out;
      C = shape.channels[shape.n - 1];
      H = block_last_conv(&r->blocks[k])->OH;
      W = block_last_conv(&r->blocks[k])->OW;
    }
  builder_output(b, x, 0, OUT_OWN);  // the feature outlives the pass
  builder_grad(b, g_x, 0, 0);
  gap_init(&r->pool, b, N, H, W, C, train);
  buffer_pool_finish(&r->buffers, b->component);
  r->base = (Backbone){.pad_mean = strcmp(spec->pad_fill, "mean") == 0,
                       .N = N,
                       .channels = channels,
                       .feature_dim = C,
                       .feature = r->pool.out,
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
