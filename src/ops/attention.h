// Multi-head scaled dot-product attention on a fused qkv tensor (the output of one Linear D->3D):
// out = concat_h softmax(Q_h K_h^T / sqrt(Dh)) V_h, H heads of Dh = D/H features each.
//
// Layout: qkv (N, T, 3D) row-major, row = [Q | K | V], each D = [head 0 | ... | head H-1] of Dh.
// The per-head (N, H, T, Dh) operands are strided views into qkv for long sequences, or one
// reorder into dense (3, N, H, T, Dh) heads for short ones (whichever oneDNN 2.6 runs faster,
// see attention.c); the head slices of out (N, T, D) are always strided views. The attention
// matrix (N, H, T, T) is a buffer of its own. Every tensor is in the builder's act_type: under
// bf16 the matmuls multiply bf16 and accumulate in f32, the softmax computes in f32 and keeps its
// probabilities in bf16 for backward.
#pragma once
#include "ops/builder.h"

typedef struct {
  int N, T, D, H;
  OpMode mode;
  MemComponent comp;
  OpCalls calls;
  const float *qkv;  // (N, T, 3D), the call forward or backward works on
  float *out;        // (N, T, D), the same call's; one per call in out_slots
  float *out_slots;
  float *din;                     // (N, T, 3D) = [dQ | dK | dV], OP_TRAIN only
  struct AttentionPrivate *priv;  // primitives; the softmax output (N, H, T, T) kept for backward
} Attention;

// D must be divisible by heads.
void attention_init(Attention *a, Builder *b, int N, int T, int D, int heads);
void attention_forward(Attention *a, ExecCtx *ctx, const float *qkv);
// Whether backward reads the qkv input forward read: not for short sequences, whose dense
// per-head copy the op keeps for itself (the input can then go once forward is done with it).
int attention_backward_reads_input(const Attention *a);
void attention_backward(Attention *a, ExecCtx *ctx, const float *dout);
void attention_destroy(Attention *a);

// Analytic FLOPs of one call (forward: two batched matmuls and the softmax; backward: four
// matmuls and the softmax gradient), for plans and tests.
double attention_flops_forward(int N, int T, int D, int heads);
double attention_flops_backward(int N, int T, int D, int heads);
