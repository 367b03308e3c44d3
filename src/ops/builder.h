// What every op needs when it is created: the replica's oneDNN context (where buffers, scratchpad
// and FLOPs are counted), the parameter block it takes its weights from, and the mode it runs in.
//
// Conventions shared by all ops (src/ops/*.h):
// - Layouts: 4-D activations are NHWC (oneDNN tag nhwc); 2-D are (rows, features) row-major;
//   token tensors are (N, T, D) row-major, which is the same memory as NHWC with H*W = T.
// - An op is created once for fixed shapes (its primitives are created then, never per step),
//   owns its output `out` and, when asked, its input gradient `din`; it remembers the input
//   pointer it was given in forward for use in backward.
// - Parameter gradients are overwritten (not accumulated) by backward.
// - Buffers: `out` is MEM_ACT when kept for backward (OP_TRAIN), MEM_WORKSPACE otherwise; `din` is
//   MEM_ACT_GRAD; workspaces kept between forward and backward are MEM_ACT; all tagged with
//   ctx->component at creation time.
// - Each execution adds its analytic FLOPs (a multiply-add counts 2) to
//   ctx->flops_forward/backward[component given at creation].
#pragma once
#include "core/dnnl_ctx.h"
#include "core/params.h"

typedef enum {
  OP_TRAIN,    // forward training (batch statistics), keeps what backward needs, has backward
  OP_FORWARD,  // forward with batch statistics, nothing kept, no backward (momentum encoder)
  OP_INFER,    // forward inference (running statistics), no backward (evaluation)
} OpMode;

typedef struct {
  DnnlCtx *ctx;
  ParamSet *params;
  OpMode mode;
} Builder;

// Memory category for an op's output under this builder's mode.
static inline MemCategory builder_out_category(const Builder *b) {
  return b->mode == OP_TRAIN ? MEM_ACT : MEM_WORKSPACE;
}
