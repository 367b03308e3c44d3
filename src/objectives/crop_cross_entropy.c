#include "objectives/crop_cross_entropy.h"

#include <math.h>
#include <stddef.h>

int crop_pairs(int global, int views) { return global * views - (views < global ? views : global); }

double crop_cross_entropy(const float *q, const float *logp, int b, int global, int views, int K,
                          float tau, int mean_over, float *ds) {
  const int G = global, V = views, pairs = crop_pairs(G, V);
  // d(mean loss)/d s[v, i, k] = (m_v p[v, i, k] - sum_{g != v} q[g, i, k]) / (pairs tau
  // mean_over), m_v the target crops paired with crop v (the q of each pair sums to 1).
  const double scale = 1.0 / ((double)pairs * tau * mean_over);
  double loss_sum = 0;
  for (int v = 0; v < V; v++) {
    const int m_v = G - (v < G);
    for (int i = 0; i < b; i++) {
      const float *lp = logp + ((size_t)v * b + i) * K;
      float *d = ds + ((size_t)v * b + i) * K;
      for (int k = 0; k < K; k++) d[k] = (float)m_v * expf(lp[k]);
      for (int g = 0; g < G; g++) {
        if (g == v) continue;
        const float *qg = q + ((size_t)g * b + i) * K;
        double ce = 0;
        for (int k = 0; k < K; k++) {
          ce -= (double)qg[k] * lp[k];
          d[k] -= qg[k];
        }
        loss_sum += ce / pairs;
      }
      for (int k = 0; k < K; k++) d[k] = (float)(d[k] * scale);
    }
  }
  return loss_sum;
}
