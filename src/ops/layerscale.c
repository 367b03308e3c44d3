#include "ops/layerscale.h"

#include <stdlib.h>
#include <string.h>

// Per element, forward: a multiply. Backward: din (multiply), dgamma (multiply, add).
enum { LS_FWD_FLOPS_PER_ELEM = 1, LS_DIN_FLOPS_PER_ELEM = 1, LS_DGAMMA_FLOPS_PER_ELEM = 2 };

struct LayerScalePrivate {
  dnnl_primitive_desc_t mul_pd, prod_pd, sum_pd;
  dnnl_primitive_t mul, prod, sum;  // x * gamma; dout * in; the prod's column sums
  dnnl_memory_t src, gamma, dst;    // mul's (forward, and din = dout * gamma)
  dnnl_memory_t dout, in, prod_dst, sum_src, sum_dst;
  size_t bytes;     // of one output (and the input gradient)
  float *prod_buf;  // (M, C) f32, live over backward only
  int prod_pooled;
};

static size_t ls_data_bytes(const LayerScale *l, const Builder *b) {
  return (size_t)l->M * l->C * builder_act_bytes(b);
}

static void layerscale_make_backward(LayerScale *l, Builder *b, DnnlMd data_md, DnnlMd row_md) {
  ExecCtx *ctx = b->ctx;
  struct LayerScalePrivate *p = l->priv;
  op_grads_expect(b, &l->calls, l->dgamma, (size_t)l->C, NULL, 0);
  dnnl_dims_t dims = {l->M, l->C};
  DnnlMd prod_md = dnnl_md_plain(2, dims, dnnl_ab);
  p->prod_pd = dnnl_pd_binary(ctx, dnnl_binary_mul, data_md, data_md, prod_md);
  p->prod = dnnl_ctx_adopt(ctx, p->prod_pd);
  p->sum_pd = dnnl_pd_reduction(ctx, dnnl_reduction_sum, prod_md, row_md, 0.0f, 0.0f);
  p->sum = dnnl_ctx_adopt(ctx, p->sum_pd);
  p->dout = dnnl_mem_new(ctx, data_md);
  p->in = dnnl_mem_new(ctx, data_md);
  p->prod_dst = dnnl_mem_new(ctx, prod_md);
  p->sum_src = dnnl_mem_new(ctx, prod_md);
  p->sum_dst = dnnl_mem_new(ctx, row_md);
  p->prod_pooled =
      op_inner_alloc(b, PASS_BACKWARD, &p->prod_buf, dnnl_md_bytes(prod_md), MEM_ACT_GRAD, l->comp);
  dnnl_md_destroy(prod_md);
  if (l->need_din) op_din_alloc(b, &l->calls, &l->din, p->bytes, l->comp);
}

void layerscale_init(LayerScale *l, Builder *b, const char *name, int M, int C, float init,
                     int need_din) {
  if (M <= 0 || C <= 0) TL_DIE("layerscale %s: bad shape (%d, %d)", name, M, C);
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->M = M;
  l->C = C;
  l->mode = b->mode;
  l->comp = b->component;
  l->need_din = need_din && b->mode == OP_TRAIN;
  op_calls_init(&l->calls, b);
  l->gamma = paramset_take(b->params, name, (size_t)C, 1, &l->dgamma);
  paramset_set_shape(b->params, 3, (long[]){C, 1, 1});
  paramset_init_const(b->params, l->gamma, (size_t)C, init);

  struct LayerScalePrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  p->bytes = ls_data_bytes(l, b);
  dnnl_dims_t dims = {M, C}, row_dims = {1, C};
  DnnlMd data_md = dnnl_md_typed(2, dims, builder_act_type(b), dnnl_ab);
  DnnlMd row_md = dnnl_md_plain(2, row_dims, dnnl_ab);
  p->mul_pd = dnnl_pd_binary(ctx, dnnl_binary_mul, data_md, row_md, data_md);
  p->mul = dnnl_ctx_adopt(ctx, p->mul_pd);
  p->src = dnnl_mem_new(ctx, data_md);
  p->gamma = dnnl_mem_new(ctx, row_md);
  p->dst = dnnl_mem_new(ctx, data_md);
  op_out_alloc(b, &l->calls, &l->out_slots, p->bytes, l->comp);
  l->out = l->out_slots;
  if (b->mode == OP_TRAIN) layerscale_make_backward(l, b, data_md, row_md);
  dnnl_md_destroy(data_md);
  dnnl_md_destroy(row_md);
}

// dst = src * gamma, per channel.
static void ls_mul(LayerScale *l, ExecCtx *ctx, const void *src, void *dst) {
  struct LayerScalePrivate *p = l->priv;
  dnnl_mem_bind(p->src, src);
  dnnl_mem_bind(p->gamma, l->gamma);
  dnnl_mem_bind(p->dst, dst);
  dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC_0, p->src}, {DNNL_ARG_SRC_1, p->gamma}, {DNNL_ARG_DST, p->dst}};
  dnnl_ctx_exec(ctx, p->mul, p->mul_pd, 3, args);
}

void layerscale_forward(LayerScale *l, ExecCtx *ctx, const float *in) {
  const int call = op_calls_forward(&l->calls, "layerscale");
  l->calls.in[call] = l->in = in;
  l->out = op_out_slot(&l->calls, l->out_slots, l->priv->bytes, call);
  ls_mul(l, ctx, in, l->out);
  ctx->flops_forward[l->comp] += LS_FWD_FLOPS_PER_ELEM * (double)l->M * l->C;
}

void layerscale_backward(LayerScale *l, ExecCtx *ctx, const float *dout) {
  struct LayerScalePrivate *p = l->priv;
  if (l->mode != OP_TRAIN) TL_DIE("layerscale_backward on a layer built without backward");
  const int call = op_calls_backward(&l->calls, "layerscale");
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, p->bytes, call);
  TL_ASSERT(l->in);
  const double n = (double)l->M * l->C;
  OpGrads g = op_grads_begin(&l->calls, l->dgamma, (size_t)l->C, NULL, 0);
  dnnl_mem_bind(p->dout, dout);
  dnnl_mem_bind(p->in, l->in);
  dnnl_mem_bind(p->prod_dst, p->prod_buf);
  dnnl_exec_arg_t prod_args[] = {
      {DNNL_ARG_SRC_0, p->dout}, {DNNL_ARG_SRC_1, p->in}, {DNNL_ARG_DST, p->prod_dst}};
  dnnl_ctx_exec(ctx, p->prod, p->prod_pd, 3, prod_args);
  dnnl_mem_bind(p->sum_src, p->prod_buf);
  dnnl_mem_bind(p->sum_dst, g.target[0]);
  dnnl_exec_arg_t sum_args[] = {{DNNL_ARG_SRC, p->sum_src}, {DNNL_ARG_DST, p->sum_dst}};
  dnnl_ctx_exec(ctx, p->sum, p->sum_pd, 2, sum_args);
  op_grads_end(ctx, l->comp, &l->calls, &g);
  ctx->flops_backward[l->comp] += LS_DGAMMA_FLOPS_PER_ELEM * n;
  if (l->need_din) {
    ls_mul(l, ctx, dout, l->din);
    ctx->flops_backward[l->comp] += LS_DIN_FLOPS_PER_ELEM * n;
  }
}

void layerscale_destroy(LayerScale *l) {
  struct LayerScalePrivate *p = l->priv;
  if (p) {
    dnnl_primitive_t prims[] = {p->mul, p->prod, p->sum};
    dnnl_primitive_desc_t pds[] = {p->mul_pd, p->prod_pd, p->sum_pd};
    for (int i = 0; i < 3; i++) dnnl_prim_destroy(prims[i], pds[i]);
    dnnl_memory_t mems[] = {p->src, p->gamma,    p->dst,     p->dout,
                            p->in,  p->prod_dst, p->sum_src, p->sum_dst};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    op_buffer_free(p->prod_buf, p->prod_pooled);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
