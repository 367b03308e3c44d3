// Layer scale (ConvNeXt's, CaiT's): each channel of (M, C) rows multiplied by its own learned
// factor, out = in * gamma (oneDNN binary mul, gamma broadcast over the rows). Backward: din =
// dout * gamma (the same primitive), dgamma = the column sums of dout * in (a binary mul into a
// buffer live only over backward, then oneDNN's sum reduction over the rows).
#pragma once
#include "ops/builder.h"

typedef struct {
  int M, C, need_din;
  OpMode mode;
  MemComponent comp;
  // (C) the parameter named `name` itself (torchvision's layer_scale is a tensor of its block,
  // shape (C, 1, 1)), without weight decay.
  float *gamma, *dgamma;
  OpCalls calls;
  const float *in;  // (M, C), the call forward or backward works on
  float *out;       // (M, C), the same call's; one per call in out_slots
  float *out_slots;
  float *din;  // (M, C), with need_din
  struct LayerScalePrivate *priv;
} LayerScale;

// gamma starts at `init` (ConvNeXt: 1e-6, so a block starts near the identity).
void layerscale_init(LayerScale *l, Builder *b, const char *name, int M, int C, float init,
                     int need_din);
void layerscale_forward(LayerScale *l, ExecCtx *ctx, const float *in);
// dgamma, and din with need_din. Reads the input forward was given.
void layerscale_backward(LayerScale *l, ExecCtx *ctx, const float *dout);
void layerscale_destroy(LayerScale *l);
