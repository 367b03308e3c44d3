// Row-wise L2 normalization, u = z / max(|z|, 1e-12) per row (PyTorch's F.normalize), and its
// backward dz = (du - u (u . du)) / max(|z|, 1e-12), on oneDNN primitives: forward a reduction
// (the norms) and a division; backward a division, a batched matmul (the row dots) and a
// multiply added into the gradient. Rows of (rows, d) row-major: embeddings, prototypes.
// One forward call per backward (no OpCalls): the losses normalize each tensor once a step.
#pragma once
#include "ops/builder.h"

typedef struct {
  int rows, d, need_din;
  OpMode mode;
  MemComponent comp;
  float *out;    // (rows, d) the unit rows: MEM_ACT when kept for backward (OP_TRAIN)
  float *norms;  // (rows) max(|z|, 1e-12), kept for backward, which writes its row dots over them
  float *din;    // (rows, d) MEM_ACT_GRAD, with need_din
  struct L2NormPrivate *priv;
} L2Norm;

// Backward exists in OP_TRAIN; need_din: the op owns its input gradient (else l2norm_backward_to
// writes it where the caller says: a parameter's gradient).
void l2norm_init(L2Norm *l, const Builder *b, int rows, int d, int need_din);
void l2norm_forward(L2Norm *l, ExecCtx *ctx, const float *in);
// Forward only, into buffers the caller owns (an evaluation's, counted with its own): out
// (rows, d) and norms (rows); the op holds no buffer.
void l2norm_init_unowned(L2Norm *l, const Builder *b, int rows, int d);
void l2norm_forward_to(L2Norm *l, ExecCtx *ctx, const float *in, float *out, float *norms);
void l2norm_backward(L2Norm *l, ExecCtx *ctx, const float *dout);
void l2norm_backward_to(L2Norm *l, ExecCtx *ctx, const float *dout, float *din);
void l2norm_destroy(L2Norm *l);
