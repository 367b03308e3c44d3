#include "objectives/infonce.h"

#include <math.h>
#include <string.h>

void infonce_init(InfoNce *l, ExecCtx *ctx, int n, int K, int d, float temperature) {
  memset(l, 0, sizeof *l);
  l->n = n;
  l->K = K;
  l->d = d;
  l->temperature = temperature;
  const int row = K + 1;
  matmul_init_ld(&l->neg, ctx, n, d, K, 0, 1, 0, row, COMP_LOSS, 0);
  matmul_init_ld(&l->grad, ctx, n, K, d, 0, 0, row, 0, COMP_LOSS, 1);
  row_softmax_init(&l->softmax, ctx, n, row, SOFTMAX_PROBS);
  l->logits = tl_alloc(sizeof(float) * (size_t)n * row, MEM_ACT, COMP_LOSS);
  l->q_scaled = tl_alloc(sizeof(float) * (size_t)n * d, MEM_ACT, COMP_LOSS);
}

// Query i's loss from its logits recomputed in double, for when its positive's probability is
// too small for a float (a temperature far below the logits' spread).
static double row_loss_exact(const InfoNce *l, int i, const float *k, const float *bank,
                             const unsigned char *usable) {
  const int K = l->K, d = l->d;
  const float *q = l->q_scaled + (size_t)i * d;
  double pos = 0, mx, z = 0;
  for (int e = 0; e < d; e++) pos += (double)q[e] * k[(size_t)i * d + e];
  mx = pos;
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < K; j++) {
      if (usable && !usable[j]) continue;
      double s = 0;
      for (int e = 0; e < d; e++) s += (double)q[e] * bank[(size_t)j * d + e];
      if (pass == 0 && s > mx) mx = s;
      if (pass == 1) z += exp(s - mx);
    }
  z += exp(pos - mx);
  return mx + log(z) - pos;
}

double infonce_forward_backward(InfoNce *l, ExecCtx *ctx, const float *q, const float *k,
                                const float *bank, const unsigned char *usable, int mean_over,
                                float *dq) {
  const int n = l->n, K = l->K, d = l->d, row = K + 1;
  const float inv_t = 1.0f / l->temperature;
  int masked = 0;
  for (int j = 0; usable && !ctx->dry_run && j < K && !masked; j++) masked = !usable[j];
  if (!ctx->dry_run)
    for (size_t i = 0; i < (size_t)n * d; i++) l->q_scaled[i] = q[i] * inv_t;
  matmul_run(&l->neg, ctx, l->q_scaled, bank, l->logits);
  double loss_sum = 0;
  if (!ctx->dry_run) {
    for (int i = 0; i < n; i++) {
      float *s = l->logits + (size_t)i * row;
      double pos = 0;
      for (int j = 0; j < d; j++)
        pos += (double)l->q_scaled[(size_t)i * d + j] * k[(size_t)i * d + j];
      s[K] = (float)pos;
      for (int j = 0; masked && j < K; j++)
        if (!usable[j]) s[j] = -INFINITY;
    }
  }
  // Rows of probabilities in place (exp(-inf) is 0); the loss is minus the positive's log.
  row_softmax_run(&l->softmax, ctx, l->logits);
  for (int i = 0; i < n && !ctx->dry_run; i++) {
    float *p = l->logits + (size_t)i * row;
    loss_sum +=
        p[K] >= INFONCE_MIN_PROB ? -log((double)p[K]) : row_loss_exact(l, i, k, bank, usable);
    for (int j = 0; masked && j < K; j++)
      if (!usable[j]) p[j] = 0.0f;
  }
  // d loss_i / d logit_j = p_j - [j is the positive], logit = q . x / t, all over mean_over:
  // dq_i = (sum_j p_ij n_j + (p_i,pos - 1) k_i) / (t mean_over).
  matmul_run(&l->grad, ctx, l->logits, bank, dq);
  const float c = inv_t / (float)mean_over;
  for (int i = 0; i < n && !ctx->dry_run; i++) {
    float w = l->logits[(size_t)i * row + K] - 1.0f;
    for (int j = 0; j < d; j++)
      dq[(size_t)i * d + j] = c * (dq[(size_t)i * d + j] + w * k[(size_t)i * d + j]);
  }
  ctx->flops_forward[COMP_LOSS] += 2.0 * n * d + 4.0 * n * K;
  ctx->flops_backward[COMP_LOSS] += 2.0 * n * d + 2.0 * n * K;
  return loss_sum;
}

void infonce_destroy(InfoNce *l) {
  matmul_destroy(&l->neg);
  matmul_destroy(&l->grad);
  row_softmax_destroy(&l->softmax);
  tl_free(l->logits);
  tl_free(l->q_scaled);
}
