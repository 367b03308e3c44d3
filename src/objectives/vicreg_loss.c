#include "objectives/vicreg_loss.h"

#include <math.h>
#include <string.h>

enum { VIEWS = 2 };
static const double VAR_EPS = 1e-4;  // inside the square root, as the reference
static const double STD_TARGET = 1;  // gamma: each dimension's standard deviation is pushed to 1

void vicreg_loss_init(VicRegLoss *l, ExecCtx *ctx, int n, int b, int d, float sim_coeff,
                      float std_coeff, float cov_coeff) {
  TL_ASSERT(n >= 2 && b >= 1 && b <= n && d >= 1);  // unbiased variance needs two samples
  memset(l, 0, sizeof *l);
  *l = (VicRegLoss){.n = n,
                    .b = b,
                    .d = d,
                    .sim_coeff = sim_coeff,
                    .std_coeff = std_coeff,
                    .cov_coeff = cov_coeff};
  matmul_init(&l->gram, ctx, d, n, d, 1, 0, COMP_LOSS, 0);
  matmul_init(&l->gram_grad, ctx, n, d, d, 0, 0, COMP_LOSS, 1);
  l->centered = tl_alloc(sizeof(float) * VIEWS * (size_t)n * d, MEM_ACT, COMP_LOSS);
  l->gram_out = tl_alloc(sizeof(float) * VIEWS * (size_t)d * d, MEM_ACT, COMP_LOSS);
  l->dcentered = tl_alloc(sizeof(float) * (size_t)n * d, MEM_ACT_GRAD, COMP_LOSS);
}

// z (n, d) <- z minus its column means.
static void center_columns(float *z, int n, int d) {
  for (int k = 0; k < d; k++) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += z[(size_t)i * d + k];
    const float mean = (float)(sum / n);
    for (int i = 0; i < n; i++) z[(size_t)i * d + k] -= mean;
  }
}

// One view's variance and covariance terms from its Gram matrix S = Zc^T Zc (d, d), which is
// overwritten by dL/dS + dL/dS^T, the matrix that takes the gradient back to Zc (dZc = Zc H).
static void regularizers(VicRegLoss *l, float *s, double *variance, double *covariance) {
  const int d = l->d;
  const double inv_n1 = 1.0 / (l->n - 1);
  double var_sum = 0, cov_sum = 0;
  for (int k = 0; k < d; k++) {
    float *skk = s + (size_t)k * d + k;
    const double sd = sqrt(*skk * inv_n1 + VAR_EPS);
    // variance = mean_k relu(1 - sd_k) / 2 per view; d sd_k / d S_kk = 1 / (2 sd_k (n - 1)).
    const double g = sd < STD_TARGET ? -l->std_coeff / (2.0 * d) * inv_n1 / (2.0 * sd) : 0.0;
    if (sd < STD_TARGET) var_sum += STD_TARGET - sd;
    *skk = (float)(2 * g);
  }
  // covariance = sum_{k != j} (S_kj / (n - 1))^2 / d; S is symmetric, so each pair counts twice.
  const double gc = 2.0 * l->cov_coeff * inv_n1 * inv_n1 / d;
  for (int k = 0; k < d; k++)
    for (int j = k + 1; j < d; j++) {
      float *skj = s + (size_t)k * d + j, *sjk = s + (size_t)j * d + k;
      const double ckj = *skj * inv_n1, cjk = *sjk * inv_n1;
      cov_sum += ckj * ckj + cjk * cjk;
      const float h = (float)(gc * ((double)*skj + *sjk));
      *skj = *sjk = h;
    }
  *variance = var_sum / d / 2;
  *covariance = cov_sum / d;
}

double vicreg_loss_forward_backward(VicRegLoss *l, ExecCtx *ctx, Comm *comm, const float *z,
                                    float *dz, VicRegTerms *terms) {
  const int n = l->n, d = l->d;
  const size_t bd = (size_t)l->b * d, nd = (size_t)n * d;
  // Invariance on this replica's rows; its gradient is d/dz of sim_coeff * sum (za - zb)^2 / (n d).
  double inv_sum = 0;
  const float g_inv = (float)(2.0 * l->sim_coeff / ((double)n * d));
  for (size_t i = 0; i < bd && !ctx->dry_run; i++) {
    const float diff = z[i] - z[bd + i];
    inv_sum += (double)diff * diff;
    dz[i] = g_inv * diff;
    dz[bd + i] = -g_inv * diff;
  }
  double variance = 0, covariance = 0;
  for (int v = 0; v < VIEWS; v++) {
    float *zc = l->centered + v * nd, *s = l->gram_out + (size_t)v * d * d;
    size_t offset;
    comm_allgather(comm, z + v * bd, bd, zc, nd, &offset);
    if (!ctx->dry_run) center_columns(zc, n, d);
    matmul_run(&l->gram, ctx, zc, zc, s);
    double var_v = 0, cov_v = 0;
    if (!ctx->dry_run) regularizers(l, s, &var_v, &cov_v);
    variance += var_v;
    covariance += cov_v;
    // The centring's own backward (subtracting the column means of dZc) is the identity here:
    // dZc = Zc H, and Zc's columns already have mean zero.
    matmul_run(&l->gram_grad, ctx, zc, s, l->dcentered);
    const float *mine = l->dcentered + offset;
    for (size_t i = 0; i < bd && !ctx->dry_run; i++) dz[v * bd + i] += mine[i];
  }
  // The elementwise work around the matmuls (one FLOP per add or multiply, roughly).
  ctx->flops_forward[COMP_LOSS] += 3.0 * bd + VIEWS * (2.0 * nd + 4.0 * d * d);
  ctx->flops_backward[COMP_LOSS] += 2.0 * bd + VIEWS * (1.0 * bd + 3.0 * d * d);

  // Every replica computed the same regularizers from the same gathered rows; rank 0's count, so
  // that the loss is bit-identical everywhere whatever each replica's thread count did to them.
  const int first = comm_rank(comm) == 0;
  double sums[3] = {inv_sum, first ? variance : 0, first ? covariance : 0};
  comm_allreduce_sum_f64(comm, sums, 3);
  VicRegTerms t = {sums[0] / (double)nd, sums[1], sums[2]};
  if (terms) *terms = t;
  return l->sim_coeff * t.invariance + l->std_coeff * t.variance + l->cov_coeff * t.covariance;
}

void vicreg_loss_destroy(VicRegLoss *l) {
  matmul_destroy(&l->gram);
  matmul_destroy(&l->gram_grad);
  tl_free(l->centered);
  tl_free(l->gram_out);
  tl_free(l->dcentered);
}
