// Transformer ops (linear, layer norm, multi-head attention): forward against naive reference
// loops written here, backward (input and every parameter gradient) against central finite
// differences of L = sum(out * R) for a fixed random R (so dL/dout = R), and FLOP counters
// against the analytic counts.
//
// Tolerances (float32): forward |op - reference| < FWD_ATOL; gradients: worst relative error
// (gradcheck.h, denominator floored at GRAD_ATOL_SCALE) < GRAD_RTOL.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "ops/attention.h"
#include "ops/layernorm.h"
#include "ops/linear.h"

#define FWD_ATOL 1e-4
#define GRAD_RTOL 1e-2
#define GRAD_ATOL_SCALE 1e-2
#define EPS 1e-2f

static void check_grad(gradcheck_loss_fn loss, void *c, float *x, const float *g, size_t n,
                       const char *label) {
  assert_true(gradcheck(loss, c, x, g, n, 64, EPS, GRAD_ATOL_SCALE, label) < GRAD_RTOL);
}

// ---- linear ----

// A narrowing layer (its weight gradient written plain) and a widening one (written in the
// blocked layout oneDNN picks, then reordered into the plain gradient).
typedef struct {
  int M, IC, OC, grad_blocked;
} LinearShape;

typedef struct {
  Env env;
  Linear l;
  LinearShape s;
  float *in, *r;
} LinearCase;

static double linear_loss(void *p) {
  LinearCase *c = p;
  linear_forward(&c->l, &c->env.ctx, c->in);
  return dot_out(c->l.out, c->r, (size_t)c->s.M * c->s.OC);
}

static void check_linear(LinearShape shape) {
  LinearCase c = {.s = shape};
  const int M = shape.M, IC = shape.IC, OC = shape.OC;
  env_init(&c.env, linear_floats(IC, OC, 1), OP_TRAIN);
  linear_init(&c.l, &c.env.b, "fc", M, IC, OC, 1, 1, 0.0f);
  // -1: the library's choice (oneDNN 2.6 and 3.7 write it blocked on AVX-512, 3.12 plain); the
  // gradient is checked below in whichever layout it got.
  if (shape.grad_blocked >= 0)
    assert_int_equal(linear_weight_grad_blocked(&c.l), shape.grad_blocked);
  else
    print_message("widening layer: weight gradient written %s\n",
                  linear_weight_grad_blocked(&c.l) ? "blocked, then reordered" : "plain");
  // Xavier-uniform bound sqrt(6 / (fan_in + fan_out)), zero bias.
  float bound = sqrtf(6.0f / (float)(IC + OC));
  for (int i = 0; i < OC * IC; i++) assert_true(fabsf(c.l.weight[i]) <= bound);
  for (int o = 0; o < OC; o++) assert_true(c.l.bias[o] == 0.0f);
  fill_uniform(c.l.bias, OC, -0.5f, 0.5f, 1);
  c.in = new_tensor((size_t)M * IC);
  c.r = new_tensor((size_t)M * OC);
  fill_uniform(c.in, (size_t)M * IC, -1, 1, 2);
  fill_uniform(c.r, (size_t)M * OC, -1, 1, 3);

  exec_ctx_reset_flops(&c.env.ctx);
  linear_forward(&c.l, &c.env.ctx, c.in);
  double *want = malloc(sizeof(double) * (size_t)M * OC);
  assert_non_null(want);
  for (int m = 0; m < M; m++)
    for (int o = 0; o < OC; o++) {
      double s = c.l.bias[o];
      for (int i = 0; i < IC; i++) s += (double)c.in[m * IC + i] * c.l.weight[o * IC + i];
      want[m * OC + o] = s;
    }
  expect_close(c.l.out, want, (size_t)M * OC, FWD_ATOL);
  free(want);
  linear_backward(&c.l, &c.env.ctx, c.r);
  assert_true(c.env.ctx.flops_forward[COMP_ENCODER] == 2.0 * M * IC * OC);
  assert_true(c.env.ctx.flops_backward[COMP_ENCODER] == 2 * 2.0 * M * IC * OC);

  check_grad(linear_loss, &c, c.in, c.l.din, (size_t)M * IC, "linear din");
  check_grad(linear_loss, &c, c.l.weight, c.l.dweight, (size_t)OC * IC, "linear dweight");
  check_grad(linear_loss, &c, c.l.bias, c.l.dbias, (size_t)OC, "linear dbias");
  linear_destroy(&c.l);
  tl_free(c.in);
  tl_free(c.r);
  env_destroy(&c.env);
}

static void test_linear(void **state) {
  (void)state;
  check_linear((LinearShape){.M = 6, .IC = 5, .OC = 4, .grad_blocked = 0});
  // Widening: the library may write the gradient blocked (a reorder into the plain one) or plain.
  check_linear((LinearShape){.M = 24, .IC = 64, .OC = 128, .grad_blocked = -1});
  // Widening by a partial block of 64: plain.
  check_linear((LinearShape){.M = 12, .IC = 16, .OC = 48, .grad_blocked = 0});
}

// init_std > 0 draws normal(0, std) instead; no bias means no bias parameters are taken.
static void test_linear_normal_init_no_bias(void **state) {
  (void)state;
  enum { IC = 64, OC = 64 };
  Env env;
  env_init(&env, linear_floats(IC, OC, 0), OP_TRAIN);
  Linear l;
  linear_init(&l, &env.b, "proj", 3, IC, OC, 0, 0, 0.02f);
  assert_int_equal(env.ps.used, IC * OC);
  double sum_sq = 0;
  for (int i = 0; i < IC * OC; i++) sum_sq += (double)l.weight[i] * l.weight[i];
  double std = sqrt(sum_sq / (IC * OC));
  assert_true(std > 0.018 && std < 0.022);
  assert_null(l.din);
  linear_destroy(&l);
  env_destroy(&env);
}

// ---- layer norm ----

enum { LN_M = 5, LN_D = 8 };

typedef struct {
  Env env;
  LayerNorm ln;
  float *in, *r;
} LayerNormCase;

static double layernorm_loss(void *p) {
  LayerNormCase *c = p;
  layernorm_forward(&c->ln, &c->env.ctx, c->in);
  return dot_out(c->ln.out, c->r, LN_M * LN_D);
}

static void test_layernorm(void **state) {
  (void)state;
  LayerNormCase c;
  env_init(&c.env, layernorm_floats(LN_D), OP_TRAIN);
  layernorm_init(&c.ln, &c.env.b, "ln", LN_M, LN_D);
  for (int d = 0; d < LN_D; d++) assert_true(c.ln.gamma[d] == 1.0f && c.ln.beta[d] == 0.0f);
  assert_true(c.env.ps.entries[0].no_decay && c.env.ps.entries[1].no_decay);
  fill_uniform(c.ln.gamma, LN_D, 0.5f, 1.5f, 1);
  fill_uniform(c.ln.beta, LN_D, -0.5f, 0.5f, 2);
  c.in = new_tensor(LN_M * LN_D);
  c.r = new_tensor(LN_M * LN_D);
  fill_uniform(c.in, LN_M * LN_D, -2, 2, 3);
  fill_uniform(c.r, LN_M * LN_D, -1, 1, 4);

  exec_ctx_reset_flops(&c.env.ctx);
  layernorm_forward(&c.ln, &c.env.ctx, c.in);
  double want[LN_M * LN_D];
  for (int m = 0; m < LN_M; m++) {
    const float *x = c.in + m * LN_D;
    double mean = 0, var = 0;
    for (int d = 0; d < LN_D; d++) mean += x[d];
    mean /= LN_D;
    for (int d = 0; d < LN_D; d++) var += (x[d] - mean) * (x[d] - mean);
    var /= LN_D;
    for (int d = 0; d < LN_D; d++)
      want[m * LN_D + d] = c.ln.gamma[d] * (x[d] - mean) / sqrt(var + 1e-6) + c.ln.beta[d];
  }
  expect_close(c.ln.out, want, LN_M * LN_D, FWD_ATOL);
  layernorm_backward(&c.ln, &c.env.ctx, c.r);
  assert_true(c.env.ctx.flops_forward[COMP_ENCODER] == (double)LN_FWD * LN_M * LN_D);
  assert_true(c.env.ctx.flops_backward[COMP_ENCODER] == (double)LN_BWD * LN_M * LN_D);

  check_grad(layernorm_loss, &c, c.in, c.ln.din, LN_M * LN_D, "layernorm din");
  check_grad(layernorm_loss, &c, c.ln.gamma, c.ln.dgamma, LN_D, "layernorm dgamma");
  check_grad(layernorm_loss, &c, c.ln.beta, c.ln.dbeta, LN_D, "layernorm dbeta");
  layernorm_destroy(&c.ln);
  tl_free(c.in);
  tl_free(c.r);
  env_destroy(&c.env);
}

// ---- attention ----

// Short sequences take the dense-heads path, long ones the strided views (src/ops/attention.c
// switches at T = 32): both are checked.
enum { AT_D = 8, AT_H = 2, AT_DH = AT_D / AT_H, AT_T_SHORT = 5, AT_T_LONG = 33 };

typedef struct {
  Env env;
  Attention a;
  int N, T;
  float *qkv, *r;
} AttentionCase;

static double attention_loss(void *p) {
  AttentionCase *c = p;
  attention_forward(&c->a, &c->env.ctx, c->qkv);
  return dot_out(c->a.out, c->r, (size_t)c->N * c->T * AT_D);
}

// out[n, t, h*Dh + d] = sum_u softmax_u(q_t . k_u / sqrt(Dh)) v_u[d], q/k/v read from qkv.
static void attention_reference(int N, int T, const float *qkv, double *out) {
  double s[AT_T_LONG];
  for (int n = 0; n < N; n++)
    for (int h = 0; h < AT_H; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qkv + (n * T + t) * 3 * AT_D + h * AT_DH;
        double mx = -1e30, sum = 0;
        for (int u = 0; u < T; u++) {
          const float *k = qkv + (n * T + u) * 3 * AT_D + AT_D + h * AT_DH;
          s[u] = 0;
          for (int d = 0; d < AT_DH; d++) s[u] += (double)q[d] * k[d];
          s[u] /= sqrt((double)AT_DH);
          if (s[u] > mx) mx = s[u];
        }
        for (int u = 0; u < T; u++) sum += (s[u] = exp(s[u] - mx));
        for (int d = 0; d < AT_DH; d++) {
          double o = 0;
          for (int u = 0; u < T; u++)
            o += s[u] / sum * qkv[(n * T + u) * 3 * AT_D + 2 * AT_D + h * AT_DH + d];
          out[(n * T + t) * AT_D + h * AT_DH + d] = o;
        }
      }
}

static void check_attention(int N, int T, OpMode mode, size_t grad_samples) {
  AttentionCase c = {.N = N, .T = T};
  env_init(&c.env, 1, mode);
  attention_init(&c.a, &c.env.b, N, T, AT_D, AT_H);
  size_t n_qkv = (size_t)N * T * 3 * AT_D, n_out = (size_t)N * T * AT_D;
  c.qkv = new_tensor(n_qkv);
  c.r = new_tensor(n_out);
  // Scores of order 1: the softmax is neither uniform nor saturated.
  fill_uniform(c.qkv, n_qkv, -1.5f, 1.5f, 1);
  fill_uniform(c.r, n_out, -1, 1, 2);

  exec_ctx_reset_flops(&c.env.ctx);
  attention_forward(&c.a, &c.env.ctx, c.qkv);
  double *want = tl_alloc(n_out * sizeof(double), MEM_DATA, COMP_OTHER);
  attention_reference(N, T, c.qkv, want);
  expect_close(c.a.out, want, n_out, FWD_ATOL);
  double matmul = 2.0 * N * AT_H * T * T * AT_DH;
  double scores = (double)N * AT_H * T * T;
  assert_true(c.env.ctx.flops_forward[COMP_ENCODER] == 2 * matmul + SOFTMAX_FWD * scores);
  if (mode != OP_TRAIN) {
    // A forward-only op keeps no gradient buffers.
    assert_null(c.a.din);
  } else {
    attention_backward(&c.a, &c.env.ctx, c.r);
    assert_true(c.env.ctx.flops_backward[COMP_ENCODER] == 4 * matmul + SOFTMAX_BWD * scores);
    // A short sequence's backward reads the dense per-head copy the op keeps, not its input, whose
    // buffer a network may then give to other values: NaN written over it after forward changes
    // no gradient bit. A long one reads the input.
    assert_int_equal(attention_backward_reads_input(&c.a), T == AT_T_LONG);
    if (T == AT_T_SHORT) {
      float *din = new_tensor(n_qkv), *qkv = new_tensor(n_qkv);
      memcpy(din, c.a.din, n_qkv * sizeof(float));
      memcpy(qkv, c.qkv, n_qkv * sizeof(float));
      attention_forward(&c.a, &c.env.ctx, c.qkv);
      for (size_t i = 0; i < n_qkv; i++) c.qkv[i] = NAN;
      attention_backward(&c.a, &c.env.ctx, c.r);
      assert_memory_equal(c.a.din, din, n_qkv * sizeof(float));
      memcpy(c.qkv, qkv, n_qkv * sizeof(float));
      tl_free(din);
      tl_free(qkv);
    }
    // Every Q, K and V entry of every head when grad_samples covers all of qkv.
    assert_true(gradcheck(attention_loss, &c, c.qkv, c.a.din, n_qkv, grad_samples, EPS,
                          GRAD_ATOL_SCALE, "attention dqkv") < GRAD_RTOL);
  }
  attention_destroy(&c.a);
  tl_free(want);
  tl_free(c.qkv);
  tl_free(c.r);
  env_destroy(&c.env);
}

static void test_attention_short(void **state) {
  (void)state;
  check_attention(2, AT_T_SHORT, OP_TRAIN, (size_t)-1);
}

static void test_attention_long(void **state) {
  (void)state;
  check_attention(2, AT_T_LONG, OP_TRAIN, 400);
}

static void test_attention_inference(void **state) {
  (void)state;
  check_attention(2, AT_T_SHORT, OP_INFER, 0);
  check_attention(1, AT_T_LONG, OP_INFER, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),         cmocka_unit_test(test_linear_normal_init_no_bias),
      cmocka_unit_test(test_layernorm),      cmocka_unit_test(test_attention_short),
      cmocka_unit_test(test_attention_long), cmocka_unit_test(test_attention_inference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
