#include "ops/eltwise.h"

#include <stdlib.h>
#include <string.h>

// Analytic FLOPs per element. ReLU: one comparison forward, one select backward. GELU (erf form)
// x/2 (1 + erf(x/sqrt 2)): erf by a rational/polynomial approximation is about 14 operations,
// plus 4 around it = 18 forward; backward recomputes erf (14), the Gaussian density exp(-x^2/2)
// (about 10 with its argument) and combines them with dout (4) = 28.
static const double ELTWISE_FWD_FLOPS_PER_ELEM[] = {[ELTWISE_RELU] = 1, [ELTWISE_GELU] = 18};
static const double ELTWISE_BWD_FLOPS_PER_ELEM[] = {[ELTWISE_RELU] = 1, [ELTWISE_GELU] = 28};

struct EltwisePrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_pd;
  dnnl_primitive_t fwd, bwd;
  // (n) each; backward reads the forward output (ReLU) or input (GELU) again.
  dnnl_memory_t src, dst, diff_dst, diff_src;
};

void eltwise_init(Eltwise *l, Builder *b, EltwiseKind kind, size_t n, int need_din) {
  if (n == 0) TL_DIE("eltwise: empty tensor");
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->kind = kind;
  l->n = n;
  l->bytes = n * builder_act_bytes(b);
  l->need_din = need_din && b->mode == OP_TRAIN;
  l->mode = b->mode;
  l->comp = b->component;
  op_calls_init(&l->calls, b);

  struct EltwisePrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;

  // ReLU's gradient is recoverable from its output (dst > 0), which is kept for the next layer
  // anyway, so the input need not be; GELU's needs the input.
  dnnl_alg_kind_t alg =
      kind == ELTWISE_RELU ? dnnl_eltwise_relu_use_dst_for_bwd : dnnl_eltwise_gelu_erf;
  dnnl_dims_t dims = {(dnnl_dim_t)n};
  DnnlMd md = dnnl_md_typed(1, dims, builder_act_type(b), dnnl_a);
  p->fwd_pd = dnnl_pd_eltwise_forward(
      ctx, l->need_din ? dnnl_forward_training : dnnl_forward_inference, alg, md);
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  p->src = dnnl_mem_new(ctx, md);
  p->dst = dnnl_mem_new(ctx, md);
  op_out_alloc(b, &l->calls, &l->out_slots, l->bytes, l->comp);
  l->out = l->out_slots;
  if (l->need_din) {
    p->bwd_pd = dnnl_pd_eltwise_backward(ctx, alg, md, p->fwd_pd);
    p->bwd = dnnl_ctx_adopt(ctx, p->bwd_pd);
    p->diff_dst = dnnl_mem_new(ctx, md);
    p->diff_src = dnnl_mem_new(ctx, md);
    op_din_alloc(b, &l->calls, &l->din, l->bytes, l->comp);
  }
  dnnl_md_destroy(md);
}

static void eltwise_run_forward(Eltwise *l, ExecCtx *ctx, int call) {
  struct EltwisePrivate *p = l->priv;
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, l->bytes, call);
  dnnl_mem_bind(p->src, l->in);
  dnnl_mem_bind(p->dst, l->out);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_DST, p->dst}};
  dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, 2, args);
}

void eltwise_forward(Eltwise *l, ExecCtx *ctx, const float *in) {
  int call = op_calls_forward(&l->calls, "eltwise");
  l->calls.in[call] = in;
  eltwise_run_forward(l, ctx, call);
  ctx->flops_forward[l->comp] += ELTWISE_FWD_FLOPS_PER_ELEM[l->kind] * (double)l->n;
}

void eltwise_recompute(Eltwise *l, ExecCtx *ctx) {
  if (l->mode != OP_TRAIN) TL_DIE("eltwise_recompute on an op built without backward");
  eltwise_run_forward(l, ctx, op_calls_next_backward(&l->calls, "eltwise"));
  ctx->flops_backward[l->comp] += ELTWISE_FWD_FLOPS_PER_ELEM[l->kind] * (double)l->n;
}

// A no-op without din: an activation has no parameters, so there is nothing else to compute.
void eltwise_backward(Eltwise *l, ExecCtx *ctx, const float *dout) {
  struct EltwisePrivate *p = l->priv;
  if (!l->need_din) return;
  int call = op_calls_backward(&l->calls, "eltwise");
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, l->bytes, call);
  TL_ASSERT(l->in);
  dnnl_mem_bind(p->diff_dst, dout);
  dnnl_mem_bind(p->diff_src, l->din);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_DIFF_DST, p->diff_dst}, {DNNL_ARG_DIFF_SRC, p->diff_src}};
  if (l->kind == ELTWISE_RELU) {
    dnnl_mem_bind(p->dst, l->out);
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, p->dst};
  } else {
    dnnl_mem_bind(p->src, l->in);
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_SRC, p->src};
  }
  dnnl_ctx_exec(ctx, p->bwd, p->bwd_pd, 3, args);
  ctx->flops_backward[l->comp] += ELTWISE_BWD_FLOPS_PER_ELEM[l->kind] * (double)l->n;
}

void eltwise_destroy(Eltwise *l) {
  struct EltwisePrivate *p = l->priv;
  if (p) {
    if (p->fwd) dnnl_primitive_destroy(p->fwd);
    if (p->fwd_pd) dnnl_primitive_desc_destroy(p->fwd_pd);
    if (p->bwd) dnnl_primitive_destroy(p->bwd);
    if (p->bwd_pd) dnnl_primitive_desc_destroy(p->bwd_pd);
    dnnl_memory_t mems[] = {p->src, p->dst, p->diff_dst, p->diff_src};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
