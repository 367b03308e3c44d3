#include "ops/batchnorm.h"

#include "core/bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Analytic FLOPs per element. Forward with batch statistics: mean (1 add), variance (subtract,
// square, add = 3), normalize (subtract, multiply = 2), scale and shift (2) = 8; with running
// statistics only the last 4. Backward: dbeta (1 add), dgamma (subtract, multiply, multiply,
// add = 4), din (about 5: two scaled terms subtracted from the scaled gradient) = 10.
// A fused ReLU adds one comparison per element each way.
enum {
  BN_FWD_BATCH_FLOPS_PER_ELEM = 8,
  BN_FWD_GLOBAL_FLOPS_PER_ELEM = 4,
  BN_BWD_FLOPS_PER_ELEM = 10,
  BN_RELU_FLOPS_PER_ELEM = 1,
  // sync_bn: forward normalizes a second time (with the global statistics: the global-stats cost
  // above, and the ReLU again); backward subtracts the global terms (subtract, multiply, add,
  // multiply, subtract = 5).
  BN_SYNC_BWD_FLOPS_PER_ELEM = 5,
};

struct BatchNormPrivate {
  dnnl_primitive_desc_t fwd_pd, bwd_pd;
  dnnl_primitive_t fwd, bwd;
  // sync_bn: forward and backward with given (global) statistics; the local forward above only
  // measures this replica's statistics.
  dnnl_primitive_desc_t fwd_global_pd, bwd_global_pd;
  dnnl_primitive_t fwd_global, bwd_global;
  float *sync_buf;   // (2, C): what the replicas average
  float *sync_coef;  // (3, C): backward's per-channel terms (gamma/sigma, two global means)
  // (N, H, W, C) nhwc; backward binds dout to `dst` as DIFF_DST.
  dnnl_memory_t src, dst, diff_src;
  // (C) each; `ws` is the fused-ReLU mask.
  dnnl_memory_t scale, shift, mean, var, dscale, dshift, ws;
  // Batch statistics, (splits, C) each (biased variance, as oneDNN normalizes with it), and the
  // fused-ReLU mask written in forward and read in backward, (splits) of them: the call's being
  // worked on, one per call in the *_slots buffers.
  float *batch_mean, *batch_var;
  void *relu_ws;
  float *mean_slots, *var_slots;
  void *relu_ws_slots;
  size_t relu_ws_bytes;               // one group's
  float *dgamma_split, *dbeta_split;  // (splits, C) when splits > 1: summed into dgamma, dbeta
  float *din_discard;  // diff_src target when need_din = 0: oneDNN always computes it
  // Told when dgamma and dbeta are ready.
  const ParamSet *params;
};

static size_t bn_elems(const BatchNorm *l) { return (size_t)l->N * l->H * l->W * l->C; }

// Bytes of one (N, H, W, C) activation, in the builder's activation type.
static size_t bn_bytes(const BatchNorm *l) { return bn_elems(l) * l->elem_bytes; }

static void bn_take_params(BatchNorm *l, Builder *b, const char *name) {
  const int C = l->C;
  op_take_scale_shift(b, name, (size_t)C, &l->gamma, &l->dgamma, &l->beta, &l->dbeta);
  char pname[96];
  snprintf(pname, sizeof pname, "%s.running_mean", name);
  l->running_mean = paramset_take_buffer(b->params, pname, (size_t)C);
  paramset_init_const(b->params, l->running_mean, (size_t)C, 0.0f);
  snprintf(pname, sizeof pname, "%s.running_var", name);
  l->running_var = paramset_take_buffer(b->params, pname, (size_t)C);
  paramset_init_const(b->params, l->running_var, (size_t)C, 1.0f);
}

// What forward keeps when it trains (or updates running statistics): the batch statistics and
// the ReLU mask per call, the primitive that normalizes with given statistics, sync_bn's buffers.
static void bn_keep_statistics(BatchNorm *l, Builder *b, DnnlMd data_md, unsigned flags) {
  ExecCtx *ctx = b->ctx;
  struct BatchNormPrivate *p = l->priv;
  const int C = l->C, fuse_relu = l->fuse_relu;
  // Batch statistics (and the ReLU mask) are kept for backward in training; the momentum encoder
  // only needs them for the running-statistics update right after forward.
  MemCategory kept = builder_out_category(b);
  const size_t G = (size_t)l->splits;
  p->batch_mean = p->mean_slots = op_calls_alloc(&l->calls, G * C * sizeof(float), kept, l->comp);
  p->batch_var = p->var_slots = op_calls_alloc(&l->calls, G * C * sizeof(float), kept, l->comp);
  if (fuse_relu) {
    DnnlMd ws_md = dnnl_pd_md(p->fwd_pd, dnnl_query_workspace_md, 0);
    p->ws = dnnl_mem_new(ctx, ws_md);
    p->relu_ws_bytes = dnnl_md_bytes(ws_md);
    dnnl_md_destroy(ws_md);
    p->relu_ws = p->relu_ws_slots = op_calls_alloc(&l->calls, G * p->relu_ws_bytes, kept, l->comp);
  }
  if (l->sync || (b->mode == OP_TRAIN && builder_may_recompute(b))) {
    // Normalizing with given statistics: sync_bn's second pass, and batchnorm_recompute's (for
    // an output written again before its backward, ops/builder.h).
    p->fwd_global_pd = dnnl_pd_batch_norm_forward(ctx, dnnl_forward_training, data_md, l->eps,
                                                  flags | dnnl_use_global_stats);
    p->fwd_global = dnnl_ctx_adopt(ctx, p->fwd_global_pd);
  }
  if (l->sync) {
    p->sync_buf = tl_alloc(2 * (size_t)C * sizeof(float), MEM_WORKSPACE, l->comp);
    p->sync_coef = tl_alloc(3 * (size_t)C * sizeof(float), MEM_WORKSPACE, l->comp);
  }
}

// Backward (and sync_bn's backward with given statistics), its gradient memories, and where
// its input gradient goes.
static void bn_make_backward(BatchNorm *l, Builder *b, DnnlMd data_md, DnnlMd c_md,
                             unsigned flags) {
  ExecCtx *ctx = b->ctx;
  struct BatchNormPrivate *p = l->priv;
  const int C = l->C;
  const size_t G = (size_t)l->splits;
  if (l->sync) {
    p->bwd_global_pd = dnnl_pd_batch_norm_backward(ctx, data_md, l->eps,
                                                   flags | dnnl_use_global_stats, p->fwd_global_pd);
    p->bwd_global = dnnl_ctx_adopt(ctx, p->bwd_global_pd);
  }
  if (G > 1) {
    p->dgamma_split = tl_alloc(G * C * sizeof(float), MEM_WORKSPACE, l->comp);
    p->dbeta_split = tl_alloc(G * C * sizeof(float), MEM_WORKSPACE, l->comp);
  }

  p->bwd_pd = dnnl_pd_batch_norm_backward(ctx, data_md, l->eps, flags, p->fwd_pd);
  p->bwd = dnnl_ctx_adopt(ctx, p->bwd_pd);
  p->diff_src = dnnl_mem_new(ctx, data_md);
  p->dscale = dnnl_mem_new(ctx, c_md);
  p->dshift = dnnl_mem_new(ctx, c_md);
  if (l->need_din)
    op_din_alloc(b, &l->calls, &l->din, bn_bytes(l), l->comp);
  else
    p->din_discard = tl_alloc(bn_bytes(l), MEM_WORKSPACE, l->comp);
}

void batchnorm_init(BatchNorm *l, Builder *b, const char *name, int N, int C, int H, int W,
                    int fuse_relu, int need_din) {
  if (N <= 0 || C <= 0 || H <= 0 || W <= 0)
    TL_DIE("batchnorm %s: invalid shape N=%d C=%d H=%d W=%d", name, N, C, H, W);
  // Like PyTorch: the unbiased running variance needs at least two values per channel.
  if (b->mode != OP_INFER && (long)N * H * W < 2)
    tl_fatal_input(
        "%s: BatchNorm over a shard of %d sample%s per replica has no batch statistics; "
        "use fewer replicas or a larger train.batch_size",
        name, N, N == 1 ? "" : "s");
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  const BuildPolicy policy = builder_policy(b);
  l->splits = b->mode == OP_INFER || policy.bn_splits < 1 ? 1 : policy.bn_splits;
  if (N % l->splits != 0 || (long)(N / l->splits) * H * W < 2)
    tl_fatal_input(
        "%s: [model] bn_splits = %d must divide the %d samples per replica into groups "
        "of at least 2 values per channel",
        name, l->splits, N);
  l->N = N, l->C = C, l->H = H, l->W = W, l->fuse_relu = fuse_relu;
  l->elem_bytes = builder_act_bytes(b);
  l->blocked = builder_layout(b) == dnnl_nChw16c;
  if (l->blocked && C % 16 != 0) TL_DIE("batchnorm %s: %d channels, blocked", name, C);
  l->need_din = need_din && b->mode == OP_TRAIN;
  l->mode = b->mode;
  l->comp = b->component;
  op_calls_init(&l->calls, b);
  l->sync = !batchnorm_in_place(b);
  if (l->sync) l->bn_sync = policy.bn_sync;
  if (l->sync && l->splits > 1) TL_DIE("batchnorm %s: sync_bn with bn_splits > 1", name);
  l->eps = 1e-5f;
  l->momentum = 0.1f;
  l->keep_running = b->keep_running_stats;

  bn_take_params(l, b, name);

  struct BatchNormPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  p->params = b->params;

  // The primitives see one group; forward and backward run once per group.
  dnnl_dims_t data_dims = {N / l->splits, C, H, W}, c_dims = {C};
  DnnlMd data_md = dnnl_md_typed(4, data_dims, builder_act_type(b), builder_layout(b));
  DnnlMd c_md = dnnl_md_plain(1, c_dims, dnnl_a);
  unsigned flags = dnnl_use_scale | dnnl_use_shift | (fuse_relu ? dnnl_fuse_norm_relu : 0u);

  int infer = b->mode == OP_INFER;
  p->fwd_pd =
      dnnl_pd_batch_norm_forward(ctx, infer ? dnnl_forward_inference : dnnl_forward_training,
                                 data_md, l->eps, flags | (infer ? dnnl_use_global_stats : 0u));
  p->fwd = dnnl_ctx_adopt(ctx, p->fwd_pd);
  p->src = dnnl_mem_new(ctx, data_md);
  p->dst = dnnl_mem_new(ctx, data_md);
  p->scale = dnnl_mem_new(ctx, c_md);
  p->shift = dnnl_mem_new(ctx, c_md);
  p->mean = dnnl_mem_new(ctx, c_md);
  p->var = dnnl_mem_new(ctx, c_md);
  op_out_alloc(b, &l->calls, &l->out_slots, bn_bytes(l), l->comp);
  l->out = l->out_slots;
  if (!infer) bn_keep_statistics(l, b, data_md, flags);
  if (b->mode == OP_TRAIN) {
    op_grads_expect(b, &l->calls, l->dgamma, (size_t)C, l->dbeta, (size_t)C);
    bn_make_backward(l, b, data_md, c_md, flags);
  }
  dnnl_md_destroy(data_md);
  dnnl_md_destroy(c_md);
}

// The values per channel the statistics were taken over: one group's, or the global batch's.
static double stat_count(const BatchNorm *l) {
  double n = (double)(l->N / l->splits) * l->H * l->W;
  return l->sync ? n * l->bn_sync.scale : n;
}

// r = (1 - momentum) r + momentum batch, with the unbiased batch variance as in PyTorch; with
// several groups, their mean statistics (as MoCo's SplitBatchNorm averages its running copies).
static void bn_update_running(BatchNorm *l) {
  struct BatchNormPrivate *p = l->priv;
  const int G = l->splits;
  double n = stat_count(l);
  float unbias = (float)(n / (n - 1.0));
  for (int c = 0; c < l->C; c++) {
    float mean = 0, var = 0;
    for (int g = 0; g < G; g++)
      mean += p->batch_mean[g * l->C + c], var += p->batch_var[g * l->C + c];
    mean /= (float)G, var /= (float)G;
    l->running_mean[c] = (1.0f - l->momentum) * l->running_mean[c] + l->momentum * mean;
    l->running_var[c] = (1.0f - l->momentum) * l->running_var[c] + l->momentum * unbias * var;
  }
}

// Group g's (N/G, H, W, C) slice of an activation or gradient.
static const void *group_at(const BatchNorm *l, const float *base, int g) {
  return (const char *)base + (size_t)g * (bn_bytes(l) / (size_t)l->splits);
}

// sync_bn: this replica's statistics (batch_mean, batch_var) become the global batch's. The
// means average over replicas by sample count; the variance is the average of each replica's
// variance plus its mean's squared distance from the global mean (the parallel formula, exact and
// without E[x^2] - mean^2's cancellation).
static void sync_statistics(BatchNorm *l, ExecCtx *ctx) {
  struct BatchNormPrivate *p = l->priv;
  const int C = l->C;
  const double samples = (double)l->N * l->H * l->W;
  if (!ctx->dry_run) memcpy(p->sync_buf, p->batch_mean, sizeof(float) * C);
  l->bn_sync.average(l->bn_sync.user, p->sync_buf, (size_t)C, samples);
  if (!ctx->dry_run)
    for (int c = 0; c < C; c++) {
      const float d = p->batch_mean[c] - p->sync_buf[c];
      p->sync_buf[C + c] = p->batch_var[c] + d * d;
    }
  l->bn_sync.average(l->bn_sync.user, p->sync_buf + C, (size_t)C, samples);
  if (!ctx->dry_run) {
    memcpy(p->batch_mean, p->sync_buf, sizeof(float) * C);
    memcpy(p->batch_var, p->sync_buf + C, sizeof(float) * C);
  }
}

// Points the op at one call's output, statistics and mask.
static void bn_select_call(BatchNorm *l, int call) {
  struct BatchNormPrivate *p = l->priv;
  const size_t stats_bytes = (size_t)l->splits * l->C * sizeof(float);
  l->out = op_out_slot(&l->calls, l->out_slots, bn_bytes(l), call);
  p->batch_mean = op_slot(p->mean_slots, stats_bytes, call);
  p->batch_var = op_slot(p->var_slots, stats_bytes, call);
  p->relu_ws = op_slot(p->relu_ws_slots, (size_t)l->splits * p->relu_ws_bytes, call);
}

// Binds group g of a forward pass over `in` (its output, statistics and ReLU mask in the
// current call's slots; `mean` and `var` are the whole call's) and fills `args`; returns their
// count.
static int bn_bind_forward(BatchNorm *l, const float *in, int g, const float *mean,
                           const float *var, dnnl_exec_arg_t args[7]) {
  struct BatchNormPrivate *p = l->priv;
  dnnl_mem_bind(p->src, group_at(l, in, g));
  dnnl_mem_bind(p->dst, group_at(l, l->out, g));
  dnnl_mem_bind(p->mean, mean);
  dnnl_mem_bind(p->var, var);
  const dnnl_exec_arg_t fixed[6] = {{DNNL_ARG_SRC, p->src},     {DNNL_ARG_DST, p->dst},
                                    {DNNL_ARG_SCALE, p->scale}, {DNNL_ARG_SHIFT, p->shift},
                                    {DNNL_ARG_MEAN, p->mean},   {DNNL_ARG_VARIANCE, p->var}};
  memcpy(args, fixed, sizeof fixed);
  if (!p->ws) return 6;
  dnnl_mem_bind(p->ws, (char *)p->relu_ws + g * p->relu_ws_bytes);
  args[6] = (dnnl_exec_arg_t){DNNL_ARG_WORKSPACE, p->ws};
  return 7;
}

void batchnorm_forward(BatchNorm *l, ExecCtx *ctx, const float *in) {
  struct BatchNormPrivate *p = l->priv;
  int call = op_calls_forward(&l->calls, "batchnorm");
  l->calls.in[call] = l->in = in;
  bn_select_call(l, call);
  if (l->sync && in == l->out && !ctx->dry_run)
    TL_DIE("batchnorm: sync_bn reads its input after writing its output; not in place");
  int batch_stats = l->mode != OP_INFER;
  dnnl_mem_bind(p->scale, l->gamma);
  dnnl_mem_bind(p->shift, l->beta);
  for (int g = 0; g < l->splits; g++) {
    // Outputs with batch statistics, inputs with running statistics.
    dnnl_exec_arg_t args[7];
    const int nargs =
        bn_bind_forward(l, in, g, batch_stats ? p->batch_mean + g * l->C : l->running_mean,
                        batch_stats ? p->batch_var + g * l->C : l->running_var, args);
    dnnl_ctx_exec(ctx, p->fwd, p->fwd_pd, nargs, args);
    if (l->sync) {
      // Normalize again, now with the global batch's statistics.
      sync_statistics(l, ctx);
      dnnl_ctx_exec(ctx, p->fwd_global, p->fwd_global_pd, nargs, args);
    }
  }
  if (batch_stats && !l->keep_running && !ctx->dry_run) bn_update_running(l);
  int per_elem =
      (batch_stats ? BN_FWD_BATCH_FLOPS_PER_ELEM : BN_FWD_GLOBAL_FLOPS_PER_ELEM) +
      (l->fuse_relu ? BN_RELU_FLOPS_PER_ELEM : 0) +
      (l->sync ? BN_FWD_GLOBAL_FLOPS_PER_ELEM + BN_RELU_FLOPS_PER_ELEM * l->fuse_relu : 0);
  ctx->flops_forward[l->comp] += per_elem * (double)bn_elems(l);
}

void batchnorm_recompute(BatchNorm *l, ExecCtx *ctx) {
  struct BatchNormPrivate *p = l->priv;
  if (l->mode != OP_TRAIN || !l->calls.out_shared)
    TL_DIE("batchnorm_recompute on an op without backward or whose output it keeps");
  const int call = op_calls_next_backward(&l->calls, "batchnorm");
  const float *in = l->calls.in[call];
  bn_select_call(l, call);
  dnnl_mem_bind(p->scale, l->gamma);
  dnnl_mem_bind(p->shift, l->beta);
  for (int g = 0; g < l->splits; g++) {
    // The kept statistics; the same ReLU mask again, where backward will read it.
    dnnl_exec_arg_t args[7];
    const int nargs =
        bn_bind_forward(l, in, g, p->batch_mean + g * l->C, p->batch_var + g * l->C, args);
    dnnl_ctx_exec(ctx, p->fwd_global, p->fwd_global_pd, nargs, args);
  }
  ctx->flops_backward[l->comp] +=
      (BN_FWD_GLOBAL_FLOPS_PER_ELEM + (l->fuse_relu ? BN_RELU_FLOPS_PER_ELEM : 0)) *
      (double)bn_elems(l);
}

// sync_bn backward. With the statistics taken as given, oneDNN returns din = gamma/sigma * dy and
// this replica's sums dgamma = sum dy xhat, dbeta = sum dy. The statistics depend on every
// replica's inputs, so the global-batch terms are subtracted here: with dy in this replica's loss
// units (its mean loss; the trainer averages replicas by sample count), the global loss's
// gradient in the same units is
//   din = gamma/sigma * (dy - (avg dbeta + xhat * avg dgamma) / n_local),
// where avg is the sample-weighted average over replicas (one replica: the textbook formula).
// dgamma and dbeta stay local: the trainer's weighted average of them is the global gradient.
// `dgamma` and `dbeta` hold this call's sums.
static void sync_din(BatchNorm *l, ExecCtx *ctx, float *din, const float *dgamma,
                     const float *dbeta) {
  struct BatchNormPrivate *p = l->priv;
  const int C = l->C;
  const double samples = (double)l->N * l->H * l->W;
  if (!ctx->dry_run) {
    memcpy(p->sync_buf, dbeta, sizeof(float) * C);
    memcpy(p->sync_buf + C, dgamma, sizeof(float) * C);
  }
  l->bn_sync.average(l->bn_sync.user, p->sync_buf, 2 * (size_t)C, samples);
  if (ctx->dry_run) return;
  float *a = p->sync_coef;
  for (int c = 0; c < C; c++) {
    const float inv_sigma = 1.0f / sqrtf(p->batch_var[c] + l->eps);
    a[c] = l->gamma[c] * inv_sigma;                                    // gamma / sigma
    a[C + c] = (float)(p->sync_buf[c] / samples);                      // avg dbeta / n_local
    a[2 * C + c] = (float)(p->sync_buf[C + c] / samples) * inv_sigma;  // avg dgamma / n / sigma
  }
  // A row is `width` consecutive channels from `first`: all C of a pixel in nhwc; in nChw16c one
  // block of 16, the blocks of an image one after another, each over every pixel.
  const int width = l->blocked ? 16 : C;
  const size_t pixels = (size_t)l->H * l->W, rows = (size_t)l->N * pixels * (C / width);
  const int bf16 = l->elem_bytes == 2;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < rows; i++) {
    const int first = l->blocked ? (int)((i / pixels) % (size_t)(C / 16)) * 16 : 0;
    for (size_t k = i * width, c = first; k < (i + 1) * width; k++, c++) {
      const float x = act_get(l->in, k, bf16);
      act_set(din, k, bf16,
              act_get(din, k, bf16) - a[c] * (a[C + c] + (x - p->batch_mean[c]) * a[2 * C + c]));
    }
  }
}

void batchnorm_backward(BatchNorm *l, ExecCtx *ctx, const float *dout) {
  struct BatchNormPrivate *p = l->priv;
  TL_ASSERT(l->mode == OP_TRAIN);
  int call = op_calls_backward(&l->calls, "batchnorm");
  l->in = l->calls.in[call];
  bn_select_call(l, call);
  TL_ASSERT(l->in);
  const int G = l->splits;
  OpGrads g = op_grads_begin(&l->calls, l->dgamma, (size_t)l->C, l->dbeta, (size_t)l->C);
  float *dgamma = g.target[0], *dbeta = g.target[1];
  float *din = l->need_din ? l->din : p->din_discard;
  dnnl_mem_bind(p->scale, l->gamma);
  dnnl_mem_bind(p->shift, l->beta);
  for (int g = 0; g < G; g++) {
    dnnl_mem_bind(p->src, group_at(l, l->in, g));
    dnnl_mem_bind(p->dst, group_at(l, dout, g));
    dnnl_mem_bind(p->diff_src, group_at(l, din, g));
    dnnl_mem_bind(p->mean, p->batch_mean + g * l->C);
    dnnl_mem_bind(p->var, p->batch_var + g * l->C);
    dnnl_mem_bind(p->dscale, G > 1 ? p->dgamma_split + g * l->C : dgamma);
    dnnl_mem_bind(p->dshift, G > 1 ? p->dbeta_split + g * l->C : dbeta);
    dnnl_exec_arg_t args[10] = {{DNNL_ARG_SRC, p->src},           {DNNL_ARG_DIFF_DST, p->dst},
                                {DNNL_ARG_DIFF_SRC, p->diff_src}, {DNNL_ARG_SCALE, p->scale},
                                {DNNL_ARG_MEAN, p->mean},         {DNNL_ARG_VARIANCE, p->var},
                                {DNNL_ARG_DIFF_SCALE, p->dscale}, {DNNL_ARG_DIFF_SHIFT, p->dshift}};
    int nargs = 8;
    if (dnnl_batch_norm_backward_reads_shift())
      args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SHIFT, p->shift};
    if (p->ws) {
      dnnl_mem_bind(p->ws, (char *)p->relu_ws + g * p->relu_ws_bytes);
      args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WORKSPACE, p->ws};
    }
    dnnl_ctx_exec(ctx, l->sync ? p->bwd_global : p->bwd, l->sync ? p->bwd_global_pd : p->bwd_pd,
                  nargs, args);
  }
  if (l->sync) sync_din(l, ctx, din, dgamma, dbeta);
  // gamma and beta are shared by the groups: their gradients add up.
  if (G > 1 && !ctx->dry_run)
    for (int c = 0; c < l->C; c++) {
      float dg = 0, db = 0;
      for (int g = 0; g < G; g++)
        dg += p->dgamma_split[g * l->C + c], db += p->dbeta_split[g * l->C + c];
      dgamma[c] = dg, dbeta[c] = db;
    }
  op_grads_end(ctx, l->comp, &l->calls, &g);
  int per_elem = BN_BWD_FLOPS_PER_ELEM + (l->fuse_relu ? BN_RELU_FLOPS_PER_ELEM : 0) +
                 (l->sync ? BN_SYNC_BWD_FLOPS_PER_ELEM : 0);
  ctx->flops_backward[l->comp] += per_elem * (double)bn_elems(l);
}

void batchnorm_destroy(BatchNorm *l) {
  struct BatchNormPrivate *p = l->priv;
  if (p) {
    if (p->fwd) dnnl_primitive_destroy(p->fwd);
    if (p->fwd_pd) dnnl_primitive_desc_destroy(p->fwd_pd);
    if (p->bwd) dnnl_primitive_destroy(p->bwd);
    if (p->bwd_pd) dnnl_primitive_desc_destroy(p->bwd_pd);
    if (p->fwd_global) dnnl_primitive_destroy(p->fwd_global);
    if (p->fwd_global_pd) dnnl_primitive_desc_destroy(p->fwd_global_pd);
    if (p->bwd_global) dnnl_primitive_destroy(p->bwd_global);
    if (p->bwd_global_pd) dnnl_primitive_desc_destroy(p->bwd_global_pd);
    tl_free(p->sync_buf);
    tl_free(p->sync_coef);
    dnnl_memory_t mems[] = {p->src,  p->dst, p->diff_src, p->scale,  p->shift,
                            p->mean, p->var, p->ws,       p->dscale, p->dshift};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    tl_free(p->mean_slots);
    tl_free(p->var_slots);
    tl_free(p->relu_ws_slots);
    tl_free(p->dgamma_split);
    tl_free(p->dbeta_split);
    tl_free(p->din_discard);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
