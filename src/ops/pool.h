// Global average pooling (oneDNN pooling, avg): (N, H, W, C) -> (N, C).
#pragma once
#include "ops/builder.h"

typedef struct {
  int N, H, W, C, need_din;
  OpMode mode;
  MemComponent comp;
  OpCalls calls;
  float *out;  // (N, C), the call forward worked on last; one per call in out_slots
  float *out_slots;
  float *din;  // (N, H, W, C)
  struct PoolPrivate *priv;
} GlobalAvgPool;

void gap_init(GlobalAvgPool *l, Builder *b, int N, int H, int W, int C, int need_din);
void gap_forward(GlobalAvgPool *l, ExecCtx *ctx, const float *in);
void gap_backward(GlobalAvgPool *l, ExecCtx *ctx, const float *dout);
void gap_destroy(GlobalAvgPool *l);
