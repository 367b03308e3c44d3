#include "objectives/ntxent.h"

#include <math.h>
#include <string.h>

void ntxent_init(NtXent *l, ExecCtx *ctx, int M, int rows, int d, float temperature) {
  memset(l, 0, sizeof *l);
  l->M = M;
  l->rows = rows;
  l->d = d;
  l->temperature = temperature;
  matmul_init(&l->sim, ctx, rows, d, M, 0, 1, COMP_LOSS, 0);
  matmul_init(&l->grad_row, ctx, rows, M, d, 0, 0, COMP_LOSS, 1);
  matmul_init(&l->grad_col, ctx, M, rows, d, 1, 0, COMP_LOSS, 1);
  l->logits = tl_alloc(sizeof(float) * (size_t)rows * M, MEM_ACT, COMP_LOSS);
  l->dlogits = tl_alloc(sizeof(float) * (size_t)rows * M, MEM_ACT_GRAD, COMP_LOSS);
  l->du_col = tl_alloc(sizeof(float) * (size_t)M * d, MEM_ACT_GRAD, COMP_LOSS);
}

// logits (rows, M) of similarities -> softmax probabilities in place, and dlogits; returns the
// rows' summed loss.
static double softmax_rows(NtXent *l, int row0) {
  const int M = l->M, rows = l->rows, b = rows / 2;
  const float inv_t = 1.0f / l->temperature;
  double loss_sum = 0;
#pragma omp parallel for reduction(+ : loss_sum) schedule(static)
  for (int j = 0; j < rows; j++) {
    float *s = l->logits + (size_t)j * M;
    float *ds = l->dlogits + (size_t)j * M;
    const int self = row0 + j, pos = row0 + (j + b) % rows;
    float mx = -INFINITY;
    for (int k = 0; k < M; k++) {
      s[k] *= inv_t;
      if (k != self && s[k] > mx) mx = s[k];
    }
    double z = 0;
    for (int k = 0; k < M; k++) z += k == self ? 0.0 : exp((double)(s[k] - mx));
    double lse = mx + log(z);
    loss_sum += lse - s[pos];
    // d(loss_j / M) / d s_jk = (softmax_jk - [k == pos]) / M, with the self-similarity masked.
    for (int k = 0; k < M; k++) {
      double p = k == self ? 0.0 : exp((double)s[k] - lse);
      s[k] = (float)p;
      ds[k] = (float)((p - (k == pos)) / M);
    }
  }
  return loss_sum;
}

static void scale(float *x, size_t n, float by) {
  for (size_t i = 0; i < n; i++) x[i] *= by;
}

double ntxent_forward_backward(NtXent *l, ExecCtx *ctx, const float *u_all, const float *u_local,
                               int row0, float *du_local) {
  const int M = l->M, rows = l->rows;
  const float inv_t = 1.0f / l->temperature;
  matmul_run(&l->sim, ctx, u_local, u_all, l->logits);
  double loss_sum = ctx->dry_run ? 0.0 : softmax_rows(l, row0);
  // s = u_i . u_k / t, so ds/du_i = u_k / t (row role) and ds/du_k = u_i / t (column role).
  matmul_run(&l->grad_row, ctx, l->dlogits, u_all, du_local);
  matmul_run(&l->grad_col, ctx, l->dlogits, u_local, l->du_col);
  if (!ctx->dry_run) {
    scale(du_local, (size_t)rows * l->d, inv_t);
    scale(l->du_col, (size_t)M * l->d, inv_t);
  }
  ctx->flops_forward[COMP_LOSS] += 5.0 * rows * M;
  ctx->flops_backward[COMP_LOSS] += 2.0 * rows * M;
  return loss_sum;
}

void ntxent_destroy(NtXent *l) {
  matmul_destroy(&l->sim);
  matmul_destroy(&l->grad_row);
  matmul_destroy(&l->grad_col);
  tl_free(l->logits);
  tl_free(l->dlogits);
  tl_free(l->du_col);
}
