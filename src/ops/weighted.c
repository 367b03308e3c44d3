#include "ops/weighted.h"

#include <stdlib.h>
#include <string.h>

struct Weighted {
  WeightedSpec spec;
  WeightedOp op;
  OpMode mode;
  MemComponent comp;
  dnnl_alg_kind_t alg;  // the algorithm the backward passes ask for: forward's, after any fallback
  dnnl_primitive_desc_t pd[WEIGHTED_PASSES];
  dnnl_primitive_t prim[WEIGHTED_PASSES];
  int winograd[WEIGHTED_PASSES];  // per pass: run by oneDNN's Winograd kernel
  // Pointers are bound per call.
  dnnl_memory_t src, wei_fwd, bias, dst;           // forward (bias also for its gradient)
  dnnl_memory_t diff_dst, wei_bwd_data, diff_src;  // backward data (diff_dst: both backwards)
  dnnl_memory_t bw_src, bw_diff_dst, dwei;         // backward weights
  DnnlCopy in;    // the input in the compute type, kept for backward weights
  DnnlCopy dout;  // the output gradient in the compute type
  // bwd_weights_f32 on a bf16 input and output gradient: their f32 copies, made just before
  // backward weights into buffers live only over it (op_inner_alloc).
  DnnlReorder bw_in_to_f32, bw_dout_to_f32;
  float *bw_in_f32, *bw_dout_f32;
  int bw_in_pooled, bw_dout_pooled;
  DnnlCopy fwd_w, bwd_data_w;  // the plain f32 weight -> each primitive's layout and type
  int bwd_data_shares_fwd_w;   // backward data's weight layout is forward's: its copy serves
  DnnlReorder dw_to_plain;     // backward weights' gradient layout -> the plain one
  float *dw_buf;               // the gradient in the primitive's layout, when that is not plain
  int dw_pooled;               // dw_buf is a pool value (op_inner_alloc)
  // In a network with a buffer pool, the passes' scratchpads are pool values live only over the
  // op's forward [0] and its backward [1] (both backward passes share one, as they run one after
  // the other) rather than the context's shared scratchpad: a Winograd convolution's is tens of
  // MiB, and held beside every activation it would add to the step's peak.
  size_t sp_bytes[2];
  float *sp_buf[2];
  dnnl_memory_t sp_mem[2];
};

static int pass_group(WeightedPass pass) { return pass == WEIGHTED_FWD ? 0 : 1; }

void weighted_descs_destroy(WeightedDescs *d) {
  DnnlMd mds[] = {d->src_in,  d->src,   d->dst,        d->diff_dst, d->src_f32, d->dst_f32,
                  d->w_plain, d->w_fwd, d->w_bwd_data, d->dw,       d->bias};
  const size_t n = sizeof mds / sizeof mds[0];
  for (size_t i = 0; i < n; i++) {
    int seen = 0;
    for (size_t j = 0; j < i; j++) seen |= mds[j] == mds[i];
    if (!seen) dnnl_md_destroy(mds[i]);
  }
  memset(d, 0, sizeof *d);
}

// One pass's descriptor, a convolution's in `alg`; NULL when the library has no implementation.
static dnnl_primitive_desc_t pass_pd(const Weighted *w, ExecCtx *ctx, WeightedPass pass,
                                     dnnl_alg_kind_t alg, dnnl_prop_kind_t prop,
                                     const WeightedDescs *d) {
  const WeightedSpec *s = &w->spec;
  const DnnlMd bw_src = s->bwd_weights_f32 ? d->src_f32 : d->src;
  const DnnlMd bw_diff_dst = s->bwd_weights_f32 ? d->dst_f32 : d->diff_dst;
  const_dnnl_primitive_desc_t hint = w->pd[WEIGHTED_FWD];
  switch (pass) {
    case WEIGHTED_FWD:
      return s->conv ? dnnl_pd_conv_forward(ctx, prop, alg, d->src, d->w_fwd, d->bias, d->dst,
                                            s->strides, s->padding)
                     : dnnl_pd_inner_product_forward(ctx, prop, d->src, d->w_fwd, d->bias, d->dst);
    case WEIGHTED_BWD_DATA:
      return s->conv ? dnnl_pd_conv_backward_data(ctx, alg, d->src_in, d->w_bwd_data, d->diff_dst,
                                                  s->strides, s->padding, hint)
                     : dnnl_pd_inner_product_backward_data(ctx, d->src_in, d->w_bwd_data,
                                                           d->diff_dst, hint);
    default:
      return s->conv ? dnnl_pd_conv_backward_weights(ctx, alg, bw_src, d->dw, d->bias, bw_diff_dst,
                                                     s->strides, s->padding, hint)
                     : dnnl_pd_inner_product_backward_weights(ctx, bw_src, d->dw, d->bias,
                                                              bw_diff_dst, hint);
  }
}

// A pass in the algorithm asked for, else direct; taken into use (its scratchpad the pool's when
// the op is declared to one, else the context's).
static void make_pass(Weighted *w, Builder *b, WeightedPass pass, dnnl_prop_kind_t prop,
                      const WeightedDescs *d) {
  ExecCtx *ctx = b->ctx;
  w->pd[pass] = pass_pd(w, ctx, pass, w->alg, prop, d);
  w->winograd[pass] = w->pd[pass] && w->spec.conv && w->alg == dnnl_convolution_winograd;
  if (!w->pd[pass] && w->spec.conv && w->alg != dnnl_convolution_direct) {
    if (pass == WEIGHTED_FWD) w->alg = dnnl_convolution_direct;
    w->pd[pass] = pass_pd(w, ctx, pass, dnnl_convolution_direct, prop, d);
  }
  w->prim[pass] = dnnl_prim_new(w->pd[pass]);
  const size_t bytes = dnnl_pd_scratchpad_bytes(w->pd[pass]);
  if (b->pool && b->pool->ops) {
    const int g = pass_group(pass);
    if (bytes > w->sp_bytes[g]) w->sp_bytes[g] = bytes;
  } else {
    dnnl_ctx_reserve_scratchpad(ctx, w->pd[pass]);
  }
}

// The pool values the passes' scratchpads live in, once every pass asked for its size.
static void make_scratchpads(Weighted *w, Builder *b) {
  for (int g = 0; g < 2; g++) {
    if (!w->sp_bytes[g]) continue;
    const int pooled = op_inner_alloc(b, g ? PASS_BACKWARD : PASS_FORWARD, &w->sp_buf[g],
                                      w->sp_bytes[g], MEM_WORKSPACE, w->comp);
    TL_ASSERT(pooled);
    dnnl_dims_t dims = {(dnnl_dim_t)w->sp_bytes[g]};
    DnnlMd whole = dnnl_md_typed(1, dims, dnnl_u8, dnnl_a);
    w->sp_mem[g] = dnnl_mem_new(b->ctx, whole);
    dnnl_md_destroy(whole);
  }
}

static void exec_pass(Weighted *w, ExecCtx *ctx, WeightedPass pass, int nargs,
                      const dnnl_exec_arg_t *args) {
  const int g = pass_group(pass);
  if (w->sp_mem[g])
    dnnl_ctx_exec_scratchpad(ctx, w->prim[pass], nargs, args, w->sp_mem[g], w->sp_buf[g]);
  else
    dnnl_ctx_exec(ctx, w->prim[pass], w->pd[pass], nargs, args);
}

// Forward, its weights' copy into the primitive's layout, the input's copy and its memories.
static void make_forward(Weighted *w, Builder *b, const WeightedDescs *d, int slots) {
  ExecCtx *ctx = b->ctx;
  const int train = b->mode == OP_TRAIN;
  make_pass(w, b, WEIGHTED_FWD, train ? dnnl_forward_training : dnnl_forward_inference, d);
  DnnlMd w_fwd_md = dnnl_pd_md(w->pd[WEIGHTED_FWD], dnnl_query_weights_md, 0);
  dnnl_copy_init(&w->fwd_w, ctx, d->w_plain, w_fwd_md, MEM_WORKSPACE, w->comp);
  // Kept for backward weights unless that reads the f32 input.
  const MemCategory in_category = train && !w->spec.bwd_weights_f32 ? MEM_ACT : MEM_WORKSPACE;
  dnnl_copy_init_slots(&w->in, ctx, d->src_in, d->src, in_category, w->comp, slots);
  w->src = dnnl_mem_new(ctx, d->src);
  w->wei_fwd = dnnl_mem_new(ctx, w_fwd_md);
  w->dst = dnnl_mem_new(ctx, d->dst);
  if (d->bias) w->bias = dnnl_mem_new(ctx, d->bias);
  dnnl_md_destroy(w_fwd_md);
}

// With bwd_weights_f32: the f32 copies of a bf16 input and output gradient backward weights reads.
static void make_backward_weights_f32_copies(Weighted *w, Builder *b, const WeightedDescs *d) {
  dnnl_reorder_init(&w->bw_in_to_f32, b->ctx, d->src_in, d->src_f32);
  if (dnnl_reorder_needed(&w->bw_in_to_f32))
    w->bw_in_pooled = op_inner_alloc(b, PASS_BACKWARD, &w->bw_in_f32, dnnl_md_bytes(d->src_f32),
                                     MEM_WORKSPACE, w->comp);
  dnnl_reorder_init(&w->bw_dout_to_f32, b->ctx, d->dst, d->dst_f32);
  if (dnnl_reorder_needed(&w->bw_dout_to_f32))
    w->bw_dout_pooled = op_inner_alloc(b, PASS_BACKWARD, &w->bw_dout_f32, dnnl_md_bytes(d->dst_f32),
                                       MEM_WORKSPACE, w->comp);
}

// Backward weights, the reorder of its gradient into the plain one, the output gradient's copy.
static void make_backward_weights(Weighted *w, Builder *b, const WeightedDescs *d) {
  ExecCtx *ctx = b->ctx;
  make_pass(w, b, WEIGHTED_BWD_WEIGHTS, dnnl_backward_weights, d);
  DnnlMd dw_md = dnnl_pd_md(w->pd[WEIGHTED_BWD_WEIGHTS], dnnl_query_diff_weights_md, 0);
  dnnl_reorder_init(&w->dw_to_plain, ctx, dw_md, d->w_plain);
  // Written and read only inside the op's backward: a pool value there, when it has a pool.
  if (dnnl_reorder_needed(&w->dw_to_plain))
    w->dw_pooled =
        op_inner_alloc(b, PASS_BACKWARD, &w->dw_buf, dnnl_md_bytes(dw_md), MEM_WORKSPACE, w->comp);
  w->dwei = dnnl_mem_new(ctx, dw_md);
  dnnl_md_destroy(dw_md);
  w->bw_src = dnnl_mem_new(ctx, w->spec.bwd_weights_f32 ? d->src_f32 : d->src);
  w->bw_diff_dst = dnnl_mem_new(ctx, w->spec.bwd_weights_f32 ? d->dst_f32 : d->diff_dst);
  if (w->spec.bwd_weights_f32) make_backward_weights_f32_copies(w, b, d);
  // Read in the compute type by backward data, and by backward weights unless that reads f32.
  if (w->spec.need_din || !w->spec.bwd_weights_f32)
    dnnl_copy_init(&w->dout, ctx, d->dst, d->diff_dst, MEM_ACT_GRAD, w->comp);
  w->diff_dst = dnnl_mem_new(ctx, d->diff_dst);
}

// Backward data, its weights' copy (forward's when the layouts agree) and the input gradient.
static void make_backward_data(Weighted *w, Builder *b, const WeightedDescs *d) {
  ExecCtx *ctx = b->ctx;
  make_pass(w, b, WEIGHTED_BWD_DATA, dnnl_backward_data, d);
  DnnlMd w_bd_md = dnnl_pd_md(w->pd[WEIGHTED_BWD_DATA], dnnl_query_weights_md, 0);
  DnnlMd w_fwd_md = dnnl_pd_md(w->pd[WEIGHTED_FWD], dnnl_query_weights_md, 0);
  w->bwd_data_shares_fwd_w = dnnl_md_equal(w_bd_md, w_fwd_md);
  if (!w->bwd_data_shares_fwd_w)
    dnnl_copy_init(&w->bwd_data_w, ctx, d->w_plain, w_bd_md, MEM_WORKSPACE, w->comp);
  w->wei_bwd_data = dnnl_mem_new(ctx, w_bd_md);
  dnnl_md_destroy(w_bd_md);
  dnnl_md_destroy(w_fwd_md);
  w->diff_src = dnnl_mem_new(ctx, d->src_in);
  op_din_alloc(b, w->op.calls, w->op.din, dnnl_md_bytes(d->src_in), w->comp);
}

Weighted *weighted_create(Builder *b, const WeightedSpec *spec, const WeightedDescs *d,
                          const WeightedOp *op) {
  Weighted *w = calloc(1, sizeof *w);
  if (!w) TL_DIE("out of memory");
  w->spec = *spec;
  w->spec.need_din = spec->need_din && b->mode == OP_TRAIN;
  w->op = *op;
  w->mode = b->mode;
  w->comp = b->component;
  w->alg = spec->conv ? spec->alg : dnnl_alg_kind_undef;
  op_out_alloc(b, op->calls, op->out_slots, op->out_bytes, w->comp);
  *op->out = *op->out_slots;
  if (b->mode == OP_TRAIN)
    op_grads_expect(b, op->calls, *op->dweight, spec->weight_count,
                    spec->bias_count ? *op->dbias : NULL, spec->bias_count);
  make_forward(w, b, d, op->calls->count);
  if (b->mode == OP_TRAIN) {
    make_backward_weights(w, b, d);
    if (w->spec.need_din) make_backward_data(w, b, d);
  }
  make_scratchpads(w, b);
  return w;
}

static void count_winograd(const Weighted *w, ExecCtx *ctx, WeightedPass pass) {
  if (w->winograd[pass]) ctx->flops_winograd += w->spec.pass_flops;
}

void weighted_forward(Weighted *w, ExecCtx *ctx, const float *in) {
  const WeightedOp *op = &w->op;
  const int call = op_calls_forward(op->calls, op->name);
  op->calls->in[call] = *op->in = in;
  *op->out = op_out_slot(op->calls, *op->out_slots, op->out_bytes, call);
  dnnl_mem_bind(w->src, dnnl_copy_run_at(&w->in, ctx, in, call));
  // The weights do not change between a step's forward calls (the optimizer steps after
  // backward): the first call's copy (bf16 under [train] precision = bf16) serves the others.
  dnnl_mem_bind(w->wei_fwd, call > 0 ? dnnl_copy_last(&w->fwd_w, *op->weight)
                                     : dnnl_copy_run(&w->fwd_w, ctx, *op->weight));
  dnnl_mem_bind(w->dst, *op->out);
  dnnl_exec_arg_t args[4] = {
      {DNNL_ARG_SRC, w->src}, {DNNL_ARG_WEIGHTS, w->wei_fwd}, {DNNL_ARG_DST, w->dst}};
  int nargs = 3;
  if (w->bias) {
    dnnl_mem_bind(w->bias, *op->bias);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, w->bias};
  }
  exec_pass(w, ctx, WEIGHTED_FWD, nargs, args);
  ctx->flops_forward[w->comp] += w->spec.pass_flops + w->spec.bias_flops;
  count_winograd(w, ctx, WEIGHTED_FWD);
}

// The weight and bias gradients, through the set (written, or added through its scratch).
static void backward_weights(Weighted *w, ExecCtx *ctx, int call, const float *in,
                             const float *dout) {
  OpCalls *calls = w->op.calls;
  if (w->spec.bwd_weights_f32) {
    if (w->bw_in_f32) dnnl_reorder_run(&w->bw_in_to_f32, ctx, in, w->bw_in_f32);
    if (w->bw_dout_f32) dnnl_reorder_run(&w->bw_dout_to_f32, ctx, dout, w->bw_dout_f32);
    dnnl_mem_bind(w->bw_src, w->bw_in_f32 ? (const void *)w->bw_in_f32 : in);
    dnnl_mem_bind(w->bw_diff_dst, w->bw_dout_f32 ? (const void *)w->bw_dout_f32 : dout);
  } else {
    // The input's converted copy from forward is still this call's input.
    dnnl_mem_bind(w->bw_src, dnnl_copy_last_at(&w->in, in, call));
    dnnl_mem_bind(w->bw_diff_dst, dnnl_copy_last(&w->dout, dout));
  }
  OpGrads g = op_grads_begin(calls, *w->op.dweight, w->spec.weight_count,
                             w->bias ? *w->op.dbias : NULL, w->spec.bias_count);
  const int reordered = dnnl_reorder_needed(&w->dw_to_plain);
  dnnl_mem_bind(w->dwei, reordered ? w->dw_buf : g.target[0]);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, w->bw_src},
                             {DNNL_ARG_DIFF_DST, w->bw_diff_dst},
                             {DNNL_ARG_DIFF_WEIGHTS, w->dwei}};
  int nargs = 3;
  if (w->bias) {
    dnnl_mem_bind(w->bias, g.target[1]);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS, w->bias};
  }
  exec_pass(w, ctx, WEIGHTED_BWD_WEIGHTS, nargs, args);
  if (reordered) dnnl_reorder_run(&w->dw_to_plain, ctx, w->dw_buf, g.target[0]);
  op_grads_end(ctx, w->comp, calls, &g);
  ctx->flops_backward[w->comp] += w->spec.pass_flops + w->spec.bias_flops;
  count_winograd(w, ctx, WEIGHTED_BWD_WEIGHTS);
}

void weighted_backward(Weighted *w, ExecCtx *ctx, const float *dout) {
  const WeightedOp *op = &w->op;
  if (w->mode != OP_TRAIN) TL_DIE("%s: backward on an op built without backward", op->name);
  const int call = op_calls_backward(op->calls, op->name);
  const float *in = *op->in = op->calls->in[call];
  *op->out = op_out_slot(op->calls, *op->out_slots, op->out_bytes, call);
  TL_ASSERT(in);
  dnnl_mem_bind(w->diff_dst, dnnl_copy_run(&w->dout, ctx, dout));
  backward_weights(w, ctx, call, in, dout);
  if (!w->spec.need_din) return;
  // The weights have not changed since forward (the optimizer steps after backward), so the
  // forward's copy is still theirs.
  const void *wei = w->bwd_data_shares_fwd_w ? dnnl_copy_last(&w->fwd_w, *op->weight)
                                             : dnnl_copy_run(&w->bwd_data_w, ctx, *op->weight);
  dnnl_mem_bind(w->wei_bwd_data, wei);
  dnnl_mem_bind(w->diff_src, *op->din);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, w->diff_dst},
                            {DNNL_ARG_WEIGHTS, w->wei_bwd_data},
                            {DNNL_ARG_DIFF_SRC, w->diff_src}};
  exec_pass(w, ctx, WEIGHTED_BWD_DATA, 3, args);
  ctx->flops_backward[w->comp] += w->spec.pass_flops;
  count_winograd(w, ctx, WEIGHTED_BWD_DATA);
}

int weighted_winograd(const Weighted *w, WeightedPass pass) { return w->winograd[pass]; }

int weighted_reads_input(const Weighted *w) { return w->spec.bwd_weights_f32 || w->in.buf == NULL; }

int weighted_grad_reordered(const Weighted *w) { return dnnl_reorder_needed(&w->dw_to_plain); }

void weighted_destroy(Weighted *w) {
  if (!w) return;
  for (int i = 0; i < WEIGHTED_PASSES; i++) {
    if (w->prim[i]) dnnl_primitive_destroy(w->prim[i]);
    if (w->pd[i]) dnnl_primitive_desc_destroy(w->pd[i]);
  }
  dnnl_memory_t mems[] = {w->src,         w->wei_fwd,      w->bias,      w->dst,
                          w->diff_dst,    w->wei_bwd_data, w->diff_src,  w->bw_src,
                          w->bw_diff_dst, w->dwei,         w->sp_mem[0], w->sp_mem[1]};
  for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
    if (mems[i]) dnnl_memory_destroy(mems[i]);
  DnnlCopy *copies[] = {&w->in, &w->dout, &w->fwd_w, &w->bwd_data_w};
  for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) dnnl_copy_destroy(copies[i]);
  dnnl_reorder_destroy(&w->dw_to_plain);
  dnnl_reorder_destroy(&w->bw_in_to_f32);
  dnnl_reorder_destroy(&w->bw_dout_to_f32);
  op_buffer_free(w->bw_in_f32, w->bw_in_pooled);
  op_buffer_free(w->bw_dout_f32, w->bw_dout_pooled);
  op_buffer_free(w->dw_buf, w->dw_pooled);
  free(w);
}
