#include "nn/head.h"

#include <stdio.h>

void head_init(ProjectionHead *h, Builder *b, const char *name, int N, int in_dim, int hidden_dim,
               int out_dim) {
  int train = b->mode == OP_TRAIN;
  MemComponent saved = b->ctx->component;
  b->ctx->component = COMP_HEAD;
  char nm[64];
  snprintf(nm, sizeof nm, "%s.fc1", name);
  linear_init(&h->fc1, b, nm, N, in_dim, hidden_dim, 1, train, 0.0f);
  snprintf(nm, sizeof nm, "%s.bn", name);
  batchnorm_init(&h->bn, b, nm, N, hidden_dim, 1, 1, 1, train);
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

void head_forward(ProjectionHead *h, DnnlCtx *ctx, const float *in) {
  linear_forward(&h->fc1, ctx, in);
  batchnorm_forward(&h->bn, ctx, h->fc1.out);
  linear_forward(&h->fc2, ctx, h->bn.out);
  h->out = h->fc2.out;
}

void head_backward(ProjectionHead *h, DnnlCtx *ctx, const float *dout) {
  linear_backward(&h->fc2, ctx, dout);
  batchnorm_backward(&h->bn, ctx, h->fc2.din);
  linear_backward(&h->fc1, ctx, h->bn.din);
}

void head_destroy(ProjectionHead *h) {
  linear_destroy(&h->fc1);
  batchnorm_destroy(&h->bn);
  linear_destroy(&h->fc2);
}
