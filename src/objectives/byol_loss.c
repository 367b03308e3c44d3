#include "objectives/byol_loss.h"

void byol_loss_init(ByolLoss *l, const Builder *b, int rows, int d) {
  l->rows = rows;
  l->d = d;
  Builder loss = {.ctx = b->ctx, .mode = OP_TRAIN, .component = COMP_LOSS};
  l2norm_init(&l->p_unit, &loss, rows, d, 0);
  loss.mode = OP_FORWARD;
  l2norm_init(&l->z_unit, &loss, rows, d, 0);
  l->dp_unit = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, COMP_LOSS);
}

// The loss from the unit rows, and its gradient with respect to p's.
static double loss_and_grad(ByolLoss *l, int mean_over) {
  const int rows = l->rows, b = rows / 2, d = l->d;
  // d(2 - 2 u.v)/du = -2 v, over mean_over samples; v is the partner's target.
  const float g = -2.0f / (float)mean_over;
  double loss_sum = 0;
  for (int j = 0; j < rows; j++) {
    const float *u = l->p_unit.out + (size_t)j * d;
    const float *v = l->z_unit.out + (size_t)((j + b) % rows) * d;
    float *du = l->dp_unit + (size_t)j * d;
    double dot = 0;
    for (int k = 0; k < d; k++) {
      dot += (double)u[k] * v[k];
      du[k] = g * v[k];
    }
    loss_sum += 2.0 - 2.0 * dot;
  }
  return loss_sum;
}

double byol_loss_forward_backward(ByolLoss *l, ExecCtx *ctx, const float *p, const float *z,
                                  int mean_over, float *dp) {
  const int rows = l->rows, d = l->d;
  l2norm_forward(&l->p_unit, ctx, p);
  l2norm_forward(&l->z_unit, ctx, z);
  double loss_sum = ctx->dry_run ? 0.0 : loss_and_grad(l, mean_over);
  l2norm_backward_to(&l->p_unit, ctx, l->dp_unit, dp);
  // Beside the normalizations' own: the dot products (2); back, the scaled partner (2).
  ctx->flops_forward[COMP_LOSS] += 2.0 * rows * d;
  ctx->flops_backward[COMP_LOSS] += 2.0 * rows * d;
  return loss_sum;
}

void byol_loss_destroy(ByolLoss *l) {
  l2norm_destroy(&l->p_unit);
  l2norm_destroy(&l->z_unit);
  tl_free(l->dp_unit);
}
