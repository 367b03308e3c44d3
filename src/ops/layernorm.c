#include "ops/layernorm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Per element, forward: mean (1 add), variance ((x - mean)^2 summed: 3), normalize (2), scale and
// shift (2) = 8. Backward: dbeta (1), dgamma (2), dxhat = dy gamma (1), its row sum (1), the row
// sum of dxhat xhat (2), dx = (dxhat - mean1 - xhat mean2) rstd (4) = 11.
enum { LN_FWD_FLOPS_PER_ELEM = 8, LN_BWD_FLOPS_PER_ELEM = 11 };

struct LayerNormPrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_pd;
  dnnl_primitive_t fwd, bwd;
  dnnl_memory_t src, dst, scale, shift, mean, variance;  // forward
  dnnl_memory_t diff_dst, diff_src, diff_scale, diff_shift;
  float *mean_buf, *variance_buf;  // (calls, M) each, OP_TRAIN: the statistics backward reuses
  const ParamSet *params;          // told when dgamma and dbeta are ready
};

double layernorm_flops_forward(int M, int D) { return LN_FWD_FLOPS_PER_ELEM * (double)M * D; }
double layernorm_flops_backward(int M, int D) { return LN_BWD_FLOPS_PER_ELEM * (double)M * D; }

static size_t ln_data_bytes(const LayerNorm *l) { return (size_t)l->M * l->D * l->elem_bytes; }
static size_t ln_stat_bytes(const LayerNorm *l) { return (size_t)l->M * sizeof(float); }

// What training adds: the statistics kept per call, backward and its gradient memories.
static void layernorm_make_backward(LayerNorm *l, Builder *b, DnnlMd data_md, DnnlMd param_md,
                                    DnnlMd stat_md, unsigned flags) {
  ExecCtx *ctx = b->ctx;
  struct LayerNormPrivate *p = l->priv;
  op_grads_expect(b, &l->calls, l->dgamma, (size_t)l->D, l->dbeta, (size_t)l->D);
  p->mean = dnnl_mem_new(ctx, stat_md);
  p->variance = dnnl_mem_new(ctx, stat_md);
  p->mean_buf = op_calls_alloc(&l->calls, ln_stat_bytes(l), MEM_ACT, l->comp);
  p->variance_buf = op_calls_alloc(&l->calls, ln_stat_bytes(l), MEM_ACT, l->comp);
  p->bwd_pd = dnnl_pd_layer_norm_backward(ctx, data_md, stat_md, l->eps, flags, p->fwd_pd);
  p->bwd = dnnl_ctx_adopt(ctx, p->bwd_pd);
  p->diff_dst = dnnl_mem_new(ctx, data_md);
  p->diff_src = dnnl_mem_new(ctx, data_md);
  p->diff_scale = dnnl_mem_new(ctx, param_md);
  p->diff_shift = dnnl_mem_new(ctx, param_md);
  op_din_alloc(b, &l->calls, &l->din, ln_data_bytes(l), l->comp);
}

void layernorm_init(LayerNorm *l, Builder *b, const char *name, int M, int D) {
  if (M <= 0 || D <= 0) TL_DIE("layernorm %s: bad shape (%d, %d)", name, M, D);
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->M = M;
  l->D = D;
  l->elem_bytes = builder_act_bytes(b);
  l->mode = b->mode;
  l->comp = b->component;
  l->eps = 1e-6f;
  op_calls_init(&l->calls, b);

  op_take_scale_shift(b, name, (size_t)D, &l->gamma, &l->dgamma, &l->beta, &l->dbeta);

  struct LayerNormPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  p->params = b->params;
  dnnl_dims_t data_dims = {M, D}, param_dims = {D}, stat_dims = {M};
  DnnlMd data_md = dnnl_md_typed(2, data_dims, builder_act_type(b), dnnl_ab);
  DnnlMd param_md = dnnl_md_plain(1, param_dims, dnnl_a);
  DnnlMd stat_md = dnnl_md_plain(1, stat_dims, dnnl_a);
  // Separate scale and shift (not the older packed dnnl_use_scaleshift), so gamma and beta are
  // two independent slices of the parameter block.
  unsigned flags = dnnl_use_scale | dnnl_use_shift;
  int train = b->mode == OP_TRAIN;

  p->fwd_pd = dnnl_pd_layer_norm_forward(
      ctx, train ? dnnl_forward_training : dnnl_forward_inference, data_md, stat_md, l->eps, flags);
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  p->src = dnnl_mem_new(ctx, data_md);
  p->dst = dnnl_mem_new(ctx, data_md);
  p->scale = dnnl_mem_new(ctx, param_md);
  p->shift = dnnl_mem_new(ctx, param_md);
  op_out_alloc(b, &l->calls, &l->out_slots, ln_data_bytes(l), l->comp);
  l->out = l->out_slots;
  if (train) layernorm_make_backward(l, b, data_md, param_md, stat_md, flags);
  dnnl_md_destroy(data_md);
  dnnl_md_destroy(param_md);
  dnnl_md_destroy(stat_md);
}

static void layernorm_run_forward(LayerNorm *l, ExecCtx *ctx, int call) {
  struct LayerNormPrivate *p = l->priv;
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, ln_data_bytes(l), call);
  dnnl_mem_bind(p->src, l->in);
  dnnl_mem_bind(p->dst, l->out);
  dnnl_mem_bind(p->scale, l->gamma);
  dnnl_mem_bind(p->shift, l->beta);
  dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, p->src},
                             {DNNL_ARG_DST, p->dst},
                             {DNNL_ARG_SCALE, p->scale},
                             {DNNL_ARG_SHIFT, p->shift}};
  int nargs = 4;
  if (l->mode == OP_TRAIN) {
    dnnl_mem_bind(p->mean, op_slot(p->mean_buf, ln_stat_bytes(l), call));
    dnnl_mem_bind(p->variance, op_slot(p->variance_buf, ln_stat_bytes(l), call));
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_MEAN, p->mean};
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_VARIANCE, p->variance};
  }
  dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, nargs, args);
}

void layernorm_forward(LayerNorm *l, ExecCtx *ctx, const float *in) {
  int call = op_calls_forward(&l->calls, "layernorm");
  l->calls.in[call] = in;
  layernorm_run_forward(l, ctx, call);
  ctx->flops_forward[l->comp] += layernorm_flops_forward(l->M, l->D);
}

void layernorm_recompute(LayerNorm *l, ExecCtx *ctx) {
  if (l->mode != OP_TRAIN) TL_DIE("layernorm_recompute on a layer built without backward");
  layernorm_run_forward(l, ctx, op_calls_next_backward(&l->calls, "layernorm"));
  ctx->flops_backward[l->comp] += layernorm_flops_forward(l->M, l->D);
}

void layernorm_backward(LayerNorm *l, ExecCtx *ctx, const float *dout) {
  struct LayerNormPrivate *p = l->priv;
  if (l->mode != OP_TRAIN) TL_DIE("layernorm_backward on a layer built without backward");
  int call = op_calls_backward(&l->calls, "layernorm");
  l->in = l->calls.in[call];
  l->out = op_out_slot(&l->calls, l->out_slots, ln_data_bytes(l), call);
  TL_ASSERT(l->in);
  OpGrads g = op_grads_begin(&l->calls, l->dgamma, (size_t)l->D, l->dbeta, (size_t)l->D);
  float *dgamma = g.target[0], *dbeta = g.target[1];
  dnnl_mem_bind(p->src, l->in);
  dnnl_mem_bind(p->mean, op_slot(p->mean_buf, ln_stat_bytes(l), call));
  dnnl_mem_bind(p->variance, op_slot(p->variance_buf, ln_stat_bytes(l), call));
  dnnl_mem_bind(p->scale, l->gamma);
  // oneDNN 2.6 rejects the backward call without the shift argument when dnnl_use_shift is set,
  // although the gradient does not depend on it.
  dnnl_mem_bind(p->shift, l->beta);
  dnnl_mem_bind(p->diff_dst, dout);
  dnnl_mem_bind(p->diff_src, l->din);
  dnnl_mem_bind(p->diff_scale, dgamma);
  dnnl_mem_bind(p->diff_shift, dbeta);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->src},
                            {DNNL_ARG_MEAN, p->mean},
                            {DNNL_ARG_VARIANCE, p->variance},
                            {DNNL_ARG_SCALE, p->scale},
                            {DNNL_ARG_SHIFT, p->shift},
                            {DNNL_ARG_DIFF_DST, p->diff_dst},
                            {DNNL_ARG_DIFF_SRC, p->diff_src},
                            {DNNL_ARG_DIFF_SCALE, p->diff_scale},
                            {DNNL_ARG_DIFF_SHIFT, p->diff_shift}};
  dnnl_ctx_exec(ctx, p->bwd, p->bwd_pd, (int)(sizeof args / sizeof args[0]), args);
  op_grads_end(ctx, l->comp, &l->calls, &g);
  ctx->flops_backward[l->comp] += layernorm_flops_backward(l->M, l->D);
}

void layernorm_destroy(LayerNorm *l) {
  struct LayerNormPrivate *p = l->priv;
  if (p) {
    if (p->fwd) dnnl_primitive_destroy(p->fwd);
    if (p->fwd_pd) dnnl_primitive_desc_destroy(p->fwd_pd);
    if (p->bwd) dnnl_primitive_destroy(p->bwd);
    if (p->bwd_pd) dnnl_primitive_desc_destroy(p->bwd_pd);
    dnnl_memory_t mems[] = {p->src,      p->dst,      p->scale,    p->shift,      p->mean,
                            p->variance, p->diff_dst, p->diff_src, p->diff_scale, p->diff_shift};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    tl_free(p->mean_buf);
    tl_free(p->variance_buf);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
