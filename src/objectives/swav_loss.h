// SwAV's loss (Caron et al. 2020; facebookresearch/swav main_swav.py), without the queue. The
// scores s are every crop's cosines to the K prototypes. For each of the G global crops, its
// codes q come from the Sinkhorn-Knopp algorithm over the *global* batch of B samples:
//   Q = exp(s / epsilon)^T (K, B), divided by its total; then `iterations` times
//   Q_k. <- Q_k. / (K sum_i Q_ki)   (every prototype gets 1/K of the batch)
//   Q_.i <- Q_.i / (B sum_k Q_ki)   (every sample 1/B); finally q_i = B Q_.i, a distribution.
// The sums over samples are sums over every replica's rows (comm), so replicas split a batch
// into the codes one replica with the whole batch would give. The codes carry no gradient.
// Swapped prediction: every other crop v predicts them,
//   loss_i = 1 / (G (V - 1)) sum_g sum_{v != g} -sum_k q[g, i, k] log softmax(s[v, i] / T)_k
// (crop_cross_entropy.h; rows crop-major). exp(s / epsilon) is safe for cosines: e^20 at most.
#pragma once
#include "ops/softmax.h"
#include "parallel/comm.h"

typedef struct {
  int b, global, views, K;  // samples here, crops with codes, crops in all, prototypes
  int global_batch;         // B: samples over every replica
  float temperature, epsilon;
  int iterations;
  double *Q;               // (b, K) one crop's codes being balanced, MEM_WORKSPACE loss
  double *prototype_sums;  // (K) their sums over the global batch
  float *q;                // (G b, K) the codes, MEM_WORKSPACE loss
  float *logp;             // (V b, K) the predictions' log-probabilities, MEM_ACT loss
  RowSoftmax log_softmax;  // rows of logp in place
} SwavLoss;

void swav_loss_init(SwavLoss *l, ExecCtx *ctx, int b, int global_batch, int global, int views,
                    int K, float temperature, float epsilon, int iterations);
// The codes of the b rows `scores` (b, K) of one crop, in q (b, K), balanced over the global
// batch through comm (every replica calls it together). Counts its FLOPs in ctx.
void swav_sinkhorn(SwavLoss *l, ExecCtx *ctx, Comm *comm, const float *scores, float *q);
// scores: (V b, K). Returns the sum over the b samples of loss_i; dscores (V b, K) receives the
// gradient of that sum divided by mean_over. The codes are left in l->q.
double swav_loss_forward_backward(SwavLoss *l, ExecCtx *ctx, Comm *comm, const float *scores,
                                  int mean_over, float *dscores);
void swav_loss_destroy(SwavLoss *l);
