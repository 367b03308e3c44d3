#include "objectives/byol_loss.h"

#include "objectives/ntxent.h"

void byol_loss_init(ByolLoss *l, int rows, int d) {
  l->rows = rows;
  l->d = d;
  size_t rd = (size_t)rows * d;
  l->p_unit = tl_alloc(sizeof(float) * rd, MEM_ACT, COMP_LOSS);
  l->p_norms = tl_alloc(sizeof(float) * (size_t)rows, MEM_ACT, COMP_LOSS);
  l->z_unit = tl_alloc(sizeof(float) * rd, MEM_WORKSPACE, COMP_LOSS);
  l->z_norms = tl_alloc(sizeof(float) * (size_t)rows, MEM_WORKSPACE, COMP_LOSS);
  l->dp_unit = tl_alloc(sizeof(float) * rd, MEM_ACT_GRAD, COMP_LOSS);
}

static double loss_and_grad(ByolLoss *l, const float *p, const float *z, int mean_over, float *dp) {
  const int rows = l->rows, b = rows / 2, d = l->d;
  l2norm_forward(p, l->p_unit, l->p_norms, rows, d);
  l2norm_forward(z, l->z_unit, l->z_norms, rows, d);
  // d(2 - 2 u.v)/du = -2 v, over mean_over samples; v is the partner's target.
  const float g = -2.0f / (float)mean_over;
  double loss_sum = 0;
  for (int j = 0; j < rows; j++) {
    const float *u = l->p_unit + (size_t)j * d, *v = l->z_unit + (size_t)((j + b) % rows) * d;
    float *du = l->dp_unit + (size_t)j * d;
    double dot = 0;
    for (int k = 0; k < d; k++) {
      dot += (double)u[k] * v[k];
      du[k] = g * v[k];
    }
    loss_sum += 2.0 - 2.0 * dot;
  }
  l2norm_backward(l->p_unit, l->p_norms, l->dp_unit, dp, rows, d);
  return loss_sum;
}

double byol_loss_forward_backward(ByolLoss *l, DnnlCtx *ctx, const float *p, const float *z,
                                  int mean_over, float *dp) {
  const int rows = l->rows, d = l->d;
  double loss_sum = ctx->dry_run ? 0.0 : loss_and_grad(l, p, z, mean_over, dp);
  // Normalizing: square-add and divide per entry (3), for p and z; the dot products (2). Back:
  // the scaled partner (1), then the normalization's backward (dot, multiply, subtract, divide).
  ctx->flops_forward[COMP_LOSS] += 8.0 * rows * d;
  ctx->flops_backward[COMP_LOSS] += 6.0 * rows * d;
  return loss_sum;
}

void byol_loss_destroy(ByolLoss *l) {
  tl_free(l->p_unit);
  tl_free(l->p_norms);
  tl_free(l->z_unit);
  tl_free(l->z_norms);
  tl_free(l->dp_unit);
}
