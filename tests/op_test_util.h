// Small pieces the op and model tests share: an op's environment (oneDNN context, parameter
// block, builder), deterministic random tensors, and the scalar loss sum(out * R).
#pragma once
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <math.h>
#include <stdio.h>

#include "core/rng.h"
#include "ops/builder.h"

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  BuildPolicy policy;  // the builder's: the defaults until a test changes them
  Builder b;
} Env;

// An op's parameter floats, stated by hand in PyTorch's shapes (the ops take exactly these).
static inline size_t conv_floats(int IC, int OC, int K, int has_bias) {
  return (size_t)OC * IC * K * K + (has_bias ? (size_t)OC : 0);  // weight (OC, IC, K, K), bias
}
static inline size_t linear_floats(int IC, int OC, int has_bias) {
  return (size_t)OC * IC + (has_bias ? (size_t)OC : 0);  // weight (OC, IC), bias
}
static inline size_t batchnorm_floats(int C) { return 4 * (size_t)C; }  // gamma, beta, mean, var
static inline size_t layernorm_floats(int D) { return 2 * (size_t)D; }  // gamma, beta

// The ledger's analytic FLOPs per element, counted here operation by operation from what each
// op computes (one add, subtract, multiply, compare or exp is one FLOP), not copied from the ops:
// a count the ops get wrong fails the tests that hold them to these.
enum {
  // BatchNorm with running statistics: normalize (subtract the mean, multiply by 1 / std) and
  // scale and shift (multiply, add).
  BN_FWD_GLOBAL = 2 + 2,
  // With batch statistics, first the statistics: the mean (an add) and the variance (subtract
  // the mean, square, add).
  BN_FWD = 1 + 3 + BN_FWD_GLOBAL,
  // Backward: dbeta (an add), dgamma (subtract the mean, multiply by 1 / std, by dout, add), din
  // (dout scaled by gamma / std, less its two batch terms, each scaled and subtracted: 5).
  BN_BWD = 1 + 4 + 5,
  // LayerNorm over a row: the mean (add), the variance (subtract, square, add), normalize
  // (subtract, multiply), scale and shift (multiply, add).
  LN_FWD = 1 + 3 + 2 + 2,
  // Backward: dbeta (add), dgamma (multiply, add), dxhat = dout gamma (multiply), its row sum
  // (add), the row sum of dxhat xhat (multiply, add), dx = (dxhat - sum1 / D - xhat sum2 / D) /
  // std (subtract, multiply, subtract, multiply).
  LN_BWD = 1 + 2 + 1 + 1 + 2 + 4,
  // Softmax over an attention row, per score: scale by 1 / sqrt(d) (multiply), the row max
  // (compare), subtract it, exp, the row sum (add), normalize (multiply).
  SOFTMAX_FWD = 1 + 1 + 1 + 1 + 1 + 1,
  // Backward: the row sum of dP P (multiply, add), subtract it from dP, multiply by P, scale.
  SOFTMAX_BWD = 2 + 1 + 1 + 1,
  // GELU = x / 2 (1 + erf(x / sqrt 2)). erf has no exact count: the ledger costs its polynomial
  // approximation at 14, an exp with its argument at 10. Forward: x / sqrt 2, erf, + 1, times x,
  // halved. Backward: erf again, the density exp(-x^2 / 2), and dout (1 + erf) / 2 + dout x
  // density (add, multiply, multiply, add).
  GELU_FWD = 1 + 14 + 1 + 1 + 1,
  GELU_BWD = 14 + 10 + 4,
};

static inline void env_init(Env *e, size_t n_params, OpMode mode) {
  exec_ctx_init(&e->ctx);
  paramset_alloc(&e->ps, n_params, 7);
  e->policy = build_policy_default();
  e->b = (Builder){.ctx = &e->ctx, .params = &e->ps, .mode = mode, .policy = &e->policy};
}

static inline void env_destroy(Env *e) {
  paramset_free(&e->ps);
  exec_ctx_destroy(&e->ctx);
}

static inline float *new_tensor(size_t n) {
  return tl_alloc(n * sizeof(float), MEM_DATA, COMP_OTHER);
}

// Uniform in [lo, hi), the same numbers for the same stream on every run.
static inline void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t stream) {
  Rng r = rng_stream(42, RNG_TEST, stream, 0);
  for (size_t i = 0; i < n; i++) x[i] = rng_uniform_range(&r, lo, hi);
}

// Every element of a forward output within atol of its reference, computed another way.
static inline void expect_close(const float *got, const double *want, size_t n, double atol) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (d > worst) worst = d;
  }
  if (worst >= atol) printf("forward mismatch: worst abs error %.3e\n", worst);
  assert_true(worst < atol);
}

// sum(out * r) in double: a loss whose gradient with respect to out is r.
static inline double dot_out(const float *out, const float *r, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
  return s;
}
