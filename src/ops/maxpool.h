// Max pooling (oneDNN pooling, max): (N, H, W, C) -> (N, OH, OW, C), a K x K window at stride S
// with P padding on each side (padding never wins: oneDNN's max excludes it, as PyTorch's
// MaxPool2d pads with -inf). ResNet's ImageNet stem: K = 3, S = 2, P = 1.
// Backward routes each output gradient to the input its window took the maximum from; the
// forward training primitive records where in a workspace (one per call, MEM_ACT), so backward
// reads neither the input nor the output.
#pragma once
#include "ops/builder.h"

typedef struct {
  int N, H, W, C, OH, OW, K, S, P, need_din;
  OpMode mode;
  MemComponent comp;
  OpCalls calls;
  float *out;  // (N, OH, OW, C), the call forward worked on last; one per call in out_slots
  float *out_slots;
  float *din;             // (N, H, W, C)
  void *workspace_slots;  // one per call (OP_TRAIN): the argmax of each window
  size_t workspace_bytes;
  size_t act_bytes;  // of an activation element: 2 in bf16, 4 in f32 (builder_act_bytes)
  struct MaxPoolPrivate *priv;
} MaxPool;

void maxpool_init(MaxPool *l, Builder *b, int N, int H, int W, int C, int K, int S, int P,
                  int need_din);
void maxpool_forward(MaxPool *l, ExecCtx *ctx, const float *in);
void maxpool_backward(MaxPool *l, ExecCtx *ctx, const float *dout);
void maxpool_destroy(MaxPool *l);
