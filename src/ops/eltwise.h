// Elementwise activations (oneDNN eltwise): ReLU (backward from dst) and GELU (erf form). Forward
// may run in place (out == in, as oneDNN allows): a forward-only network's output pool gives
// GELU its input's buffer.
#pragma once
#include "ops/builder.h"

typedef enum { ELTWISE_RELU, ELTWISE_GELU } EltwiseKind;

typedef struct {
  EltwiseKind kind;
  size_t n;      // element count; the tensor is treated as flat
  size_t bytes;  // of one output (and the input gradient): n elements of the builder's act_type
  int need_din;
  OpMode mode;
  MemComponent comp;
  OpCalls calls;
  const float *in;  // (n), the call forward or backward works on
  float *out;       // (n), the same call's; one per call in out_slots
  float *out_slots;
  float *din;  // (n)
  struct EltwisePrivate *priv;
} Eltwise;

void eltwise_init(Eltwise *l, Builder *b, EltwiseKind kind, size_t n, int need_din);
void eltwise_forward(Eltwise *l, ExecCtx *ctx, const float *in);
void eltwise_backward(Eltwise *l, ExecCtx *ctx, const float *dout);
// Writes the output of the call the next backward takes again, from the input that call kept
// (for an output built in a scratch pool, ops/builder.h); its FLOPs count as backward.
void eltwise_recompute(Eltwise *l, ExecCtx *ctx);
void eltwise_destroy(Eltwise *l);
