// out = a + b for two tensors of the same shape (oneDNN binary add). Used for residual
// connections forward, and to sum gradients where a tensor feeds two consumers.
// Its backward is the identity to both inputs, so it has none.
#pragma once
#include "ops/builder.h"

typedef struct {
  size_t n;
  size_t bytes;  // of one output: n elements of the builder's act_type
  MemComponent comp;
  int is_backward;  // counts its FLOPs as backward (gradient summation)
  OpCalls calls;    // one slot for a gradient sum: it is consumed before the next call's
  float *out;       // (n), owned: the last call's; one per call in out_slots
  float *out_slots;
  struct AddPrivate *priv;
} Add;

// `cat` is the memory category of `out` (MEM_ACT for forward residuals kept for backward,
// MEM_ACT_GRAD for gradient sums).
void add_init(Add *l, Builder *b, size_t n, MemCategory cat, int is_backward);
void add_forward(Add *l, ExecCtx *ctx, const float *a, const float *bb);
void add_destroy(Add *l);
