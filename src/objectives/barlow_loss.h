// Barlow Twins' loss (Zbontar, Jing, Misra, LeCun & Deny 2021), on the embeddings of the two views
// of a global batch of n samples (d = embedding width):
//
//   y_a, y_b = z_a, z_b with each column standardized over the n samples: (z - mean) / sqrt(var +
//              1e-5), var biased (BatchNorm1d without affine parameters, in training mode)
//   c        = y_a^T y_b / n                                       (d, d) cross-correlation
//   loss     = sum_i (1 - c_ii)^2  +  lambda * sum_{i != j} c_ij^2
//
// The standardization and c are statistics of the whole global batch: each replica gathers every
// replica's embeddings (view by view, so the gathered rows are the global batch in sample order)
// and computes them all; the gradient of this replica's rows is then its slice of the gathered
// gradient.
#pragma once
#include "ops/matmul.h"
#include "parallel/comm.h"

typedef struct {
  double on_diagonal;   // sum_i (1 - c_ii)^2
  double off_diagonal;  // sum_{i != j} c_ij^2, before lambda
} BarlowTerms;

typedef struct {
  int n;  // samples per view over all replicas (the global batch)
  int b;  // this replica's samples
  int d;  // embedding width
  float lambda;
  Matmul cross;      // C = Y_a^T Y_b                      (d, d) from two (n, d)
  Matmul grad_a;     // dY_a = Y_b G^T                     (n, d)
  Matmul grad_b;     // dY_b = Y_a G                       (n, d)
  float *standard;   // (2, n, d) gathered embeddings of each view, standardized; MEM_ACT loss
  float *inv_std;    // (2, d) 1 / sqrt(var + eps) of each view's columns; MEM_ACT loss
  float *corr;       // (d, d) Y_a^T Y_b, then G = dL/dc / n; MEM_ACT loss
  float *dstandard;  // (n, d) gradient of one view's standardized rows; MEM_ACT_GRAD loss
} BarlowLoss;

void barlow_loss_init(BarlowLoss *l, ExecCtx *ctx, int n, int b, int d, float lambda);
// z: (2b, d) this replica's embeddings, [view a of its b samples; view b of the same samples].
// dz: (2b, d) receives d(loss)/dz for these rows, where loss is the global one this returns
// (identical on every replica). `terms` (may be NULL) receives the unweighted terms.
double barlow_loss_forward_backward(BarlowLoss *l, ExecCtx *ctx, Comm *comm, const float *z,
                                    float *dz, BarlowTerms *terms);
void barlow_loss_destroy(BarlowLoss *l);
