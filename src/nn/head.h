// Projection head: Linear(in, hidden) -> BatchNorm + ReLU -> Linear(hidden, out), as in SimCLR.
// The contrastive loss sees its output; evaluation uses the backbone feature before it.
#pragma once
#include "ops/batchnorm.h"
#include "ops/linear.h"

typedef struct {
  int N, in_dim, hidden_dim, out_dim;
  Linear fc1;    // (N, in) -> (N, hidden)
  BatchNorm bn;  // (N, hidden), fused ReLU
  Linear fc2;    // (N, hidden) -> (N, out)
  float *out;    // (N, out) = fc2.out
  float *din;    // (N, in) = fc1.din
} ProjectionHead;

void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim);
void head_forward(ProjectionHead *h, DnnlCtx *ctx, const float *in);
void head_backward(ProjectionHead *h, DnnlCtx *ctx, const float *dout);
void head_destroy(ProjectionHead *h);
