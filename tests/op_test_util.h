// Small pieces the op and model tests share: an op's environment (oneDNN context, parameter
// block, builder), deterministic random tensors, and the scalar loss sum(out * R).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "ops/builder.h"

typedef struct {
  DnnlCtx ctx;
  ParamSet ps;
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

static inline void env_init(Env *e, size_t n_params, OpMode mode) {
  dnnl_ctx_init(&e->ctx);
  paramset_alloc(&e->ps, n_params, 7);
  e->b = (Builder){.ctx = &e->ctx, .params = &e->ps, .mode = mode};
}

static inline void env_destroy(Env *e) {
  paramset_free(&e->ps);
  dnnl_ctx_destroy(&e->ctx);
}

static inline float *new_tensor(size_t n) {
  return tl_alloc(n * sizeof(float), MEM_DATA, COMP_OTHER);
}

// Uniform in [lo, hi), the same numbers for the same stream on every run.
static inline void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t stream) {
  Rng r = rng_stream(42, RNG_TEST, stream, 0);
  for (size_t i = 0; i < n; i++) x[i] = rng_uniform_range(&r, lo, hi);
}

// sum(out * r) in double: a loss whose gradient with respect to out is r.
static inline double dot_out(const float *out, const float *r, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
  return s;
}
