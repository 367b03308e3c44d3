// Projection head: Linear(in, hidden) -> BatchNorm + ReLU -> Linear(hidden, out), as in SimCLR,
// or with GELU and no normalization between the two, as DINO's head (use_bn_in_head off).
// The loss sees its output; evaluation uses the backbone feature before it.
#pragma once
#include "ops/batchnorm.h"
#include "ops/eltwise.h"
#include "ops/linear.h"

typedef enum { HEAD_BN_RELU, HEAD_GELU } HeadActivation;

typedef struct {
  int N, in_dim, hidden_dim, out_dim;
  HeadActivation activation;
  Linear fc1;    // (N, in) -> (N, hidden)
  BatchNorm bn;  // (N, hidden), fused ReLU (HEAD_BN_RELU)
  Eltwise gelu;  // (N, hidden) (HEAD_GELU)
  Linear fc2;    // (N, hidden) -> (N, out)
  float *out;    // (N, out) = fc2.out
  float *din;    // (N, in) = fc1.din
} ProjectionHead;

// A HEAD_BN_RELU head.
void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim);
void head_init_with(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim,
                    int hidden_dim, int out_dim, HeadActivation activation);
void head_forward(ProjectionHead *h, DnnlCtx *ctx, const float *in);
void head_backward(ProjectionHead *h, DnnlCtx *ctx, const float *dout);
void head_destroy(ProjectionHead *h);
