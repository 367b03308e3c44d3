#include "ops/conv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Weights stay plain oihw where the optimizer, checkpoints and the momentum update see them, while
// each primitive gets the blocked layout oneDNN prefers; a reorder per call is cheap next to the
// convolution itself (OC*IC*K*K floats against N*OH*OW of work per weight). The passes cannot share
// one copy: in oneDNN 2.6 on avx512_core, for the resnet-small-32 shapes, forward (brgconv, Ohwi32o
// or Ohwi64o) and backward data (jit, OIhw16o16i) have only the reference implementation in each
// other's layout, and backward weights only the reference one writing oihw.
//
// Under [train] precision = bf16 the same reorders also convert the weights to bf16. In a network
// whose activations are bf16 (the builder's act_type: a ResNet's) the input, output and their
// gradients are bf16 already and need no copy; only the images get a bf16 copy (in forward, kept
// for backward weights). Where the activations are f32 the input (in forward) and the output
// gradient (in backward) get bf16 copies, and output and input gradient stay f32. Weight gradients
// are f32 either way.
//
// Backward weights of a strided 3x3 convolution runs in f32, on f32 copies of its input and output
// gradient made just before it: its bf16 kernel is far slower on both oneDNN versions here. AMD
// EPYC, 2 cores, AVX512-BF16, no AMX, 2026-12-06, machine shared (ratios only), batch 512 nhwc,
// ms per step, bf16 against f32: oneDNN 2.6.3, 32->64 at 32x32 1290 vs 96, 64->128 at 16x16 1659
// vs 70; oneDNN 3.7.2, 917 vs 78 and 464 vs 67; the copies cost 20-40 ms a step together. A
// strided 1x1 (the projection) runs in bf16: 2.6.3 11.8 and 11.9 vs 11.7 and 9.0 in f32 plus the
// copies, 3.7.2 5.8 and 6.7 vs 16.0 and 12.4. (Earlier, on an Intel Xeon with AMX, 2.6 at 3x3
// stride 2: 32->64 246 vs 108, 64->128 2397 vs 90; blocked activations no better.) At stride 1
// bf16 is 1.6-2.6x faster (32->32 at 32x32: 190 vs 489). The passes, the copies and the gradient's
// way into the parameter set are those of every weighted op (ops/weighted.h).

// Whether to ask oneDNN for Winograd F(4x4, 3x3) (3x3, stride 1, pad 1, f32 — it has no bf16
// one — on blocked activations; with nhwc it has none). Auto takes it where both channel counts
// are 32 or more. Measured on an Intel Xeon with AVX-512 and AMX, 2026-12-05 (2 threads, one
// primitive at a time, best of 5, ms forward / backward data / backward weights, direct vs
// Winograd, nChw16c): 32 channels 1.4-1.8x faster (batch 256, 32->32 at 32x32: 14.2/16.9/18.3 vs
// 10.3/10.5/10.3; at 28x28: 11.3/12.4/12.2 vs 7.3/7.4/7.6; batch 512 at 32x32: 28.2/33.4/36.1 vs
// 21.3/21.2/20.5), 64 and more 1.3-2.6x (batch 64, 128->128 at 32x32: 55/65/65 vs 23/23/24;
// 512->512 at 8x8: 53/54/62 vs 25/24/25); 16 channels slower (batch 512, 16->16 at 28x28:
// 5.7/6.7/6.6 vs 10.9/10.4/5.9; batch 64 at 64x64: 4.2/4.1/4.3 vs 6.1/6.2/3.6). In a whole step
// of inbatch on resnet-small-32 (batch 256), Winograd on the 32-channel stage too took the median
// step from 591 to 526 ms.
static int conv_winograd_wanted(const Conv2d *l, const Builder *b, dnnl_format_tag_t act) {
  if (l->K != 3 || l->stride != 1 || l->pad != 1 || l->groups != 1 || act != dnnl_nChw16c ||
      builder_compute_type(b) != dnnl_f32)
    return 0;
  switch (builder_policy(b).conv_algorithm) {
    case CONV_ALGO_DIRECT:
      return 0;
    case CONV_ALGO_WINOGRAD:
      return 1;
    case CONV_ALGO_AUTO:
      break;
  }
  return l->IC >= 32 && l->OC >= 32;
}

// FLOPs of one pass (forward, backward-data or backward-weights): a multiply-add per output element
// per kernel tap and input channel of its group.
static double conv_pass_flops(const Conv2d *l) {
  return 2.0 * l->N * l->OH * l->OW * (double)l->OC * (l->IC / l->groups) * l->K * l->K;
}

// Weights of one group's output channels over its input channels, all groups: (OC, IC/G, K, K).
static size_t conv_weight_count(const Conv2d *l) {
  return (size_t)l->OC * (l->IC / l->groups) * l->K * l->K;
}

// Bias add forward and bias-gradient reduction backward: one add per output element.
static double conv_bias_flops(const Conv2d *l) {
  return l->has_bias ? (double)l->N * l->OH * l->OW * l->OC : 0.0;
}

static size_t conv_out_bytes(const Conv2d *l, const Builder *b) {
  return (size_t)l->N * l->OH * l->OW * l->OC * builder_act_bytes(b);
}

static void conv_take_params(Conv2d *l, Builder *b, const char *name) {
  const int OC = l->OC, IC = l->IC / l->groups, K = l->K;
  char pname[96];
  snprintf(pname, sizeof pname, "%s.weight", name);
  l->weight = paramset_take(b->params, pname, conv_weight_count(l), 0, &l->dweight);
  paramset_set_shape(b->params, 4, (long[]){OC, IC, K, K});
  paramset_init_normal(b->params, l->weight, conv_weight_count(l),
                       sqrtf(2.0f / (float)(IC * K * K)));
  if (l->has_bias) {
    snprintf(pname, sizeof pname, "%s.bias", name);
    l->bias = paramset_take(b->params, pname, (size_t)OC, 1, &l->dbias);
    paramset_init_const(b->params, l->bias, (size_t)OC, 0.0f);
  }
}

// The builder's layout for activations, except an input whose channels the blocked layout
// cannot hold (the images), which arrives nhwc and which the blocked kernels read as nchw (the
// same bytes for one channel; for three, the input's copy converts it). oneDNN describes tensors in
// NCHW dimension order; the tags give the actual layouts. Each pass chooses its weights' layout.
// Grouped weights are oneDNN's 5-D (G, OC/G, IC/G, K, K), plain goihw: the bytes of PyTorch's
// (OC, IC/G, K, K).
static void conv_describe(const Conv2d *l, const Builder *b, WeightedDescs *d) {
  const dnnl_data_type_t type = builder_compute_type(b), act_type = builder_act_type(b);
  const dnnl_format_tag_t act = builder_layout(b);
  const int image_input = conv_image_input(b, l->IC);
  const dnnl_format_tag_t in_tag = image_input && l->IC == 1 ? dnnl_nchw
                                   : image_input             ? dnnl_nhwc
                                                             : act;
  const dnnl_format_tag_t src_tag = image_input ? dnnl_nchw : act;
  dnnl_dims_t src_dims = {l->N, l->IC, l->IH, l->IW}, dst_dims = {l->N, l->OC, l->OH, l->OW};
  const int G = l->groups, w_nd = G > 1 ? 5 : 4;
  dnnl_dims_t w_dims = {l->OC, l->IC, l->K, l->K}, b_dims = {l->OC};
  if (G > 1) memcpy(w_dims, (dnnl_dims_t){G, l->OC / G, l->IC / G, l->K, l->K}, sizeof w_dims);
  const dnnl_format_tag_t w_tag = G > 1 ? dnnl_goihw : dnnl_oihw;
  d->src_in = dnnl_md_typed(4, src_dims, builder_input_type(b), in_tag);
  d->src = dnnl_md_typed(4, src_dims, type, src_tag);
  d->dst = dnnl_md_typed(4, dst_dims, act_type, act);
  d->diff_dst = dnnl_md_typed(4, dst_dims, type, act);
  d->src_f32 = dnnl_md_plain(4, src_dims, in_tag);
  d->dst_f32 = dnnl_md_plain(4, dst_dims, act);
  d->w_plain = dnnl_md_plain(w_nd, w_dims, w_tag);
  d->w_fwd = d->w_bwd_data = dnnl_md_typed(w_nd, w_dims, type, dnnl_format_tag_any);
  d->dw = dnnl_md_plain(w_nd, w_dims, dnnl_format_tag_any);
  d->bias = l->has_bias ? dnnl_md_plain(1, b_dims, dnnl_a) : NULL;
}

// The passes: Winograd when wanted (and the library has it), a strided layer's backward weights in
// f32 under bf16 (see above).
static WeightedSpec conv_spec(const Conv2d *l, const Builder *b) {
  WeightedSpec s = {
      .conv = 1,
      .alg = conv_winograd_wanted(l, b, builder_layout(b)) ? dnnl_convolution_winograd
                                                           : dnnl_convolution_direct,
      .strides = {l->stride, l->stride},
      .padding = {l->pad, l->pad},
      .need_din = l->need_din,
      .bwd_weights_f32 = conv_bwd_weights_f32(b, l->K, l->stride),
      .pass_flops = conv_pass_flops(l),
      .bias_flops = conv_bias_flops(l),
      .weight_count = conv_weight_count(l),
      .bias_count = l->has_bias ? (size_t)l->OC : 0,
  };
  return s;
}

void conv2d_init(Conv2d *l, Builder *b, const char *name, int N, int IC, int IH, int IW, int OC,
                 int K, int stride, int pad, int has_bias, int need_din) {
  conv2d_init_grouped(l, b, name, N, IC, IH, IW, OC, K, stride, pad, 1, has_bias, need_din);
}

void conv2d_init_grouped(Conv2d *l, Builder *b, const char *name, int N, int IC, int IH, int IW,
                         int OC, int K, int stride, int pad, int groups, int has_bias,
                         int need_din) {
  if (N <= 0 || IC <= 0 || OC <= 0 || K <= 0 || stride <= 0 || pad < 0 || IH + 2 * pad < K ||
      IW + 2 * pad < K || groups <= 0 || IC % groups || OC % groups)
    TL_DIE("conv %s: invalid shape N=%d IC=%d IH=%d IW=%d OC=%d K=%d stride=%d pad=%d groups=%d",
           name, N, IC, IH, IW, OC, K, stride, pad, groups);
  memset(l, 0, sizeof *l);
  l->N = N, l->IC = IC, l->IH = IH, l->IW = IW, l->OC = OC, l->K = K, l->groups = groups;
  l->OH = (IH + 2 * pad - K) / stride + 1;
  l->OW = (IW + 2 * pad - K) / stride + 1;
  l->stride = stride, l->pad = pad, l->has_bias = has_bias;
  l->mode = b->mode;
  l->comp = b->component;
  op_calls_init(&l->calls, b);
  // Backward data is only needed in training, and not for the first layer.
  l->need_din = need_din && b->mode == OP_TRAIN;
  conv_take_params(l, b, name);
  WeightedDescs d = {0};
  conv_describe(l, b, &d);
  const WeightedSpec spec = conv_spec(l, b);
  l->passes =
      weighted_create(b, &spec, &d, &(WeightedOp)WEIGHTED_OP(l, "conv", conv_out_bytes(l, b)));
  weighted_descs_destroy(&d);
  l->winograd = weighted_winograd(l->passes, WEIGHTED_FWD);
  TL_ASSERT(conv2d_backward_reads_input(l) == conv2d_will_read_input(b, l->IC, l->K, l->stride));
}

void conv2d_forward(Conv2d *l, ExecCtx *ctx, const float *in) {
  weighted_forward(l->passes, ctx, in);
}

void conv2d_backward(Conv2d *l, ExecCtx *ctx, const float *dout) {
  weighted_backward(l->passes, ctx, dout);
}

ConvAlgorithm conv_algorithm_parse(const char *text) {
  return strcmp(text, "direct") == 0     ? CONV_ALGO_DIRECT
         : strcmp(text, "winograd") == 0 ? CONV_ALGO_WINOGRAD
                                         : CONV_ALGO_AUTO;
}

int conv2d_backward_reads_input(const Conv2d *l) { return weighted_reads_input(l->passes); }

void conv2d_destroy(Conv2d *l) {
  weighted_destroy(l->passes);
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
