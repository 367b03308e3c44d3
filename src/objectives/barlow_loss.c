#include "objectives/barlow_loss.h"

#include <math.h>
#include <string.h>

enum { VIEWS = 2 };
static const double BN_EPS = 1e-5;  // inside the square root, as BatchNorm1d's default

void barlow_loss_init(BarlowLoss *l, ExecCtx *ctx, int n, int b, int d, float lambda) {
  TL_ASSERT(n >= 2 && b >= 1 && b <= n && d >= 1);  // a standard deviation needs two samples
  *l = (BarlowLoss){.n = n, .b = b, .d = d, .lambda = lambda};
  matmul_init(&l->cross, ctx, d, n, d, 1, 0, COMP_LOSS, 0);
  matmul_init(&l->grad_a, ctx, n, d, d, 0, 1, COMP_LOSS, 1);
  matmul_init(&l->grad_b, ctx, n, d, d, 0, 0, COMP_LOSS, 1);
  l->standard = tl_alloc(sizeof(float) * VIEWS * (size_t)n * d, MEM_ACT, COMP_LOSS);
  l->inv_std = tl_alloc(sizeof(float) * VIEWS * (size_t)d, MEM_ACT, COMP_LOSS);
  l->corr = tl_alloc(sizeof(float) * (size_t)d * d, MEM_ACT, COMP_LOSS);
  l->dstandard = tl_alloc(sizeof(float) * (size_t)n * d, MEM_ACT_GRAD, COMP_LOSS);
}

// y (n, d) <- its columns standardized over the n rows (biased variance); inv_std (d) receives
// each column's 1 / sqrt(var + eps).
static void standardize_columns(float *y, float *inv_std, int n, int d) {
  for (int k = 0; k < d; k++) {
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += y[(size_t)i * d + k];
    const double mean = sum / n;
    for (int i = 0; i < n; i++) {
      const double c = y[(size_t)i * d + k] - mean;
      sq += c * c;
    }
    const double inv = 1.0 / sqrt(sq / n + BN_EPS);
    inv_std[k] = (float)inv;
    for (int i = 0; i < n; i++) y[(size_t)i * d + k] = (float)((y[(size_t)i * d + k] - mean) * inv);
  }
}

// dy (n, d), the gradient of the standardized y, <- the gradient of the embeddings before it:
// dz = inv_std * (dy - mean(dy) - y * mean(dy * y)), column by column (BatchNorm's backward with
// batch statistics and no affine parameters).
static void standardize_backward(const float *y, float *dy, const float *inv_std, int n, int d) {
  for (int k = 0; k < d; k++) {
    double sum = 0, dot = 0;
    for (int i = 0; i < n; i++) {
      const size_t at = (size_t)i * d + k;
      sum += dy[at];
      dot += (double)dy[at] * y[at];
    }
    const double mean_dy = sum / n, mean_dy_y = dot / n;
    for (int i = 0; i < n; i++) {
      const size_t at = (size_t)i * d + k;
      dy[at] = (float)(inv_std[k] * (dy[at] - mean_dy - y[at] * mean_dy_y));
    }
  }
}

// The two terms from S = Y_a^T Y_b (d, d), which is overwritten by G = dL/dc / n, the matrix that
// takes the gradient back to the standardized views (dY_a = Y_b G^T, dY_b = Y_a G).
static void correlation_terms(const BarlowLoss *l, float *s, double *on, double *off) {
  const int n = l->n, d = l->d;
  double on_sum = 0, off_sum = 0;
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++) {
      float *sij = s + (size_t)i * d + j;
      const double c = *sij / (double)n;
      if (i == j) {
        on_sum += (1 - c) * (1 - c);
        *sij = (float)(-2 * (1 - c) / n);
      } else {
        off_sum += c * c;
        *sij = (float)(2 * l->lambda * c / n);
      }
    }
  *on = on_sum;
  *off = off_sum;
}

double barlow_loss_forward_backward(BarlowLoss *l, ExecCtx *ctx, Comm *comm, const float *z,
                                    float *dz, BarlowTerms *terms) {
  const int n = l->n, d = l->d;
  const size_t bd = (size_t)l->b * d, nd = (size_t)n * d;
  float *ya = l->standard, *yb = l->standard + nd;
  size_t offset = 0;
  for (int v = 0; v < VIEWS; v++) {
    comm_allgather(comm, z + v * bd, bd, l->standard + v * nd, nd, &offset);
    if (!ctx->dry_run) standardize_columns(l->standard + v * nd, l->inv_std + (size_t)v * d, n, d);
  }
  matmul_run(&l->cross, ctx, ya, yb, l->corr);
  double on = 0, off = 0;
  if (!ctx->dry_run) correlation_terms(l, l->corr, &on, &off);

  // Each view's gradient through its standardization; this replica's rows are its slice.
  for (int v = 0; v < VIEWS; v++) {
    if (v == 0)
      matmul_run(&l->grad_a, ctx, yb, l->corr, l->dstandard);
    else
      matmul_run(&l->grad_b, ctx, ya, l->corr, l->dstandard);
    if (ctx->dry_run) continue;
    standardize_backward(l->standard + v * nd, l->dstandard, l->inv_std + (size_t)v * d, n, d);
    memcpy(dz + v * bd, l->dstandard + offset, sizeof(float) * bd);
  }
  // The elementwise work around the matmuls (one FLOP per add or multiply, roughly).
  ctx->flops_forward[COMP_LOSS] += VIEWS * 5.0 * nd + 4.0 * d * d;
  ctx->flops_backward[COMP_LOSS] += VIEWS * 7.0 * nd + 2.0 * d * d;

  // Every replica computed the same terms from the same gathered rows; rank 0's count, so that
  // the loss is bit-identical everywhere whatever each replica's thread count did to them.
  const int first = comm_rank(comm) == 0;
  double sums[2] = {first ? on : 0, first ? off : 0};
  comm_allreduce_sum_f64(comm, sums, 2);
  const BarlowTerms t = {sums[0], sums[1]};
  if (terms) *terms = t;
  return t.on_diagonal + l->lambda * t.off_diagonal;
}

void barlow_loss_destroy(BarlowLoss *l) {
  matmul_destroy(&l->cross);
  matmul_destroy(&l->grad_a);
  matmul_destroy(&l->grad_b);
  tl_free(l->standard);
  tl_free(l->inv_std);
  tl_free(l->corr);
  tl_free(l->dstandard);
}
