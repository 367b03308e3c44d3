// Prototypes: a weight-normalized linear layer without bias, the last layer of DINO's head
// (norm_last_layer) and SwAV's prototype vectors. Its input rows and its K weight rows are both
// divided by their norms, so each output is a cosine similarity in [-1, 1]:
//   logits = (z / |z|) (V / |V|)^T,  z (rows, dim) the head's output, V (K, dim) the prototypes.
// The gradient goes through both normalizations, to z and to V.
#pragma once
#include "core/params.h"
#include "ops/l2norm.h"
#include "ops/matmul.h"

typedef struct {
  int rows, dim, K;
  float *v, *dv;             // (K, dim) parameters: the online set's, or a teacher's copy (no dv)
  L2Norm w_unit;             // out (K, dim): V's rows normalized; its gradient goes to V's
  L2Norm z_unit;             // out (rows, dim); din (rows, dim) the input's gradient
  float *logits;             // (rows, K)
  Matmul fwd;                // logits = z_unit w_unit^T
  Matmul dz_mm, dw_mm;       // dz_unit = dlogits w_unit; dw_unit = dlogits^T z_unit (train only)
  float *dz_unit, *dw_unit;  // (rows, dim), (K, dim)
  // While set, backward hands V a zero gradient (SwAV keeps its prototypes fixed for its first
  // steps); the input's gradient is computed as ever.
  int frozen;
} Prototypes;

// Takes V (K, dim), called `name`, from ps, initialized N(0, 0.02); `train` 0: forward only.
void prototypes_init(Prototypes *p, ExecCtx *ctx, ParamSet *ps, const char *name, int rows, int dim,
                     int K, int train);
void prototypes_forward(Prototypes *p, ExecCtx *ctx, const float *z);
// dlogits (rows, K) -> z_unit.din, the input's gradient, and V's gradient, reported to ps.
void prototypes_backward(Prototypes *p, ExecCtx *ctx, const ParamSet *ps, const float *dlogits);
void prototypes_destroy(Prototypes *p);
