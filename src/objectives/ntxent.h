// NT-Xent (normalized temperature-scaled cross entropy), the SimCLR loss, on features gathered
// from all replicas. Rows are L2-normalized projections; this replica owns rows
// [row0, row0 + 2b) of the gathered (M, d) matrix, laid out as [view 0 of its b samples; view 1
// of the same samples], so the positive of local row j is row0 + (j + b) mod 2b. Every other
// row of the gathered matrix is a negative: 2B - 2 per query with B samples overall.
#pragma once
#include "ops/matmul.h"

typedef struct {
  int M;     // gathered rows (2B over all replicas)
  int rows;  // this replica's rows (2b)
  int d;     // feature dimension
  float temperature;
  Matmul sim;       // S = U_local U_all^T                (rows, M)
  Matmul grad_row;  // dU_row = dS U_all                  (rows, d)
  Matmul grad_col;  // dU_col = dS^T U_local              (M, d)
  float *logits;    // (rows, M) S / temperature, then softmax probabilities; MEM_ACT, loss
  float *dlogits;   // (rows, M) MEM_ACT_GRAD
  float *du_col;    // (M, d) MEM_ACT_GRAD
} NtXent;

void ntxent_init(NtXent *l, ExecCtx *ctx, int M, int rows, int d, float temperature);
// Returns the sum over this replica's rows of the per-row loss. `du_local` (rows, d) receives
// this replica's row-role gradient of (sum of all replicas' row losses) / M; `du_col` holds the
// column-role gradient for all M rows, which must be summed over replicas and sliced by the
// caller. u_local is the slice of u_all that this replica owns.
double ntxent_forward_backward(NtXent *l, ExecCtx *ctx, const float *u_all, const float *u_local,
                               int row0, float *du_local);
void ntxent_destroy(NtXent *l);
