#include "objectives/dino_loss.h"

#include "objectives/crop_cross_entropy.h"

#include <math.h>
#include <string.h>

int dino_loss_pairs(int global, int views) { return crop_pairs(global, views); }

void dino_loss_init(DinoLoss *l, ExecCtx *ctx, int b, int global, int views, int K) {
  memset(l, 0, sizeof *l);
  l->b = b, l->global = global, l->views = views, l->K = K;
  l->q = tl_alloc(sizeof(float) * (size_t)global * b * K, MEM_WORKSPACE, COMP_LOSS);
  l->logp = tl_alloc(sizeof(float) * (size_t)views * b * K, MEM_ACT, COMP_LOSS);
  row_softmax_init(&l->teacher_softmax, ctx, global * b, K, SOFTMAX_PROBS);
  row_softmax_init(&l->student_log_softmax, ctx, views * b, K, SOFTMAX_LOG_PROBS);
}

double dino_loss_forward_backward(DinoLoss *l, ExecCtx *ctx, const float *student,
                                  const float *teacher, const float *center, float student_temp,
                                  float teacher_temp, int mean_over, float *dstudent) {
  const int b = l->b, G = l->global, V = l->views, K = l->K;
  const size_t t_n = (size_t)G * b * K, s_n = (size_t)V * b * K;
  const int pairs = dino_loss_pairs(G, V);
  if (!ctx->dry_run) {
    for (size_t r = 0; r < (size_t)G * b; r++)
      for (int k = 0; k < K; k++) l->q[r * K + k] = (teacher[r * K + k] - center[k]) / teacher_temp;
    for (size_t i = 0; i < s_n; i++) l->logp[i] = student[i] / student_temp;
  }
  row_softmax_run(&l->teacher_softmax, ctx, l->q);
  row_softmax_run(&l->student_log_softmax, ctx, l->logp);
  double loss_sum = 0;
  if (!ctx->dry_run)
    loss_sum = crop_cross_entropy(l->q, l->logp, b, G, V, K, student_temp, mean_over, dstudent);
  // Centre and scale (2) and softmax (5) per teacher entry; scale (1) and log-softmax (5) per
  // student entry; a multiply-add per entry of each pair. Back: exp and scale (3) per student
  // entry, a subtraction per entry of each pair.
  ctx->flops_forward[COMP_LOSS] += 7.0 * t_n + 6.0 * s_n + 2.0 * pairs * (double)b * K;
  ctx->flops_backward[COMP_LOSS] += 3.0 * s_n + (double)pairs * b * K;
  return loss_sum;
}

void dino_loss_destroy(DinoLoss *l) {
  row_softmax_destroy(&l->teacher_softmax);
  row_softmax_destroy(&l->student_log_softmax);
  tl_free(l->q);
  tl_free(l->logp);
}
