// InfoNCE with one positive and a bank of negatives (MoCo's loss): for each query q_i,
// logits = [q_i . n_1, ..., q_i . n_K, q_i . k_i] / t and cross entropy with the positive in the
// last column. Negatives that are not usable (too old) are left out of the softmax.
#pragma once
#include "ops/matmul.h"
#include "ops/softmax.h"

typedef struct {
  int n, K, d;
  float temperature;
  Matmul neg;          // (n, d) x (K, d)^T -> the first K columns of `logits`
  Matmul grad;         // the first K columns of `logits` (n, K) x (K, d) -> (n, d)
  float *logits;       // (n, K + 1) logits, then probabilities; MEM_ACT loss
  float *q_scaled;     // (n, d) q / t
  RowSoftmax softmax;  // rows of `logits` in place
} InfoNce;

// Below this positive probability a query's loss is recomputed in double: -log of a float
// that small has lost its digits.
#define INFONCE_MIN_PROB 1e-30f

void infonce_init(InfoNce *l, ExecCtx *ctx, int n, int K, int d, float temperature);
// q, k: (n, d) normalized; bank: (K, d); usable: (K) 0/1 (NULL = all). Returns the sum of the
// n per-query losses; dq (n, d) receives d(sum / mean_over)/dq. The key gets no gradient.
double infonce_forward_backward(InfoNce *l, ExecCtx *ctx, const float *q, const float *k,
                                const float *bank, const unsigned char *usable, int mean_over,
                                float *dq);
void infonce_destroy(InfoNce *l);
