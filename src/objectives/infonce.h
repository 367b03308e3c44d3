// InfoNCE with one positive and a bank of negatives (MoCo's loss): for each query q_i,
// logits = [q_i . k_i, q_i . n_1, ..., q_i . n_K] / t and cross entropy with the positive at
// index 0. Negatives that are not usable (too old) are left out of the softmax.
#pragma once
#include "ops/matmul.h"

typedef struct {
  int n, K, d;
  float temperature;
  Matmul neg;         // (n, d) x (K, d)^T -> (n, K)
  Matmul grad;        // (n, K) x (K, d)   -> (n, d)
  float *neg_logits;  // (n, K) logits, then probabilities; MEM_ACT loss
  float *pos_prob;    // (n)
} InfoNce;

void infonce_init(InfoNce *l, DnnlCtx *ctx, int n, int K, int d, float temperature);
// q, k: (n, d) normalized; bank: (K, d); usable: (K) 0/1 (NULL = all). Returns the sum of the
// n per-query losses; dq (n, d) receives d(sum / mean_over)/dq. The key gets no gradient.
double infonce_forward_backward(InfoNce *l, DnnlCtx *ctx, const float *q, const float *k,
                                const float *bank, const unsigned char *usable, int mean_over,
                                float *dq);
void infonce_destroy(InfoNce *l);
