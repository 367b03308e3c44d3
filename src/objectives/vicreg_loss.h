// VICReg's loss (Bardes, Ponce & LeCun 2022), as facebookresearch/vicreg main_vicreg.py computes
// it, on the embeddings of the two views of a global batch of n samples (d = embedding width):
//
//   invariance  = mean over samples and dimensions of (z_a - z_b)^2
//   variance    = sum over views of mean_k relu(1 - sqrt(Var_k + 1e-4)) / 2   (Var unbiased, n - 1)
//   covariance  = sum over views of sum_{k != l} Cov_kl^2 / d,  Cov = Zc^T Zc / (n - 1)
//   loss        = sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance
//
// Variance and covariance are statistics of the whole global batch: each replica gathers every
// replica's embeddings (view by view, so the gathered rows are the global batch in sample order)
// and computes them all; the gradient of this replica's rows is then its slice of the gathered
// gradient. The invariance term is a sum over samples, so each replica takes its own rows.
#pragma once
#include "ops/matmul.h"
#include "parallel/comm.h"

typedef struct {
  double invariance, variance, covariance;  // the three terms, before their coefficients
} VicRegTerms;

typedef struct {
  int n;  // samples per view over all replicas (the global batch)
  int b;  // this replica's samples
  int d;  // embedding width
  float sim_coeff, std_coeff, cov_coeff;
  Matmul gram;       // S = Zc^T Zc                      (d, d) from (n, d)
  Matmul gram_grad;  // dZc = Zc (dL/dS + dL/dS^T)       (n, d)
  float *centered;   // (2, n, d) gathered embeddings of each view minus their mean; MEM_ACT loss
  float *gram_out;   // (2, d, d) S, then dL/dS + its transpose; MEM_ACT loss
  float *dcentered;  // (n, d) gradient of one view's gathered rows; MEM_ACT_GRAD loss
} VicRegLoss;

void vicreg_loss_init(VicRegLoss *l, ExecCtx *ctx, int n, int b, int d, float sim_coeff,
                      float std_coeff, float cov_coeff);
// z: (2b, d) this replica's embeddings, [view 0 of its b samples; view 1 of the same samples].
// dz: (2b, d) receives d(loss)/dz for these rows, where loss is the global one this returns
// (identical on every replica). `terms` (may be NULL) receives the unweighted terms.
double vicreg_loss_forward_backward(VicRegLoss *l, ExecCtx *ctx, Comm *comm, const float *z,
                                    float *dz, VicRegTerms *terms);
void vicreg_loss_destroy(VicRegLoss *l);
