// Projection head: Linear(in, hidden) -> BatchNorm + ReLU -> Linear(hidden, out), as in SimCLR,
// or with GELU and no normalization between the two, as DINO's head (use_bn_in_head off); with
// more layers, Linear(hidden, hidden) -> activation again before the last (DINO's nlayers).
// The loss sees its output; evaluation uses the backbone feature before it.
#pragma once
#include "ops/batchnorm.h"
#include "ops/eltwise.h"
#include "ops/linear.h"

typedef enum { HEAD_BN_RELU, HEAD_GELU } HeadActivation;

enum { HEAD_MAX_LAYERS = 4 };

typedef struct {
  int N, in_dim, hidden_dim, out_dim;
  int layers;  // linear layers, 2..HEAD_MAX_LAYERS: layers - 1 hidden activations
  HeadActivation activation;
  // fc[0] (N, in) -> (N, hidden); fc[i] (N, hidden) -> (N, hidden); fc[layers - 1] -> (N, out).
  // Parameter names: fc1, bn (or no parameters for GELU), then fc1_2, bn_2, ... and fc2 last,
  // so a two-layer head's are those it always had.
  Linear fc[HEAD_MAX_LAYERS];
  BatchNorm bn[HEAD_MAX_LAYERS - 1];  // after fc[i], fused ReLU (HEAD_BN_RELU)
  Eltwise gelu[HEAD_MAX_LAYERS - 1];  // after fc[i] (HEAD_GELU)
  float *out;                         // (N, out) = fc[layers - 1].out
  float *din;                         // (N, in) = fc[0].din
} ProjectionHead;

// A two-layer HEAD_BN_RELU head.
void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim);
void head_init_with(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim,
                    int hidden_dim, int out_dim, int layers, HeadActivation activation);
void head_forward(ProjectionHead *h, ExecCtx *ctx, const float *in);
void head_backward(ProjectionHead *h, ExecCtx *ctx, const float *dout);
void head_destroy(ProjectionHead *h);
