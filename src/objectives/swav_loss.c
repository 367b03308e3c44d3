#include "objectives/swav_loss.h"

#include <math.h>
#include <string.h>

#include "objectives/crop_cross_entropy.h"

void swav_loss_init(SwavLoss *l, ExecCtx *ctx, int b, int global_batch, int global, int views,
                    int K, float temperature, float epsilon, int iterations) {
  memset(l, 0, sizeof *l);
  l->b = b, l->global = global, l->views = views, l->K = K, l->global_batch = global_batch;
  l->temperature = temperature, l->epsilon = epsilon, l->iterations = iterations;
  l->Q = tl_alloc(sizeof(double) * (size_t)b * K, MEM_WORKSPACE, COMP_LOSS);
  l->prototype_sums = tl_alloc(sizeof(double) * (size_t)K, MEM_WORKSPACE, COMP_LOSS);
  l->q = tl_alloc(sizeof(float) * (size_t)global * b * K, MEM_WORKSPACE, COMP_LOSS);
  l->logp = tl_alloc(sizeof(float) * (size_t)views * b * K, MEM_ACT, COMP_LOSS);
  row_softmax_init(&l->log_softmax, ctx, views * b, K, SOFTMAX_LOG_PROBS);
}

// Q's rows i (samples) each scaled to sum to `to`.
static void scale_samples(double *Q, int b, int K, double to) {
  for (int i = 0; i < b; i++) {
    double *row = Q + (size_t)i * K, sum = 0;
    for (int k = 0; k < K; k++) sum += row[k];
    for (int k = 0; k < K; k++) row[k] = row[k] / sum * to;
  }
}

void swav_sinkhorn(SwavLoss *l, ExecCtx *ctx, Comm *comm, const float *scores, float *q) {
  const int b = l->b, K = l->K, B = l->global_batch;
  const size_t n = (size_t)b * K;
  const int real = !ctx->dry_run;
  double total = 0;
  for (size_t e = 0; e < n && real; e++) total += l->Q[e] = exp((double)scores[e] / l->epsilon);
  comm_allreduce_sum_f64(comm, &total, 1);
  for (size_t e = 0; e < n && real; e++) l->Q[e] /= total;
  for (int it = 0; it < l->iterations; it++) {
    memset(l->prototype_sums, 0, sizeof(double) * K);
    for (size_t e = 0; e < n && real; e++) l->prototype_sums[e % K] += l->Q[e];
    comm_allreduce_sum_f64(comm, l->prototype_sums, (size_t)K);
    for (size_t e = 0; e < n && real; e++) l->Q[e] /= l->prototype_sums[e % K] * K;
    if (real) scale_samples(l->Q, b, K, 1.0 / B);
  }
  for (size_t e = 0; e < n && real; e++) q[e] = (float)(l->Q[e] * B);
  // exp and a division per entry, then per iteration two sums and two divisions.
  ctx->flops_forward[COMP_LOSS] += (2.0 + 4.0 * l->iterations) * (double)n;
}

double swav_loss_forward_backward(SwavLoss *l, ExecCtx *ctx, Comm *comm, const float *scores,
                                  int mean_over, float *dscores) {
  const int b = l->b, G = l->global, V = l->views, K = l->K;
  const size_t one_crop = (size_t)b * K, s_n = (size_t)V * one_crop;
  for (int g = 0; g < G; g++)
    swav_sinkhorn(l, ctx, comm, scores + g * one_crop, l->q + g * one_crop);
  for (size_t i = 0; i < s_n && !ctx->dry_run; i++) l->logp[i] = scores[i] / l->temperature;
  row_softmax_run(&l->log_softmax, ctx, l->logp);
  double loss_sum = 0;
  if (!ctx->dry_run)
    loss_sum = crop_cross_entropy(l->q, l->logp, b, G, V, K, l->temperature, mean_over, dscores);
  // Scale (1) and log-softmax (5) per score; a multiply-add per entry of each pair. Back: exp
  // and scale (3) per score, a subtraction per entry of each pair.
  const int pairs = crop_pairs(G, V);
  ctx->flops_forward[COMP_LOSS] += 6.0 * s_n + 2.0 * pairs * (double)one_crop;
  ctx->flops_backward[COMP_LOSS] += 3.0 * s_n + (double)pairs * one_crop;
  return loss_sum;
}

void swav_loss_destroy(SwavLoss *l) {
  row_softmax_destroy(&l->log_softmax);
  tl_free(l->Q);
  tl_free(l->prototype_sums);
  tl_free(l->q);
  tl_free(l->logp);
}
