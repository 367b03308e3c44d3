// Layer normalization over the last dimension of (M, D) rows (oneDNN layer_normalization with
// separate scale and shift): out = gamma * (in - mean) / sqrt(var + eps) + beta, per row. Input,
// output and their gradients in the builder's act_type (bf16 or f32); the statistics, gamma, beta
// and their gradients f32.
#pragma once
#include "ops/builder.h"

typedef struct {
  int M, D;
  size_t elem_bytes;  // of one input or output element: the builder's act_type
  OpMode mode;
  MemComponent comp;
  float eps;              // 1e-6
  float *gamma, *dgamma;  // (D) scale, init 1, no weight decay
  float *beta, *dbeta;    // (D) shift, init 0, no weight decay
  OpCalls calls;
  const float *in;  // (M, D), the call forward or backward works on
  float *out;       // (M, D), the same call's; one per call in out_slots
  float *out_slots;
  // (M, D), OP_TRAIN only: oneDNN's backward with scale/shift gradients always produces it.
  float *din;
  struct LayerNormPrivate *priv;  // primitives and the per-row mean/variance kept for backward
} LayerNorm;

void layernorm_init(LayerNorm *l, Builder *b, const char *name, int M, int D);
void layernorm_forward(LayerNorm *l, ExecCtx *ctx, const float *in);
// din, dgamma and dbeta (overwritten).
void layernorm_backward(LayerNorm *l, ExecCtx *ctx, const float *dout);
// Writes the output (and the same statistics) of the call the next backward takes again, from
// the input that call kept (for an output built in a scratch pool, ops/builder.h); its FLOPs
// count as backward. OP_TRAIN only.
void layernorm_recompute(LayerNorm *l, ExecCtx *ctx);
void layernorm_destroy(LayerNorm *l);

// Analytic FLOPs of one call (counts per element in layernorm.c), for plans and tests.
double layernorm_flops_forward(int M, int D);
double layernorm_flops_backward(int M, int D);
