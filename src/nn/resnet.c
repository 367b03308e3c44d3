#include "nn/resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/add.h"
#include "ops/batchnorm.h"
#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/pool.h"

// N = images, H/W = spatial size at the block's output, IC/OC = channels in/out.
typedef struct {
  Conv2d conv1, conv2;  // 3x3 (stride s), 3x3
  BatchNorm bn1;        // with fused ReLU
  BatchNorm bn2;        // no ReLU: the ReLU comes after the residual sum
  int has_projection;
  Conv2d proj;  // 1x1 stride s, when the shape changes
  BatchNorm proj_bn;
  Add sum;       // (N, H, W, OC) residual sum
  Eltwise relu;  // (N, H, W, OC) block output
  Add dsum;      // (N, IH, IW, IC) gradient reaching the block input from both paths
  int train;
  const float *in;
} BasicBlock;

typedef struct {
  Backbone base;
  OpMode mode;
  int image_size, padded_size;  // S, P_S
  float *padded;                // (N, P_S, P_S, C) the stem's input when pad_to frames the images
  float *padded_slots;          // one per forward call (ops/builder.h)
  OpCalls pad_calls;
  BufferPool buffers;  // planned buffers: outputs but the feature, input gradients (block_init)
  Conv2d stem;
  BatchNorm stem_bn;  // with fused ReLU
  int n_blocks;
  BasicBlock *blocks;
  GlobalAvgPool pool;
} ResNet;

// A block's ops in the order forward runs them (backward runs them in reverse), each declared to
// the builder's pool before it is built (ops/builder.h): what it reads, where its output goes,
// which gradient its backward reads and writes. The planner (ops/buffer_pool.h) keeps what a
// backward reads: the convolutions' inputs (the block input, bn1's output) for their weight
// gradients, the BatchNorms' inputs and the output, whose sign is the final ReLU's gradient.
// bn2's and proj_bn's outputs are read only by the residual sum, and the sum's only by the ReLU:
// they share the pool's buffers, the sum over bn2's output. So does bn1's output when conv2's
// backward reads a copy of its own (bf16 compute on f32 activations), or when [train] recompute
// writes it again just before that backward (from conv1's output and the batch statistics bn1 keeps
// anyway). Without backward the BatchNorms, the sum and the ReLU write over their inputs, except a
// BatchNorm that reads its input again after writing (sync_bn). x: the block input, dout: the
// gradient at its output, din: where its input gradient goes; returns the output value.
static BufValue block_init(BasicBlock *blk, Builder *b, const char *name, int N, int IC, int IH,
                           int IW, int OC, int stride, BufValue x, BufValue dout, BufValue din) {
  char nm[64];
  int train = b->mode == OP_TRAIN;
  const unsigned bn_flags = OUT_IN_PLACE | (batchnorm_in_place(b) ? 0 : OUT_READS_LATE);
  blk->train = train;
  blk->has_projection = stride != 1 || IC != OC;
  const BufValue g_sum = builder_grad_value(b), g_c1 = builder_grad_value(b),
                 g_a = builder_grad_value(b), g_b1 = builder_grad_value(b),
                 g_c2 = builder_grad_value(b), g_p = builder_grad_value(b),
                 g_shortcut = blk->has_projection ? builder_grad_value(b) : g_sum;
  size_t in_n = (size_t)N * IH * IW * IC;
  if (train) {  // the gradient reaching the block input from both paths
    builder_output(b, 0, 0, OUT_NONE);
    builder_grad(b, din, g_c1, g_shortcut);
    add_init(&blk->dsum, b, in_n, MEM_ACT_GRAD, 1);
  }
  snprintf(nm, sizeof nm, "%s.conv1", name);
  const BufValue c1 = builder_output(b, x, 0, 0);
  builder_grad(b, g_c1, g_a, 0);
  conv2d_init(&blk->conv1, b, nm, N, IC, IH, IW, OC, 3, stride, 1, 0, train);
  if (conv2d_backward_reads_input(&blk->conv1)) builder_backward_reads(b, x);
  int H = blk->conv1.OH, W = blk->conv1.OW;
  snprintf(nm, sizeof nm, "%s.bn1", name);
  const BufValue b1 = builder_output(b, c1, 0, bn_flags | OUT_RECOMPUTED);
  builder_grad(b, g_a, g_b1, 0);
  builder_backward_reads(b, c1);
  batchnorm_init(&blk->bn1, b, nm, N, OC, H, W, 1, train);
  snprintf(nm, sizeof nm, "%s.conv2", name);
  const BufValue c2 = builder_output(b, b1, 0, 0);
  builder_grad(b, g_b1, g_c2, 0);
  conv2d_init(&blk->conv2, b, nm, N, OC, H, W, OC, 3, 1, 1, 0, train);
  if (conv2d_backward_reads_input(&blk->conv2)) builder_backward_reads(b, b1);
  snprintf(nm, sizeof nm, "%s.bn2", name);
  const BufValue b2 = builder_output(b, c2, 0, bn_flags);
  builder_grad(b, g_c2, g_sum, 0);
  builder_backward_reads(b, c2);
  batchnorm_init(&blk->bn2, b, nm, N, OC, H, W, 0, train);
  BufValue shortcut = x;
  if (blk->has_projection) {
    snprintf(nm, sizeof nm, "%s.proj", name);
    const BufValue pj = builder_output(b, x, 0, 0);
    builder_grad(b, g_shortcut, g_p, 0);
    conv2d_init(&blk->proj, b, nm, N, IC, IH, IW, OC, 1, stride, 0, 0, train);
    if (conv2d_backward_reads_input(&blk->proj)) builder_backward_reads(b, x);
    snprintf(nm, sizeof nm, "%s.proj_bn", name);
    shortcut = builder_output(b, pj, 0, bn_flags);
    builder_grad(b, g_p, g_sum, 0);
    builder_backward_reads(b, pj);
    batchnorm_init(&blk->proj_bn, b, nm, N, OC, H, W, 0, train);
  }
  size_t out_n = (size_t)N * H * W * OC;
  const BufValue sum = builder_output(b, b2, shortcut, OUT_IN_PLACE);
  add_init(&blk->sum, b, out_n, builder_out_category(b), 0);
  const BufValue out = builder_output(b, sum, 0, OUT_IN_PLACE);
  builder_grad(b, g_sum, dout, 0);
  builder_backward_reads(b, out);
  eltwise_init(&blk->relu, b, ELTWISE_RELU, out_n, train);
  return out;
}

static const float *block_forward(BasicBlock *blk, ExecCtx *ctx, const float *in) {
  blk->in = in;
  conv2d_forward(&blk->conv1, ctx, in);
  batchnorm_forward(&blk->bn1, ctx, blk->conv1.out);
  conv2d_forward(&blk->conv2, ctx, blk->bn1.out);
  batchnorm_forward(&blk->bn2, ctx, blk->conv2.out);
  const float *shortcut = in;
  if (blk->has_projection) {
    conv2d_forward(&blk->proj, ctx, in);
    batchnorm_forward(&blk->proj_bn, ctx, blk->proj.out);
    shortcut = blk->proj_bn.out;
  }
  add_forward(&blk->sum, ctx, blk->bn2.out, shortcut);
  eltwise_forward(&blk->relu, ctx, blk->sum.out);
  return blk->relu.out;
}

// Returns the gradient with respect to the block input.
static const float *block_backward(BasicBlock *blk, ExecCtx *ctx, const float *dout) {
  eltwise_backward(&blk->relu, ctx, dout);
  const float *dsum = blk->relu.din;  // reaches both the residual branch and the shortcut
  const float *dshortcut = dsum;
  if (blk->has_projection) {
    batchnorm_backward(&blk->proj_bn, ctx, dsum);
    conv2d_backward(&blk->proj, ctx, blk->proj_bn.din);
    dshortcut = blk->proj.din;
  }
  batchnorm_backward(&blk->bn2, ctx, dsum);
  if (blk->bn1.calls.out_shared && conv2d_backward_reads_input(&blk->conv2))
    batchnorm_recompute(&blk->bn1, ctx);
  conv2d_backward(&blk->conv2, ctx, blk->bn2.din);
  batchnorm_backward(&blk->bn1, ctx, blk->conv2.din);
  conv2d_backward(&blk->conv1, ctx, blk->bn1.din);
  add_forward(&blk->dsum, ctx, blk->conv1.din, dshortcut);
  return blk->dsum.out;
}

static void block_destroy(BasicBlock *blk) {
  conv2d_destroy(&blk->conv1);
  conv2d_destroy(&blk->conv2);
  batchnorm_destroy(&blk->bn1);
  batchnorm_destroy(&blk->bn2);
  if (blk->has_projection) {
    conv2d_destroy(&blk->proj);
    batchnorm_destroy(&blk->proj_bn);
  }
  add_destroy(&blk->sum);
  eltwise_destroy(&blk->relu);
  if (blk->train) add_destroy(&blk->dsum);
}

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
  batchnorm_backward(&r->stem_bn, ctx, d);
  conv2d_backward(&r->stem, ctx, r->stem_bn.din);
}

static void resnet_destroy(Backbone *bb) {
  ResNet *r = (ResNet *)bb;
  tl_free(r->padded_slots);
  conv2d_destroy(&r->stem);
  batchnorm_destroy(&r->stem_bn);
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
  const BufValue stem = builder_output(b, 0, 0, 0);  // reads the images or their frame
  builder_grad(b, 0, g_stem, 0);
  b->input_f32 = 1;  // the images
  conv2d_init(&r->stem, b, "stem.conv", N, channels, H, W, C, 3, 1, 1, 0, 0);
  b->input_f32 = 0;
  H = r->stem.OH;
  W = r->stem.OW;
  BufValue x = builder_output(b, stem, 0, bn_flags);
  builder_grad(b, g_stem, g_x, 0);
  builder_backward_reads(b, stem);
  batchnorm_init(&r->stem_bn, b, "stem.bn", N, C, H, W, 1, train);
  const int stages = model_spec_stages(spec);
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
      x = block_init(&r->blocks[k], b, name, N, C, H, W, spec->stage_channels[s], stride, x, g_out,
                     g_x);
      g_x = g_out;
      C = spec->stage_channels[s];
      H = r->blocks[k].conv1.OH;
      W = r->blocks[k].conv1.OW;
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
