#include "objectives/infonce.h"

#include <math.h>
#include <string.h>

void infonce_init(InfoNce *l, DnnlCtx *ctx, int n, int K, int d, float temperature) {
  memset(l, 0, sizeof *l);
  l->n = n;
  l->K = K;
  l->d = d;
  l->temperature = temperature;
  matmul_init(&l->neg, ctx, n, d, K, 0, 1, COMP_LOSS, 0);
  matmul_init(&l->grad, ctx, n, K, d, 0, 0, COMP_LOSS, 1);
  l->neg_logits = tl_alloc(sizeof(float) * (size_t)n * K, MEM_ACT, COMP_LOSS);
  l->pos_prob = tl_alloc(sizeof(float) * (size_t)n, MEM_ACT, COMP_LOSS);
}

// neg_logits (n, K) -> their gradient weights in place, pos_prob; returns the summed loss.
static double softmax_rows(InfoNce *l, const float *q, const float *k, const unsigned char *usable,
                           int mean_over) {
  const int n = l->n, K = l->K, d = l->d;
  const float inv_t = 1.0f / l->temperature;
  double loss_sum = 0;
#pragma omp parallel for reduction(+ : loss_sum) schedule(static)
  for (int i = 0; i < n; i++) {
    float *s = l->neg_logits + (size_t)i * K;
    double pos = 0;
    for (int j = 0; j < d; j++) pos += (double)q[(size_t)i * d + j] * k[(size_t)i * d + j];
    pos *= inv_t;
    double mx = pos;
    for (int j = 0; j < K; j++) {
      s[j] *= inv_t;
      if ((!usable || usable[j]) && s[j] > mx) mx = s[j];
    }
    double z = exp(pos - mx);
    for (int j = 0; j < K; j++)
      if (!usable || usable[j]) z += exp((double)s[j] - mx);
    double lse = mx + log(z);
    loss_sum += lse - pos;
    // Softmax probabilities scaled for the gradient: d loss_i / d logit_j = p_j - [j == 0].
    for (int j = 0; j < K; j++)
      s[j] = (!usable || usable[j]) ? (float)(exp((double)s[j] - lse) * inv_t / mean_over) : 0.0f;
    l->pos_prob[i] = (float)exp(pos - lse);
  }
  return loss_sum;
}

double infonce_forward_backward(InfoNce *l, DnnlCtx *ctx, const float *q, const float *k,
                                const float *bank, const unsigned char *usable, int mean_over,
                                float *dq) {
  const int n = l->n, K = l->K, d = l->d;
  const float inv_t = 1.0f / l->temperature;
  matmul_run(&l->neg, ctx, q, bank, l->neg_logits);
  double loss_sum = ctx->dry_run ? 0.0 : softmax_rows(l, q, k, usable, mean_over);
  // dq_i = sum_j p_ij n_j / t + (p_i0 - 1) k_i / t, all over mean_over.
  matmul_run(&l->grad, ctx, l->neg_logits, bank, dq);
  for (int i = 0; i < n && !ctx->dry_run; i++) {
    float c = (l->pos_prob[i] - 1.0f) * inv_t / (float)mean_over;
    for (int j = 0; j < d; j++) dq[(size_t)i * d + j] += c * k[(size_t)i * d + j];
  }
  ctx->flops_forward[COMP_LOSS] += 2.0 * n * d + 4.0 * n * K;
  ctx->flops_backward[COMP_LOSS] += 2.0 * n * d + 2.0 * n * K;
  return loss_sum;
}

void infonce_destroy(InfoNce *l) {
  matmul_destroy(&l->neg);
  matmul_destroy(&l->grad);
  tl_free(l->neg_logits);
  tl_free(l->pos_prob);
}
