// Batch normalization over N*H*W per channel, optionally with a fused ReLU (oneDNN's
// dnnl_fuse_norm_relu: the ReLU mask is its workspace). Works for 2-D inputs with H = W = 1.
// With [model] bn_splits = G > 1 (the builder's policy; training and momentum-encoder modes), the
// batch is normalized as G groups of N/G samples, each with its own statistics — contiguous in NHWC
// and in the blocked nChw16c, so each group is one execution of a primitive made for N/G — as G
// replicas without synchronized BatchNorm would; the running statistics follow the mean of the
// groups' statistics.
#pragma once
#include "ops/builder.h"

typedef struct {
  int N, C, H, W, fuse_relu, need_din;
  int splits;         // groups with their own batch statistics (1: the whole batch)
  int sync;           // statistics of the global batch (the policy's bn_sync), and their gradient
  BnSync bn_sync;     // with sync: how they are averaged over the replicas
  int blocked;        // activations in nChw16c (the builder's layout), else nhwc
  size_t elem_bytes;  // of an activation element: 4 (f32) or 2 (bf16, the builder's act_type)
  OpMode mode;
  MemComponent comp;
  float eps, momentum;    // 1e-5, running stats updated as r = (1-momentum) r + momentum batch
  int keep_running;       // the builder's keep_running_stats: no update
  float *gamma, *dgamma;  // (C) scale, init 1, no weight decay
  float *beta, *dbeta;    // (C) shift, init 0, no weight decay
  float *running_mean;    // (C) buffer in the parameter block (paramset_take_buffer)
  float *running_var;     // (C)
  OpCalls calls;
  // Activations and their gradients are in the builder's act_type, statistics and parameters f32.
  const float *in;  // (N, H, W, C), the call forward or backward works on
  float *out;       // (N, H, W, C), the same call's; one per call in out_slots
  float *out_slots;
  float *din;  // (N, H, W, C), when need_din
  struct BatchNormPrivate *priv;
} BatchNorm;

void batchnorm_init(BatchNorm *l, Builder *b, const char *name, int N, int C, int H, int W,
                    int fuse_relu, int need_din);
// Whether a BatchNorm built by `b` may write its output over its input: not with sync_bn, whose
// forward normalizes with this replica's statistics first and then reads its input again.
static inline int batchnorm_in_place(const Builder *b) {
  return b->mode == OP_INFER || builder_policy(b).bn_sync.average == NULL;
}
void batchnorm_forward(BatchNorm *l, ExecCtx *ctx, const float *in);
// Writes the output of the call the next backward takes again, from its input and the batch
// statistics forward kept (a scratch output a later backward reads; ops/builder.h).
void batchnorm_recompute(BatchNorm *l, ExecCtx *ctx);
void batchnorm_backward(BatchNorm *l, ExecCtx *ctx, const float *dout);
void batchnorm_destroy(BatchNorm *l);
