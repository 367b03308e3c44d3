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
// Under [train] precision = bf16 the same reorders also convert the weights to bf16, and the input
// (in forward) and the output gradient (in backward) get bf16 copies of their own; outputs, input
// gradients and weight gradients stay f32, so the ops around a convolution never see bf16.
// Backward weights of a strided convolution stays f32, on the f32 input and output gradient:
// oneDNN 2.6's bf16 kernel for it is far slower than its f32 one here (batch 512, nhwc, ms per
// step: 3x3 stride 2 32->64 246 vs 108, 64->128 2397 vs 90; blocked activations no better),
// while at stride 1 bf16 is 1.6-2.6x faster (32->32 at 32x32: 190 vs 489).
struct ConvPrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_data_pd, bwd_weights_pd;
  dnnl_primitive_t fwd, bwd_data, bwd_weights;
  // Activations are in the builder's layout for every primitive (a network's own: nhwc, or the
  // blocked nChw16c Winograd needs, where direct runs as fast as on nhwc); the pointer is bound
  // per call.
  dnnl_memory_t src, diff_src, dst, diff_dst, bias;  // src, diff_dst in the compute type
  dnnl_memory_t wei_fwd, wei_bwd_data, dwei;
  dnnl_memory_t bw_src, bw_diff_dst;  // backward weights' operands, f32 when bwd_weights_f32
  int bwd_weights_f32;                // bf16 elsewhere, but backward weights in f32 (strided)
  DnnlCopy in;                        // the input in the compute type, kept for backward weights
  DnnlCopy dout;               // the output gradient in the compute type, for both backward passes
  DnnlCopy fwd_w, bwd_data_w;  // oihw f32 -> each primitive's layout and type
  DnnlReorder dw_to_plain;     // backward weights' layout -> oihw (no-op when equal)
  float *dw_buf;               // the gradient in the primitive's layout, when that is not oihw
  int bwd_data_shares_fwd_w;   // backward-data layout equals forward's: reuse its reordered copy
  const ParamSet *params;      // told when dweight and dbias are ready
  int winograd[3];             // per pass (ConvPass): run by oneDNN's Winograd kernel
};

typedef enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_WEIGHTS } ConvPass;

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
  if (l->K != 3 || l->stride != 1 || l->pad != 1 || act != dnnl_nChw16c ||
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
// per kernel tap and input channel.
static double conv_pass_flops(const Conv2d *l) {
  return 2.0 * l->N * l->OH * l->OW * (double)l->OC * l->IC * l->K * l->K;
}

// Adds a pass's FLOPs to the Winograd share when that pass ran Winograd.
static void conv_count_winograd(const Conv2d *l, DnnlCtx *ctx, ConvPass pass) {
  if (l->priv->winograd[pass]) ctx->flops_winograd += conv_pass_flops(l);
}

// Bias add forward and bias-gradient reduction backward: one add per output element.
static double conv_bias_flops(const Conv2d *l) {
  return l->has_bias ? (double)l->N * l->OH * l->OW * l->OC : 0.0;
}

static size_t conv_out_bytes(const Conv2d *l) {
  return (size_t)l->N * l->OH * l->OW * l->OC * sizeof(float);
}

// A layer's memory descriptors, shared by the primitives conv2d_init creates and destroyed once
// they are. oneDNN describes tensors in NCHW dimension order; the tags give the actual layouts.
typedef struct {
  DnnlMd src_f32, src_md, dst_md, diff_dst_md, w_plain, w_any, dw_any, b_md, w_fwd_md;
  DnnlMd b_md_or_null;  // b_md, or NULL without a bias
  dnnl_dims_t strides, padding;
  dnnl_alg_kind_t alg;  // the forward's algorithm, after any fallback to direct
} ConvDescs;

static void conv_take_params(Conv2d *l, Builder *b, const char *name) {
  const int OC = l->OC, IC = l->IC, K = l->K;
  char pname[96];
  snprintf(pname, sizeof pname, "%s.weight", name);
  l->weight = paramset_take(b->params, pname, (size_t)OC * IC * K * K, 0, &l->dweight);
  paramset_set_shape(b->params, 4, (long[]){OC, IC, K, K});
  paramset_init_normal(b->params, l->weight, (size_t)OC * IC * K * K,
                       sqrtf(2.0f / (float)(IC * K * K)));
  if (l->has_bias) {
    snprintf(pname, sizeof pname, "%s.bias", name);
    l->bias = paramset_take(b->params, pname, (size_t)OC, 1, &l->dbias);
    paramset_init_const(b->params, l->bias, (size_t)OC, 0.0f);
  }
}

// The builder's layout for activations, except an input whose channels the blocked layout
// cannot hold (the images), which arrives nhwc and which the blocked kernels read as nchw (the
// same bytes for one channel; for three, the input's copy converts it).
static void conv_describe(const Conv2d *l, Builder *b, ConvDescs *d) {
  dnnl_data_type_t type = builder_compute_type(b);
  const dnnl_format_tag_t act = builder_layout(b);
  const int image_input = conv_image_input(b, l->IC);
  const dnnl_format_tag_t in_tag = image_input && l->IC == 1 ? dnnl_nchw
                                   : image_input             ? dnnl_nhwc
                                                             : act;
  const dnnl_format_tag_t src_tag = image_input ? dnnl_nchw : act;
  dnnl_dims_t src_dims = {l->N, l->IC, l->IH, l->IW}, dst_dims = {l->N, l->OC, l->OH, l->OW};
  dnnl_dims_t w_dims = {l->OC, l->IC, l->K, l->K}, b_dims = {l->OC};
  d->strides[0] = d->strides[1] = l->stride;
  d->padding[0] = d->padding[1] = l->pad;
  d->src_f32 = dnnl_md_plain(4, src_dims, in_tag);
  d->src_md = dnnl_md_typed(4, src_dims, type, src_tag);
  d->dst_md = dnnl_md_plain(4, dst_dims, act);
  d->diff_dst_md = dnnl_md_typed(4, dst_dims, type, act);
  d->w_plain = dnnl_md_plain(4, w_dims, dnnl_oihw);
  d->w_any = dnnl_md_typed(4, w_dims, type, dnnl_format_tag_any);
  d->dw_any = dnnl_md_plain(4, w_dims, dnnl_format_tag_any);
  d->b_md = dnnl_md_plain(1, b_dims, dnnl_a);
  d->b_md_or_null = l->has_bias ? d->b_md : NULL;
  d->w_fwd_md = NULL;  // the forward primitive's choice, once it is made
  d->alg = conv_winograd_wanted(l, b, act) ? dnnl_convolution_winograd : dnnl_convolution_direct;
}

// The forward primitive (Winograd when wanted and this library has it, else direct), its weights'
// copy into the primitive's layout, the input's copy and the memories it runs on.
static void conv_make_forward(Conv2d *l, Builder *b, ConvDescs *d) {
  DnnlCtx *ctx = b->ctx;
  struct ConvPrivate *p = l->priv;
  const dnnl_prop_kind_t prop =
      b->mode == OP_TRAIN ? dnnl_forward_training : dnnl_forward_inference;
  p->fwd_pd = dnnl_pd_conv_forward(ctx, prop, d->alg, d->src_md, d->w_any, d->b_md_or_null,
                                   d->dst_md, d->strides, d->padding);
  if (!p->fwd_pd && d->alg == dnnl_convolution_winograd) {
    // This library or CPU has no Winograd kernel (oneDNN 3.2 removed them): direct, as asked
    // for where Winograd is not.
    d->alg = dnnl_convolution_direct;
    p->fwd_pd = dnnl_pd_conv_forward(ctx, prop, d->alg, d->src_md, d->w_any, d->b_md_or_null,
                                     d->dst_md, d->strides, d->padding);
  }
  l->winograd = p->winograd[CONV_FWD] = d->alg == dnnl_convolution_winograd;
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  d->w_fwd_md = dnnl_pd_md(p->fwd_pd, dnnl_query_weights_md, 0);
  dnnl_copy_init(&p->fwd_w, ctx, d->w_plain, d->w_fwd_md, MEM_WORKSPACE, l->comp);
  p->bwd_weights_f32 = builder_compute_type(b) != dnnl_f32 && l->stride > 1;
  MemCategory in_category = b->mode == OP_TRAIN && !p->bwd_weights_f32 ? MEM_ACT : MEM_WORKSPACE;
  dnnl_copy_init_slots(&p->in, ctx, d->src_f32, d->src_md, in_category, l->comp, l->calls.count);
  TL_ASSERT(conv2d_backward_reads_input(l) == conv2d_will_read_input(b, l->IC, l->stride));
  p->src = dnnl_mem_new(ctx, d->src_md);
  p->dst = dnnl_mem_new(ctx, d->dst_md);
  p->wei_fwd = dnnl_mem_new(ctx, d->w_fwd_md);
  if (l->has_bias) p->bias = dnnl_mem_new(ctx, d->b_md);
}

// Backward data, in the forward's algorithm when the library has it, else direct.
static void conv_make_backward_data(Conv2d *l, Builder *b, const ConvDescs *d) {
  DnnlCtx *ctx = b->ctx;
  struct ConvPrivate *p = l->priv;
  p->bwd_data_pd = dnnl_pd_conv_backward_data(ctx, d->alg, d->src_f32, d->w_any, d->diff_dst_md,
                                              d->strides, d->padding, p->fwd_pd);
  p->winograd[CONV_BWD_DATA] = p->bwd_data_pd && d->alg == dnnl_convolution_winograd;
  if (!p->bwd_data_pd && d->alg != dnnl_convolution_direct)
    p->bwd_data_pd = dnnl_pd_conv_backward_data(ctx, dnnl_convolution_direct, d->src_f32, d->w_any,
                                                d->diff_dst_md, d->strides, d->padding, p->fwd_pd);
  p->bwd_data = dnnl_ctx_adopt(ctx, p->bwd_data_pd);
  DnnlMd w_bd_md = dnnl_pd_md(p->bwd_data_pd, dnnl_query_weights_md, 0);
  p->bwd_data_shares_fwd_w = dnnl_md_equal(w_bd_md, d->w_fwd_md);
  if (!p->bwd_data_shares_fwd_w)
    dnnl_copy_init(&p->bwd_data_w, ctx, d->w_plain, w_bd_md, MEM_WORKSPACE, l->comp);
  p->wei_bwd_data = dnnl_mem_new(ctx, w_bd_md);
  dnnl_md_destroy(w_bd_md);
  p->diff_src = dnnl_mem_new(ctx, d->src_f32);
  op_din_alloc(b, &l->calls, &l->din, (size_t)l->N * l->IH * l->IW * l->IC * sizeof(float),
               l->comp);
}

// Backward weights (f32 for a strided bf16 layer), in the forward's algorithm when the library
// has it, else direct, and the reorder of its gradient into the plain one.
static void conv_make_backward_weights(Conv2d *l, Builder *b, const ConvDescs *d) {
  DnnlCtx *ctx = b->ctx;
  struct ConvPrivate *p = l->priv;
  DnnlMd bw_src_md = p->bwd_weights_f32 ? d->src_f32 : d->src_md;
  DnnlMd bw_diff_dst_md = p->bwd_weights_f32 ? d->dst_md : d->diff_dst_md;
  p->bwd_weights_pd =
      dnnl_pd_conv_backward_weights(ctx, d->alg, bw_src_md, d->dw_any, d->b_md_or_null,
                                    bw_diff_dst_md, d->strides, d->padding, p->fwd_pd);
  p->winograd[CONV_BWD_WEIGHTS] = p->bwd_weights_pd && d->alg == dnnl_convolution_winograd;
  if (!p->bwd_weights_pd && d->alg != dnnl_convolution_direct)
    p->bwd_weights_pd = dnnl_pd_conv_backward_weights(ctx, dnnl_convolution_direct, bw_src_md,
                                                      d->dw_any, d->b_md_or_null, bw_diff_dst_md,
                                                      d->strides, d->padding, p->fwd_pd);
  p->bwd_weights = dnnl_ctx_adopt(ctx, p->bwd_weights_pd);
  DnnlMd dw_md = dnnl_pd_md(p->bwd_weights_pd, dnnl_query_diff_weights_md, 0);
  dnnl_reorder_init(&p->dw_to_plain, ctx, dw_md, d->w_plain);
  if (dnnl_reorder_needed(&p->dw_to_plain))
    p->dw_buf = tl_alloc(dnnl_md_bytes(dw_md), MEM_WORKSPACE, l->comp);
  p->dwei = dnnl_mem_new(ctx, dw_md);
  dnnl_md_destroy(dw_md);
  p->bw_src = dnnl_mem_new(ctx, bw_src_md);
  p->bw_diff_dst = dnnl_mem_new(ctx, bw_diff_dst_md);
}

void conv2d_init(Conv2d *l, Builder *b, const char *name, int N, int IC, int IH, int IW, int OC,
                 int K, int stride, int pad, int has_bias, int need_din) {
  if (N <= 0 || IC <= 0 || OC <= 0 || K <= 0 || stride <= 0 || pad < 0 || IH + 2 * pad < K ||
      IW + 2 * pad < K)
    TL_DIE("conv %s: invalid shape N=%d IC=%d IH=%d IW=%d OC=%d K=%d stride=%d pad=%d", name, N, IC,
           IH, IW, OC, K, stride, pad);
  DnnlCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->N = N, l->IC = IC, l->IH = IH, l->IW = IW, l->OC = OC, l->K = K;
  l->OH = (IH + 2 * pad - K) / stride + 1;
  l->OW = (IW + 2 * pad - K) / stride + 1;
  l->stride = stride, l->pad = pad, l->has_bias = has_bias;
  l->mode = b->mode;
  l->comp = b->component;
  op_calls_init(&l->calls, b);
  // Backward data is only needed in training, and not for the first layer.
  l->need_din = need_din && b->mode == OP_TRAIN;
  conv_take_params(l, b, name);

  struct ConvPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  p->params = b->params;
  ConvDescs d;
  conv_describe(l, b, &d);
  conv_make_forward(l, b, &d);

  op_out_alloc(b, &l->calls, &l->out_slots, conv_out_bytes(l), l->comp);
  l->out = l->out_slots;
  if (b->mode == OP_TRAIN) {
    op_grads_expect(b, &l->calls, l->dweight, (size_t)OC * IC * K * K, has_bias ? l->dbias : NULL,
                    (size_t)OC);
    // Read in its own type only by backward data, or by a bf16 backward weights.
    if (l->need_din || !p->bwd_weights_f32)
      dnnl_copy_init(&p->dout, ctx, d.dst_md, d.diff_dst_md, MEM_ACT_GRAD, l->comp);
    p->diff_dst = dnnl_mem_new(ctx, d.diff_dst_md);
    if (l->need_din) conv_make_backward_data(l, b, &d);
    conv_make_backward_weights(l, b, &d);
  }
  DnnlMd mds[] = {d.src_f32, d.src_md, d.dst_md, d.diff_dst_md, d.w_plain,
                  d.w_any,   d.dw_any, d.b_md,   d.w_fwd_md};
  for (size_t i = 0; i < sizeof mds / sizeof mds[0]; i++) dnnl_md_destroy(mds[i]);
}

void conv2d_forward(Conv2d *l, DnnlCtx *ctx, const float *in) {
  struct ConvPrivate *p = l->priv;
  int call = op_calls_forward(&l->calls, "conv");
  l->calls.in[call] = l->in = in;
  l->out = op_out_slot(&l->calls, l->out_slots, conv_out_bytes(l), call);
  dnnl_mem_bind(p->src, dnnl_copy_run_at(&p->in, ctx, in, call));
  dnnl_mem_bind(p->wei_fwd, dnnl_copy_run(&p->fwd_w, ctx, l->weight));
  dnnl_mem_bind(p->dst, l->out);
  dnnl_exec_arg_t args[4] = {
      {DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, p->wei_fwd}, {DNNL_ARG_DST, p->dst}};
  int nargs = 3;
  if (l->has_bias) {
    dnnl_mem_bind(p->bias, l->bias);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, p->bias};
  }
  dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, nargs, args);
  ctx->flops_forward[l->comp] += conv_pass_flops(l) + conv_bias_flops(l);
  conv_count_winograd(l, ctx, CONV_FWD);
}

void conv2d_backward(Conv2d *l, DnnlCtx *ctx, const float *dout) {
  struct ConvPrivate *p = l->priv;
  TL_ASSERT(l->mode == OP_TRAIN);
  int call = op_calls_backward(&l->calls, "conv");
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, conv_out_bytes(l), call);
  TL_ASSERT(l->in);
  dnnl_mem_bind(p->diff_dst, dnnl_copy_run(&p->dout, ctx, dout));

  if (l->need_din) {
    // Weights have not changed since forward (the optimizer steps after backward), so the
    // forward's reordered copy is still valid when the layouts agree.
    const void *w = p->bwd_data_shares_fwd_w ? dnnl_copy_last(&p->fwd_w, l->weight)
                                             : dnnl_copy_run(&p->bwd_data_w, ctx, l->weight);
    dnnl_mem_bind(p->wei_bwd_data, w);
    dnnl_mem_bind(p->diff_src, l->din);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, p->diff_dst},
                              {DNNL_ARG_WEIGHTS, p->wei_bwd_data},
                              {DNNL_ARG_DIFF_SRC, p->diff_src}};
    dnnl_ctx_exec(ctx, p->bwd_data, p->bwd_data_pd, 3, args);
    ctx->flops_backward[l->comp] += conv_pass_flops(l);
    conv_count_winograd(l, ctx, CONV_BWD_DATA);
  }

  // The input's converted copy from forward is still this call's input.
  if (p->bwd_weights_f32) {
    dnnl_mem_bind(p->bw_src, l->in);
    dnnl_mem_bind(p->bw_diff_dst, dout);
  } else {
    dnnl_mem_bind(p->bw_src, dnnl_copy_last_at(&p->in, l->in, call));
    dnnl_mem_bind(p->bw_diff_dst, dnnl_copy_last(&p->dout, dout));
  }
  size_t nw = (size_t)l->OC * l->IC * l->K * l->K;
  OpGrads g =
      op_grads_begin(&l->calls, l->dweight, nw, l->has_bias ? l->dbias : NULL, (size_t)l->OC);
  float *dw = g.target[0], *db = g.target[1];
  dnnl_mem_bind(p->dwei, p->dw_buf ? p->dw_buf : dw);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->bw_src},
                             {DNNL_ARG_DIFF_DST, p->bw_diff_dst},
                             {DNNL_ARG_DIFF_WEIGHTS, p->dwei}};
  int nargs = 3;
  if (l->has_bias) {
    dnnl_mem_bind(p->bias, db);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS, p->bias};
  }
  dnnl_ctx_exec(ctx, p->bwd_weights, p->bwd_weights_pd, nargs, args);
  if (p->dw_buf) dnnl_reorder_run(&p->dw_to_plain, ctx, p->dw_buf, dw);
  op_grads_end(ctx, l->comp, &l->calls, &g);
  ctx->flops_backward[l->comp] += conv_pass_flops(l) + conv_bias_flops(l);
  conv_count_winograd(l, ctx, CONV_BWD_WEIGHTS);
}

ConvAlgorithm conv_algorithm_parse(const char *text) {
  return strcmp(text, "direct") == 0     ? CONV_ALGO_DIRECT
         : strcmp(text, "winograd") == 0 ? CONV_ALGO_WINOGRAD
                                         : CONV_ALGO_AUTO;
}

int conv2d_backward_reads_input(const Conv2d *l) {
  const struct ConvPrivate *p = l->priv;
  return p->bwd_weights_f32 || p->in.buf == NULL;
}

void conv2d_destroy(Conv2d *l) {
  struct ConvPrivate *p = l->priv;
  if (p) {
    dnnl_primitive_t prims[] = {p->fwd, p->bwd_data, p->bwd_weights};
    dnnl_primitive_desc_t pds[] = {p->fwd_pd, p->bwd_data_pd, p->bwd_weights_pd};
    for (int i = 0; i < 3; i++) {
      if (prims[i]) dnnl_primitive_destroy(prims[i]);
      if (pds[i]) dnnl_primitive_desc_destroy(pds[i]);
    }
    dnnl_memory_t mems[] = {p->src,     p->diff_src,     p->dst,  p->diff_dst, p->bias,
                            p->wei_fwd, p->wei_bwd_data, p->dwei, p->bw_src,   p->bw_diff_dst};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    DnnlCopy *copies[] = {&p->in, &p->dout, &p->fwd_w, &p->bwd_data_w};
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) dnnl_copy_destroy(copies[i]);
    dnnl_reorder_destroy(&p->dw_to_plain);
    tl_free(p->dw_buf);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
