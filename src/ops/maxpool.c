#include "ops/maxpool.h"

#include <stdlib.h>
#include <string.h>

struct MaxPoolPrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_pd;
  dnnl_primitive_t fwd, bwd;
  dnnl_memory_t src, dst, workspace;  // backward: diff_src, diff_dst, the call's workspace
};

// K*K - 1 comparisons per output element forward; backward one add per output element.
static double maxpool_forward_flops(const MaxPool *l) {
  return (double)l->N * l->OH * l->OW * l->C * (l->K * l->K - 1);
}
static double maxpool_backward_flops(const MaxPool *l) {
  return (double)l->N * l->OH * l->OW * l->C;
}

static size_t out_bytes(const MaxPool *l) {
  return l->act_bytes * (size_t)l->N * l->OH * l->OW * l->C;
}

void maxpool_init(MaxPool *l, Builder *b, int N, int H, int W, int C, int K, int S, int P,
                  int need_din) {
  if (N <= 0 || H <= 0 || W <= 0 || C <= 0 || K <= 0 || S <= 0 || P < 0 || P >= K)
    TL_DIE("max pool: invalid shape N=%d H=%d W=%d C=%d kernel %d stride %d padding %d", N, H, W, C,
           K, S, P);
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->N = N, l->H = H, l->W = W, l->C = C, l->K = K, l->S = S, l->P = P;
  l->OH = (H + 2 * P - K) / S + 1;
  l->OW = (W + 2 * P - K) / S + 1;
  l->need_din = need_din && b->mode == OP_TRAIN;
  l->mode = b->mode;
  l->comp = b->component;
  // Pooling reads and writes the network's activation type (bf16 or f32), its gradients too.
  l->act_bytes = builder_act_bytes(b);
  op_calls_init(&l->calls, b);

  struct MaxPoolPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  dnnl_dims_t src_dims = {N, C, H, W}, dst_dims = {N, C, l->OH, l->OW};
  dnnl_dims_t kernel = {K, K}, strides = {S, S}, padding = {P, P};
  DnnlMd src_md = dnnl_md_typed(4, src_dims, builder_act_type(b), builder_layout(b));
  DnnlMd dst_md = dnnl_md_typed(4, dst_dims, builder_act_type(b), builder_layout(b));
  // Training keeps the workspace backward needs; a forward without backward asks for none.
  const int train = b->mode == OP_TRAIN;
  p->fwd_pd = dnnl_pd_pooling_forward(ctx, train ? dnnl_forward_training : dnnl_forward_inference,
                                      dnnl_pooling_max, src_md, dst_md, strides, kernel, padding);
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  p->src = dnnl_mem_new(ctx, src_md);
  p->dst = dnnl_mem_new(ctx, dst_md);
  op_out_alloc(b, &l->calls, &l->out_slots, out_bytes(l), l->comp);
  l->out = l->out_slots;
  if (train) {
    DnnlMd ws_md = dnnl_pd_md(p->fwd_pd, dnnl_query_workspace_md, 0);
    l->workspace_bytes = dnnl_md_bytes(ws_md);
    p->workspace = dnnl_mem_new(ctx, ws_md);
    dnnl_md_destroy(ws_md);
    l->workspace_slots = op_calls_alloc(&l->calls, l->workspace_bytes, MEM_ACT, l->comp);
  }
  if (l->need_din) {
    p->bwd_pd = dnnl_pd_pooling_backward(ctx, dnnl_pooling_max, src_md, dst_md, strides, kernel,
                                         padding, p->fwd_pd);
    p->bwd = dnnl_ctx_adopt(ctx, p->bwd_pd);
    op_din_alloc(b, &l->calls, &l->din, l->act_bytes * (size_t)N * H * W * C, l->comp);
  }
  dnnl_md_destroy(src_md);
  dnnl_md_destroy(dst_md);
}

void maxpool_forward(MaxPool *l, ExecCtx *ctx, const float *in) {
  struct MaxPoolPrivate *p = l->priv;
  int call = op_calls_forward(&l->calls, "max pool");
  l->calls.in[call] = in;
  l->out = op_out_slot(&l->calls, l->out_slots, out_bytes(l), call);
  dnnl_mem_bind(p->src, in);
  dnnl_mem_bind(p->dst, l->out);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_DST, p->dst}};
  int n_args = 2;
  if (p->workspace) {
    dnnl_mem_bind(p->workspace, op_slot(l->workspace_slots, l->workspace_bytes, call));
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_WORKSPACE, p->workspace};
  }
  dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, n_args, args);
  ctx->flops_forward[l->comp] += maxpool_forward_flops(l);
}

// A no-op without din: pooling has no parameters.
void maxpool_backward(MaxPool *l, ExecCtx *ctx, const float *dout) {
  struct MaxPoolPrivate *p = l->priv;
  if (!l->need_din) return;
  int call = op_calls_backward(&l->calls, "max pool");
  l->out = op_out_slot(&l->calls, l->out_slots, out_bytes(l), call);
  dnnl_mem_bind(p->dst, dout);
  dnnl_mem_bind(p->src, l->din);
  dnnl_mem_bind(p->workspace, op_slot(l->workspace_slots, l->workspace_bytes, call));
  dnnl_exec_arg_t args[] = {
      {DNNL_ARG_DIFF_DST, p->dst}, {DNNL_ARG_DIFF_SRC, p->src}, {DNNL_ARG_WORKSPACE, p->workspace}};
  dnnl_ctx_exec(ctx, p->bwd, p->bwd_pd, 3, args);
  ctx->flops_backward[l->comp] += maxpool_backward_flops(l);
}

void maxpool_destroy(MaxPool *l) {
  struct MaxPoolPrivate *p = l->priv;
  if (p) {
    dnnl_prim_destroy(p->fwd, p->fwd_pd);
    dnnl_prim_destroy(p->bwd, p->bwd_pd);
    dnnl_memory_destroy(p->src);
    dnnl_memory_destroy(p->dst);
    if (p->workspace) dnnl_memory_destroy(p->workspace);
    free(p);
  }
  tl_free(l->workspace_slots);
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
