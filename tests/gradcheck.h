// Central finite differences against an analytic gradient, for the op and objective tests.
// The scalar being differentiated is computed in double by the test's own loss function
// (typically sum(out * R) for a fixed random R, whose gradient with respect to out is R).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "core/rng.h"

typedef double (*gradcheck_loss_fn)(void *ctx);

// Perturbs up to `n_samples` entries of x (all when n_samples >= n), chosen by a fixed stream,
// by +-eps and compares (L(x+eps) - L(x-eps)) / 2eps with g_analytic. Returns the worst error,
// measured as |numeric - analytic| / max(atol_scale, |numeric| + |analytic|), and prints the
// worst index when `label` is non-NULL.
static inline double gradcheck(gradcheck_loss_fn loss, void *ctx, float *x, const float *g_analytic,
                               size_t n, size_t n_samples, float eps, double atol_scale,
                               const char *label) {
  Rng r = rng_stream(1234, RNG_TEST, n, 0);
  double worst = 0;
  size_t worst_i = 0;
  double worst_num = 0, worst_ana = 0;
  size_t count = n_samples < n ? n_samples : n;
  for (size_t s = 0; s < count; s++) {
    size_t i = n_samples < n ? rng_below(&r, (uint32_t)n) : s;
    float saved = x[i];
    x[i] = saved + eps;
    double lp = loss(ctx);
    x[i] = saved - eps;
    double lm = loss(ctx);
    x[i] = saved;
    double num = (lp - lm) / (2.0 * (double)eps);
    double ana = g_analytic[i];
    double denom = fabs(num) + fabs(ana);
    if (denom < atol_scale) denom = atol_scale;
    double err = fabs(num - ana) / denom;
    if (err > worst) {
      worst = err;
      worst_i = i;
      worst_num = num;
      worst_ana = ana;
    }
  }
  if (label)
    printf("gradcheck %-24s worst rel err %.2e at %zu (numeric %.6g, analytic %.6g)\n", label,
           worst, worst_i, worst_num, worst_ana);
  return worst;
}
