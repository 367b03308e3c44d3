#include "ops/pool.h"

#include <stdlib.h>
#include <string.h>

struct PoolPrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_pd;
  dnnl_primitive_t fwd, bwd;
  dnnl_memory_t src, dst;  // (N, H, W, C) and (N, 1, 1, C) nhwc; backward: diff_src, diff_dst
  // bf16 activations where the library pools them only into bf16: the pooled bf16 (N, C),
  // converted into the f32 output, and the f32 output gradient's bf16 copy for backward.
  DnnlReorder to_out;
  void *pooled;
  DnnlCopy dout;
};

// Forward from `src_md` into f32 when the library has it, else into the activations' type.
static DnnlMd pool_forward_pd(GlobalAvgPool *l, Builder *b, DnnlMd src_md,
                              const dnnl_dims_t dst_dims) {
  struct PoolPrivate *p = l->priv;
  dnnl_dims_t kernel = {l->H, l->W}, strides = {1, 1}, padding = {0, 0};
  const dnnl_prop_kind_t prop = l->need_din ? dnnl_forward_training : dnnl_forward_inference;
  DnnlMd dst_md = dnnl_md_plain(4, dst_dims, builder_layout(b));
  p->fwd_pd = dnnl_pd_pooling_forward(b->ctx, prop, dnnl_pooling_avg_exclude_padding, src_md,
                                      dst_md, strides, kernel, padding);
  if (!p->fwd_pd && builder_act_type(b) != dnnl_f32) {
    dnnl_md_destroy(dst_md);
    dst_md = dnnl_md_typed(4, dst_dims, builder_act_type(b), builder_layout(b));
    p->fwd_pd = dnnl_pd_pooling_forward(b->ctx, prop, dnnl_pooling_avg_exclude_padding, src_md,
                                        dst_md, strides, kernel, padding);
  }
  return dst_md;
}

// One add per input element forward (the division by H*W per output is folded into the count),
// one scaled copy per input element backward.
static double gap_flops(const GlobalAvgPool *l) { return (double)l->N * l->H * l->W * l->C; }

void gap_init(GlobalAvgPool *l, Builder *b, int N, int H, int W, int C, int need_din) {
  if (N <= 0 || H <= 0 || W <= 0 || C <= 0)
    TL_DIE("global average pool: invalid shape N=%d H=%d W=%d C=%d", N, H, W, C);
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->N = N, l->H = H, l->W = W, l->C = C;
  l->need_din = need_din && b->mode == OP_TRAIN;
  l->mode = b->mode;
  l->comp = b->component;
  op_calls_init(&l->calls, b);

  struct PoolPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  // In the blocked layout (N, C, 1, 1) is the plain (N, C) the head reads only when C fills
  // whole blocks.
  if (builder_layout(b) != dnnl_nhwc && C % 16 != 0) TL_DIE("pool: %d channels, blocked", C);
  // The input in the activations' type; the output (the feature the head reads) always f32.
  dnnl_dims_t src_dims = {N, C, H, W}, dst_dims = {N, C, 1, 1};
  dnnl_dims_t kernel = {H, W}, strides = {1, 1}, padding = {0, 0};
  DnnlMd src_md = dnnl_md_typed(4, src_dims, builder_act_type(b), builder_layout(b));
  DnnlMd out_md = dnnl_md_plain(4, dst_dims, builder_layout(b));
  DnnlMd dst_md = pool_forward_pd(l, b, src_md, dst_dims);
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  p->src = dnnl_mem_new(ctx, src_md);
  p->dst = dnnl_mem_new(ctx, dst_md);
  dnnl_reorder_init(&p->to_out, ctx, dst_md, out_md);
  if (dnnl_reorder_needed(&p->to_out))
    p->pooled = tl_alloc(dnnl_md_bytes(dst_md), MEM_WORKSPACE, l->comp);
  op_out_alloc(b, &l->calls, &l->out_slots, (size_t)N * C * sizeof(float), l->comp);
  l->out = l->out_slots;
  if (l->need_din) {
    p->bwd_pd = dnnl_pd_pooling_backward(ctx, dnnl_pooling_avg_exclude_padding, src_md, dst_md,
                                         strides, kernel, padding, p->fwd_pd);
    p->bwd = dnnl_ctx_adopt(ctx, p->bwd_pd);
    dnnl_copy_init(&p->dout, ctx, out_md, dst_md, MEM_WORKSPACE, l->comp);
    op_din_alloc(b, &l->calls, &l->din, dnnl_md_bytes(src_md), l->comp);
  }
  dnnl_md_destroy(src_md);
  dnnl_md_destroy(dst_md);
  dnnl_md_destroy(out_md);
}

void gap_forward(GlobalAvgPool *l, ExecCtx *ctx, const float *in) {
  struct PoolPrivate *p = l->priv;
  int call = op_calls_forward(&l->calls, "pool");
  l->out = op_out_slot(&l->calls, l->out_slots, (size_t)l->N * l->C * sizeof(float), call);
  dnnl_mem_bind(p->src, in);
  dnnl_mem_bind(p->dst, p->pooled ? p->pooled : l->out);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_DST, p->dst}};
  dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, 2, args);
  if (p->pooled) dnnl_reorder_run(&p->to_out, ctx, p->pooled, l->out);
  ctx->flops_forward[l->comp] += gap_flops(l);
}

// The average's gradient does not depend on the input, so none is remembered. A no-op without din.
void gap_backward(GlobalAvgPool *l, ExecCtx *ctx, const float *dout) {
  struct PoolPrivate *p = l->priv;
  if (!l->need_din) return;
  int call = op_calls_backward(&l->calls, "pool");
  l->out = op_out_slot(&l->calls, l->out_slots, (size_t)l->N * l->C * sizeof(float), call);
  dnnl_mem_bind(p->dst, dnnl_copy_run(&p->dout, ctx, dout));
  dnnl_mem_bind(p->src, l->din);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, p->dst}, {DNNL_ARG_DIFF_SRC, p->src}};
  dnnl_ctx_exec(ctx, p->bwd, p->bwd_pd, 2, args);
  ctx->flops_backward[l->comp] += gap_flops(l);
}

void gap_destroy(GlobalAvgPool *l) {
  struct PoolPrivate *p = l->priv;
  if (p) {
    dnnl_prim_destroy(p->fwd, p->fwd_pd);
    dnnl_prim_destroy(p->bwd, p->bwd_pd);
    dnnl_memory_destroy(p->src);
    dnnl_memory_destroy(p->dst);
    dnnl_reorder_destroy(&p->to_out);
    tl_free(p->pooled);
    dnnl_copy_destroy(&p->dout);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
