#include "nn/head.h"

#include <stdio.h>
#include <string.h>

void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim) {
  head_init_with(h, b, name, N, in_dim, hidden_dim, out_dim, 2, HEAD_BN_RELU);
}

// The name of linear layer i (of `layers`) or of the activation after it: fc1, bn, fc1_2,
// bn_2, ..., fc2.
static void layer_name(char *nm, size_t size, const char *name, const char *what, int i,
                       int layers) {
  if (i == layers - 1)
    snprintf(nm, size, "%s.fc2", name);
  else if (i == 0)
    snprintf(nm, size, "%s.%s", name, what);
  else
    snprintf(nm, size, "%s.%s_%d", name, what, i + 1);
}

void head_init_with(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim,
                    int hidden_dim, int out_dim, int layers, HeadActivation activation) {
  memset(h, 0, sizeof *h);
  if (layers < 2 || layers > HEAD_MAX_LAYERS)
    TL_DIE("a head of %d layers (2 to %d)", layers, HEAD_MAX_LAYERS);
  int train = b->mode == OP_TRAIN;
  Builder head = *b;
  head.component = COMP_HEAD;
  b = &head;
  h->layers = layers;
  h->activation = activation;
  char nm[64];
  for (int i = 0; i < layers; i++) {
    const int last = i == layers - 1;
    layer_name(nm, sizeof nm, name, "fc1", i, layers);
    linear_init(&h->fc[i], b, nm, N, i == 0 ? in_dim : hidden_dim, last ? out_dim : hidden_dim, 1,
                train, 0.0f);
    if (last) break;
    layer_name(nm, sizeof nm, name, "bn", i, layers);
    if (activation == HEAD_BN_RELU)
      batchnorm_init(&h->bn[i], b, nm, N, hidden_dim, 1, 1, 1, train);
    else
      eltwise_init(&h->gelu[i], b, ELTWISE_GELU, (size_t)N * hidden_dim, train);
  }
  h->N = N;
  h->in_dim = in_dim;
  h->hidden_dim = hidden_dim;
  h->out_dim = out_dim;
  h->out = h->fc[layers - 1].out;
  h->din = h->fc[0].din;
}

// Hidden activation i on fc[i]'s output: BatchNorm + ReLU, or GELU. Returns its output.
static const float *activation_forward(ProjectionHead *h, ExecCtx *ctx, int i) {
  if (h->activation == HEAD_BN_RELU) {
    batchnorm_forward(&h->bn[i], ctx, h->fc[i].out);
    return h->bn[i].out;
  }
  eltwise_forward(&h->gelu[i], ctx, h->fc[i].out);
  return h->gelu[i].out;
}

// Its backward from fc[i + 1]'s input gradient; returns fc[i]'s output gradient.
static const float *activation_backward(ProjectionHead *h, ExecCtx *ctx, int i) {
  if (h->activation == HEAD_BN_RELU) {
    batchnorm_backward(&h->bn[i], ctx, h->fc[i + 1].din);
    return h->bn[i].din;
  }
  eltwise_backward(&h->gelu[i], ctx, h->fc[i + 1].din);
  return h->gelu[i].din;
}

void head_forward(ProjectionHead *h, ExecCtx *ctx, const float *in) {
  linear_forward(&h->fc[0], ctx, in);
  for (int i = 1; i < h->layers; i++)
    linear_forward(&h->fc[i], ctx, activation_forward(h, ctx, i - 1));
  h->out = h->fc[h->layers - 1].out;
}

void head_backward(ProjectionHead *h, ExecCtx *ctx, const float *dout) {
  const float *d = dout;
  for (int i = h->layers - 1; i > 0; i--) {
    linear_backward(&h->fc[i], ctx, d);
    d = activation_backward(h, ctx, i - 1);
  }
  linear_backward(&h->fc[0], ctx, d);
}

void head_destroy(ProjectionHead *h) {
  for (int i = 0; i < h->layers; i++) {
    linear_destroy(&h->fc[i]);
    if (i == h->layers - 1) break;
    if (h->activation == HEAD_BN_RELU)
      batchnorm_destroy(&h->bn[i]);
    else
      eltwise_destroy(&h->gelu[i]);
  }
}
