#include "nn/head.h"

#include <stdio.h>

void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim) {
  head_init_with(h, b, name, N, in_dim, hidden_dim, out_dim, HEAD_BN_RELU);
}

void head_init_with(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim,
                    int hidden_dim, int out_dim, HeadActivation activation) {
  int train = b->mode == OP_TRAIN;
  MemComponent saved = b->ctx->component;
  b->ctx->component = COMP_HEAD;
  char nm[64];
  snprintf(nm, sizeof nm, "%s.fc1", name);
  linear_init(&h->fc1, b, nm, N, in_dim, hidden_dim, 1, train, 0.0f);
  h->activation = activation;
  snprintf(nm, sizeof nm, "%s.bn", name);
  if (activation == HEAD_BN_RELU)
    batchnorm_init(&h->bn, b, nm, N, hidden_dim, 1, 1, 1, train);
  else
    eltwise_init(&h->gelu, b, ELTWISE_GELU, (size_t)N * hidden_dim, train);
  snprintf(nm, sizeof nm, "%s.fc2", name);
  linear_init(&h->fc2, b, nm, N, hidden_dim, out_dim, 1, train, 0.0f);
  b->ctx->component = saved;
  h->N = N;
  h->in_dim = in_dim;
  h->hidden_dim = hidden_dim;
  h->out_dim = out_dim;
  h->out = h->fc2.out;
  h->din = h->fc1.din;
}

// The hidden layer's activation on fc1's output: BatchNorm + ReLU, or GELU. Returns its output.
static const float *activation_forward(ProjectionHead *h, DnnlCtx *ctx) {
  if (h->activation == HEAD_BN_RELU) {
    batchnorm_forward(&h->bn, ctx, h->fc1.out);
    return h->bn.out;
  }
  eltwise_forward(&h->gelu, ctx, h->fc1.out);
  return h->gelu.out;
}

// Its backward from fc2's input gradient; returns fc1's output gradient.
static const float *activation_backward(ProjectionHead *h, DnnlCtx *ctx) {
  if (h->activation == HEAD_BN_RELU) {
    batchnorm_backward(&h->bn, ctx, h->fc2.din);
    return h->bn.din;
  }
  eltwise_backward(&h->gelu, ctx, h->fc2.din);
  return h->gelu.din;
}

void head_forward(ProjectionHead *h, DnnlCtx *ctx, const float *in) {
  linear_forward(&h->fc1, ctx, in);
  linear_forward(&h->fc2, ctx, activation_forward(h, ctx));
  h->out = h->fc2.out;
}

void head_backward(ProjectionHead *h, DnnlCtx *ctx, const float *dout) {
  linear_backward(&h->fc2, ctx, dout);
  linear_backward(&h->fc1, ctx, activation_backward(h, ctx));
}

void head_destroy(ProjectionHead *h) {
  linear_destroy(&h->fc1);
  if (h->activation == HEAD_BN_RELU)
    batchnorm_destroy(&h->bn);
  else
    eltwise_destroy(&h->gelu);
  linear_destroy(&h->fc2);
}
