// Fully connected layer on rows (oneDNN inner product): (M, IC) -> (M, OC), out = in W^T + b.
// M is the number of rows (batch, or batch*tokens for token tensors).
#pragma once
#include "ops/builder.h"
#include "ops/weighted.h"

typedef struct {
  int M, IC, OC, has_bias, need_din;
  OpMode mode;
  MemComponent comp;
  float *weight, *dweight;  // (OC, IC)
  float *bias, *dbias;      // (OC)
  OpCalls calls;
  const float *in;  // (M, IC), the call forward or backward works on
  float *out;       // (M, OC), the same call's; one per call in out_slots
  float *out_slots;
  float *din;        // (M, IC)
  Weighted *passes;  // primitives, memories, copies in the compute type and layouts
} Linear;

// Weights: `init_std` > 0 draws normal(0, init_std); 0 means Xavier-uniform. Bias zero.
void linear_init(Linear *l, Builder *b, const char *name, int M, int IC, int OC, int has_bias,
                 int need_din, float init_std);
void linear_forward(Linear *l, ExecCtx *ctx, const float *in);
void linear_backward(Linear *l, ExecCtx *ctx, const float *dout);
// Whether backward reads the forward input where it was (1), or a converted copy of its own (0:
// bf16 compute on f32 activations), so the input's buffer may be reused once forward has read it.
int linear_backward_reads_input(const Linear *l);
// Whether backward writes the weight gradient in a blocked layout of oneDNN's and reorders it into
// the plain (OC, IC) gradient (layers with more outputs than inputs, where that is faster).
int linear_weight_grad_blocked(const Linear *l);
void linear_destroy(Linear *l);
