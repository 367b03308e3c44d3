// Softmax over each row of a (rows, cols) matrix, in place (oneDNN softmax, forward only): the
// probabilities, or their logarithms. The losses that use it (objectives/infonce.c,
// objectives/dino_loss.c) derive their gradients themselves and count its FLOPs with theirs.
#pragma once
#include "core/dnnl_prim.h"

typedef enum {
  SOFTMAX_PROBS,      // exp(x - max) / sum
  SOFTMAX_LOG_PROBS,  // x - max - log(sum exp(x - max))
} SoftmaxKind;

typedef struct {
  int rows, cols;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t mem;  // source and destination alike
} RowSoftmax;

void row_softmax_init(RowSoftmax *s, ExecCtx *ctx, int rows, int cols, SoftmaxKind kind);
// Replaces each row of `rows` (rows, cols) by its softmax; nothing in a dry run.
void row_softmax_run(RowSoftmax *s, ExecCtx *ctx, float *rows);
void row_softmax_destroy(RowSoftmax *s);
