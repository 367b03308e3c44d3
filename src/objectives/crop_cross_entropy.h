// Multi-crop's cross-entropy (DINO's and SwAV's swapped prediction): every crop's prediction is
// scored against the targets of each *other* crop that has targets. With G crops that have
// targets (the global crops, the first G) and V crops in all, per sample i
//   loss_i = 1 / pairs * sum_{g < G} sum_{v != g} -sum_k q[g, i, k] log p[v, i, k],
// pairs = G V - min(G, V) (crop_pairs), q the targets (each row sums to 1, no gradient) and
// log p = log_softmax(s / tau) the predictions from the scores s.
// Rows are crop-major: row v * b + i is crop v of sample i.
#pragma once

// The (target crop, predicting crop) pairs each sample's loss averages over.
int crop_pairs(int global, int views);

// q (G b, K) targets; logp (V b, K) log-probabilities of s / tau. Returns sum_i loss_i over the b
// samples; ds (V b, K) receives d(sum_i loss_i / mean_over) / ds.
double crop_cross_entropy(const float *q, const float *logp, int b, int global, int views, int K,
                          float tau, int mean_over, float *ds);
