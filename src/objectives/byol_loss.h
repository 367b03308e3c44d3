// BYOL's regression loss (Grill et al. 2020, eq. 2 and its symmetrized sum): the online
// network's prediction p of one view is pulled toward the target network's projection z' of the
// other view, both L2-normalized: 2 - 2 cos(p, z') = ||p/|p| - z'/|z'|||^2. There are no
// negatives, and z' is a constant (the target is never back-propagated). Rows are laid out as
// [view 0 of b samples; view 1 of the same samples], so row j's partner is (j + b) mod 2b, and
// one call sums both view orders.
#pragma once
#include "ops/l2norm.h"

typedef struct {
  int rows;        // 2b
  int d;           // projection dimension
  L2Norm p_unit;   // the predictions normalized, kept for backward (MEM_ACT loss)
  L2Norm z_unit;   // the target projections normalized, no gradient (MEM_WORKSPACE loss)
  float *dp_unit;  // (rows, d) MEM_ACT_GRAD loss
} ByolLoss;

// Its normalizations on `b`'s context (COMP_LOSS; b's mode and parameters do not matter).
void byol_loss_init(ByolLoss *l, const Builder *b, int rows, int d);
// p: (rows, d) online predictions; z: (rows, d) target projections, same layout. Returns the sum
// over the b = rows / 2 samples of the symmetric per-sample loss
// (2 - 2 cos(p_i, z'_{i+b})) + (2 - 2 cos(p_{i+b}, z'_i)); dp (rows, d) receives
// d(sum / mean_over)/dp. Counts its FLOPs in ctx (COMP_LOSS).
double byol_loss_forward_backward(ByolLoss *l, ExecCtx *ctx, const float *p, const float *z,
                                  int mean_over, float *dp);
void byol_loss_destroy(ByolLoss *l);
