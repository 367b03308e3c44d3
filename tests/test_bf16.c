// [train] precision = bf16: convolutions and linear layers multiply bf16 copies of their inputs,
// weights and output gradients with f32 accumulation. Their outputs and gradients must agree with
// f32 to bf16's precision (8 bits of mantissa: a relative error of about 2^-9 per product, less
// after summing many of them), must differ from f32 (or bf16 never ran), and the copies are
// counted as 2-byte buffers. Through the binary, a few bf16 steps train like f32 ones.
#include "core/bf16.h"
#include "objective_test_util.h"
#include "op_test_util.h"
#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/pool.h"

// ||got - want|| / ||want|| over n values.
static double relative_error(const float *got, const float *want, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    norm += (double)want[i] * want[i];
  }
  return sqrt(diff / norm);
}

// bf16 against f32 on one tensor: close, but not equal.
static void expect_bf16_close(const char *what, const float *bf16, const float *f32, size_t n) {
  double e = relative_error(bf16, f32, n);
  print_message("%s: relative error %.2e\n", what, e);
  if (e > 1e-2) fail_msg("%s: bf16 is %.2e away from f32 (relative), more than 1e-2", what, e);
  if (e < 1e-5) fail_msg("%s: bf16 equals f32 (%.2e): the bf16 kernels did not run", what, e);
}

// One layer built twice on identical parameters, in f32 and in bf16.
typedef struct {
  Env f32, bf16;
} Pair;

static void pair_init(Pair *p, size_t n_params) {
  env_init(&p->f32, n_params, OP_TRAIN);
  env_init(&p->bf16, n_params, OP_TRAIN);
  p->bf16.policy.bf16 = 1;
}

// The same, the bf16 one on bf16 activations (a network's act_type).
static void pair_init_bf16_activations(Pair *p, size_t n_params) {
  pair_init(p, n_params);
  p->bf16.b.act_type = dnnl_bf16;
}

static void pair_destroy(Pair *p) {
  env_destroy(&p->f32);
  env_destroy(&p->bf16);
}

// A 3x3 convolution with bias and input gradient, stride 1 (at stride 2 backward weights stays
// f32, see conv.c).
static void test_conv_bf16_matches_f32(void **state) {
  (void)state;
  enum { N = 8, IC = 32, H = 16, OC = 64, K = 3 };
  Pair p;
  pair_init(&p, conv_floats(IC, OC, K, 1));
  size_t act_before = tl_mem_live(MEM_ACT);
  Conv2d a, b;
  conv2d_init(&a, &p.f32.b, "conv", N, IC, H, H, OC, K, 1, 1, 1, 1);
  size_t act_f32 = tl_mem_live(MEM_ACT) - act_before;
  conv2d_init(&b, &p.bf16.b, "conv", N, IC, H, H, OC, K, 1, 1, 1, 1);
  size_t act_bf16 = tl_mem_live(MEM_ACT) - act_before - act_f32;
  // Kept for backward weights: the input's bf16 copy, 2 bytes an element.
  assert_int_equal(act_bf16 - act_f32, (size_t)N * H * H * IC * 2);
  fill_uniform(p.bf16.ps.data, p.bf16.ps.count, -0.5f, 0.5f, 1);  // a bias that is not zero
  memcpy(p.f32.ps.data, p.bf16.ps.data, p.f32.ps.count * sizeof(float));

  size_t n_in = (size_t)N * H * H * IC, n_out = (size_t)N * a.OH * a.OW * OC;
  float *in = new_tensor(n_in), *dout = new_tensor(n_out);
  fill_uniform(in, n_in, -1, 1, 2);
  fill_uniform(dout, n_out, -1, 1, 3);
  conv2d_forward(&a, &p.f32.ctx, in);
  conv2d_forward(&b, &p.bf16.ctx, in);
  expect_bf16_close("conv out", b.out, a.out, n_out);
  conv2d_backward(&a, &p.f32.ctx, dout);
  conv2d_backward(&b, &p.bf16.ctx, dout);
  expect_bf16_close("conv din", b.din, a.din, n_in);
  expect_bf16_close("conv dweight", b.dweight, a.dweight, (size_t)OC * IC * K * K);
  expect_bf16_close("conv dbias", b.dbias, a.dbias, OC);

  tl_free(in);
  tl_free(dout);
  conv2d_destroy(&a);
  conv2d_destroy(&b);
  pair_destroy(&p);
}

// A ViT MLP's first layer on token rows.
static void test_linear_bf16_matches_f32(void **state) {
  (void)state;
  enum { M = 520, IC = 128, OC = 512 };
  Pair p;
  pair_init(&p, linear_floats(IC, OC, 1));
  size_t grad_before = tl_mem_live(MEM_ACT_GRAD);
  Linear a, b;
  linear_init(&a, &p.f32.b, "fc", M, IC, OC, 1, 1, 0.0f);
  size_t grad_f32 = tl_mem_live(MEM_ACT_GRAD) - grad_before;
  linear_init(&b, &p.bf16.b, "fc", M, IC, OC, 1, 1, 0.0f);
  size_t grad_bf16 = tl_mem_live(MEM_ACT_GRAD) - grad_before - grad_f32;
  // The output gradient's bf16 copy, read by both backward passes.
  assert_int_equal(grad_bf16 - grad_f32, (size_t)M * OC * 2);
  fill_uniform(p.bf16.ps.data, p.bf16.ps.count, -0.2f, 0.2f, 4);
  memcpy(p.f32.ps.data, p.bf16.ps.data, p.f32.ps.count * sizeof(float));

  float *in = new_tensor((size_t)M * IC), *dout = new_tensor((size_t)M * OC);
  fill_uniform(in, (size_t)M * IC, -1, 1, 5);
  fill_uniform(dout, (size_t)M * OC, -1, 1, 6);
  linear_forward(&a, &p.f32.ctx, in);
  linear_forward(&b, &p.bf16.ctx, in);
  expect_bf16_close("linear out", b.out, a.out, (size_t)M * OC);
  linear_backward(&a, &p.f32.ctx, dout);
  linear_backward(&b, &p.bf16.ctx, dout);
  expect_bf16_close("linear din", b.din, a.din, (size_t)M * IC);
  expect_bf16_close("linear dweight", b.dweight, a.dweight, (size_t)OC * IC);
  expect_bf16_close("linear dbias", b.dbias, a.dbias, OC);

  tl_free(in);
  tl_free(dout);
  linear_destroy(&a);
  linear_destroy(&b);
  pair_destroy(&p);
}

// A tensor of n bf16 values (a 2-byte-per-element buffer) holding x rounded; x is rounded in place,
// so a reference computed from it sees exactly what the bf16 op read.
static float *to_bf16(float *x, size_t n) {
  uint16_t *h = tl_alloc(n * sizeof(uint16_t), MEM_DATA, COMP_OTHER);
  for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]), x[i] = bf16_to_f32(h[i]);
  return (float *)h;
}

// ||got - want|| / ||want|| for got in bf16 (or f32) against a double reference.
static double relative_error_ref(const void *got, int got_bf16, const double *want, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = act_get(got, i, got_bf16) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return sqrt(diff / norm);
}

static void expect_within(const char *what, double e, double tol) {
  print_message("%s: relative error %.2e\n", what, e);
  if (!(e <= tol)) fail_msg("%s: %.2e from the f64 reference, more than %.0e", what, e, tol);
}

// BatchNorm with batch statistics (and a fused ReLU) on bf16 activations, nhwc (N, H, W, C),
// against the textbook formulas in double on the same (rounded) inputs: y = gamma xhat + beta,
// xhat = (x - mean) / sqrt(var + eps) with the biased variance; backward with g = dy where y > 0
// (ReLU), dbeta = sum g, dgamma = sum g xhat, dx = gamma / sigma (g - dbeta/n - xhat dgamma/n).
// Statistics and parameter gradients are f32 (sums of the same rounded inputs: 1e-4); y and dx
// bf16 (each rounded, a relative error up to 2^-9: 5e-3 over the tensor). Its activation buffers
// are counted at 2 bytes an element.
static void check_batchnorm_bf16(int relu) {
  enum { N = 16, C = 32, H = 6, W = 6 };
  const size_t n = (size_t)N * H * W * C, per_channel = (size_t)N * H * W;
  Env e32, e16;
  env_init(&e32, batchnorm_floats(C), OP_TRAIN);
  env_init(&e16, batchnorm_floats(C), OP_TRAIN);
  e16.policy.bf16 = 1;
  e16.b.act_type = dnnl_bf16;
  BatchNorm l32, l16;
  size_t before = tl_mem_live(MEM_ACT) + tl_mem_live(MEM_ACT_GRAD);
  batchnorm_init(&l32, &e32.b, "bn", N, C, H, W, relu, 1);
  size_t mid = tl_mem_live(MEM_ACT) + tl_mem_live(MEM_ACT_GRAD);
  batchnorm_init(&l16, &e16.b, "bn", N, C, H, W, relu, 1);
  size_t after = tl_mem_live(MEM_ACT) + tl_mem_live(MEM_ACT_GRAD);
  // Output and input gradient, 2 bytes an element less each; statistics and mask the same.
  assert_int_equal((mid - before) - (after - mid), 2 * n * 2);

  float *gamma = l16.gamma, *beta = l16.beta;
  fill_uniform(gamma, C, 0.5f, 1.5f, 11);
  fill_uniform(beta, C, -0.5f, 0.5f, 12);
  float *x = new_tensor(n), *dy = new_tensor(n);
  fill_uniform(x, n, -2, 3, 13);
  fill_uniform(dy, n, -1, 1, 14);
  for (size_t i = 0; i < n; i++) x[i] += 0.1f * (float)(i % C);  // channels of their own mean
  float *x16 = to_bf16(x, n), *dy16 = to_bf16(dy, n);
  batchnorm_forward(&l16, &e16.ctx, x16);
  batchnorm_backward(&l16, &e16.ctx, dy16);

  double *y = calloc(n, sizeof *y), *dx = calloc(n, sizeof *dx), *xhat = calloc(n, sizeof *xhat);
  double dgamma[C], dbeta[C];
  for (int c = 0; c < C; c++) {
    double mean = 0, var = 0;
    for (size_t p = 0; p < per_channel; p++) mean += x[p * C + c] / (double)per_channel;
    for (size_t p = 0; p < per_channel; p++) {
      const double d = x[p * C + c] - mean;
      var += d * d / (double)per_channel;
    }
    const double sigma = sqrt(var + 1e-5);
    dgamma[c] = dbeta[c] = 0;
    for (size_t p = 0, i = c; p < per_channel; p++, i += C) {
      xhat[i] = (x[i] - mean) / sigma;
      y[i] = gamma[c] * xhat[i] + beta[c];
      if (relu && y[i] < 0) y[i] = 0;
      const double g = relu && y[i] <= 0 ? 0 : dy[i];
      dbeta[c] += g, dgamma[c] += g * xhat[i];
    }
    for (size_t p = 0, i = c; p < per_channel; p++, i += C) {
      const double g = relu && y[i] <= 0 ? 0 : dy[i];
      dx[i] = gamma[c] / sigma *
              (g - dbeta[c] / (double)per_channel - xhat[i] * dgamma[c] / (double)per_channel);
    }
  }
  expect_within("bn out (bf16)", relative_error_ref(l16.out, 1, y, n), 5e-3);
  expect_within("bn din (bf16)", relative_error_ref(l16.din, 1, dx, n), 5e-3);
  expect_within("bn dgamma (f32)", relative_error_ref(l16.dgamma, 0, dgamma, C), 1e-4);
  expect_within("bn dbeta (f32)", relative_error_ref(l16.dbeta, 0, dbeta, C), 1e-4);

  free(y), free(dx), free(xhat);
  tl_free(x), tl_free(dy), tl_free(x16), tl_free(dy16);
  batchnorm_destroy(&l32);
  batchnorm_destroy(&l16);
  env_destroy(&e32);
  env_destroy(&e16);
}

static void test_batchnorm_bf16_matches_reference(void **state) {
  (void)state;
  check_batchnorm_bf16(0);
}

static void test_batchnorm_relu_bf16_matches_reference(void **state) {
  (void)state;
  check_batchnorm_bf16(1);
}

// Global average pooling of bf16 activations into the f32 feature the head reads: the mean of the
// (rounded) inputs within one bf16 rounding (oneDNN 2.6 pools into bf16, then converts); backward
// spreads the f32 gradient / (H W) into a bf16 input gradient.
static void test_pool_bf16_feature_is_f32(void **state) {
  (void)state;
  enum { N = 8, C = 64, H = 4, W = 4 };
  const size_t n = (size_t)N * H * W * C;
  Env e;
  env_init(&e, 1, OP_TRAIN);
  e.policy.bf16 = 1;
  e.b.act_type = dnnl_bf16;
  GlobalAvgPool l;
  gap_init(&l, &e.b, N, H, W, C, 1);
  float *x = new_tensor(n), *dy = new_tensor((size_t)N * C);
  fill_uniform(x, n, -1, 2, 15);
  fill_uniform(dy, (size_t)N * C, -1, 1, 16);
  float *x16 = to_bf16(x, n);
  gap_forward(&l, &e.ctx, x16);
  gap_backward(&l, &e.ctx, dy);
  double *mean = calloc((size_t)N * C, sizeof *mean), *dx = calloc(n, sizeof *dx);
  for (size_t i = 0; i < n; i++) {
    const size_t nc = i / ((size_t)H * W * C) * C + i % C;
    mean[nc] += x[i] / (H * W);
    dx[i] = dy[nc] / (H * W);
  }
  expect_within("pool out (f32)", relative_error_ref(l.out, 0, mean, (size_t)N * C), 5e-3);
  expect_within("pool din (bf16)", relative_error_ref(l.din, 1, dx, n), 5e-3);
  free(mean), free(dx);
  tl_free(x), tl_free(dy), tl_free(x16);
  gap_destroy(&l);
  env_destroy(&e);
}

// The activation and gradient bytes the ledger holds now.
static size_t act_bytes_live(void) { return tl_mem_live(MEM_ACT) + tl_mem_live(MEM_ACT_GRAD); }

// LayerNorm over rows of bf16 activations (a transformer's) against the textbook formulas in
// double on the same rounded inputs: xhat = (x - mean) / sqrt(var + 1e-6) per row, y = gamma xhat
// + beta; backward dbeta = sum dy, dgamma = sum dy xhat over the rows, dx = (g - mean(g) - xhat
// mean(g xhat)) / sigma with g = gamma dy. y and dx bf16 (5e-3), the f32 parameter gradients
// 1e-4. Output and input gradient at 2 bytes an element; the per-row statistics stay f32.
static void test_layernorm_bf16_matches_reference(void **state) {
  (void)state;
  enum { M = 96, D = 128 };
  const size_t n = (size_t)M * D;
  Pair p;
  pair_init_bf16_activations(&p, layernorm_floats(D));
  LayerNorm l32, l16;
  size_t before = act_bytes_live();
  layernorm_init(&l32, &p.f32.b, "ln", M, D);
  size_t mid = act_bytes_live();
  layernorm_init(&l16, &p.bf16.b, "ln", M, D);
  size_t after = act_bytes_live();
  // f32: output and input gradient (4 bytes an element each), mean and variance (4 a row each).
  assert_int_equal(mid - before, 2 * n * 4 + 2 * (size_t)M * 4);
  assert_int_equal(after - mid, 2 * n * 2 + 2 * (size_t)M * 4);

  float *gamma = l16.gamma, *beta = l16.beta;
  fill_uniform(gamma, D, 0.5f, 1.5f, 21);
  fill_uniform(beta, D, -0.5f, 0.5f, 22);
  float *x = new_tensor(n), *dy = new_tensor(n);
  fill_uniform(x, n, -2, 3, 23);
  fill_uniform(dy, n, -1, 1, 24);
  for (size_t i = 0; i < n; i++) x[i] += 0.05f * (float)(i / D);  // rows of their own mean
  float *x16 = to_bf16(x, n), *dy16 = to_bf16(dy, n);
  layernorm_forward(&l16, &p.bf16.ctx, x16);
  layernorm_backward(&l16, &p.bf16.ctx, dy16);

  double *y = calloc(n, sizeof *y), *dx = calloc(n, sizeof *dx), *xhat = calloc(D, sizeof *xhat);
  double dgamma[D] = {0}, dbeta[D] = {0};
  for (int r = 0; r < M; r++) {
    const float *xr = x + (size_t)r * D, *dyr = dy + (size_t)r * D;
    double mean = 0, var = 0, sum_g = 0, sum_gx = 0;
    for (int c = 0; c < D; c++) mean += xr[c] / (double)D;
    for (int c = 0; c < D; c++) var += (xr[c] - mean) * (xr[c] - mean) / D;
    const double sigma = sqrt(var + 1e-6);
    for (int c = 0; c < D; c++) {
      xhat[c] = (xr[c] - mean) / sigma;
      y[(size_t)r * D + c] = gamma[c] * xhat[c] + beta[c];
      dbeta[c] += dyr[c], dgamma[c] += dyr[c] * xhat[c];
      sum_g += gamma[c] * dyr[c] / D, sum_gx += gamma[c] * dyr[c] * xhat[c] / D;
    }
    for (int c = 0; c < D; c++)
      dx[(size_t)r * D + c] = (gamma[c] * dyr[c] - sum_g - xhat[c] * sum_gx) / sigma;
  }
  expect_within("ln out (bf16)", relative_error_ref(l16.out, 1, y, n), 5e-3);
  expect_within("ln din (bf16)", relative_error_ref(l16.din, 1, dx, n), 5e-3);
  expect_within("ln dgamma (f32)", relative_error_ref(l16.dgamma, 0, dgamma, D), 1e-4);
  expect_within("ln dbeta (f32)", relative_error_ref(l16.dbeta, 0, dbeta, D), 1e-4);

  free(y), free(dx), free(xhat);
  tl_free(x), tl_free(dy), tl_free(x16), tl_free(dy16);
  layernorm_destroy(&l32);
  layernorm_destroy(&l16);
  pair_destroy(&p);
}

// GELU (erf form) on bf16 activations against double: y = x Phi(x), dx = dy (Phi(x) + x phi(x))
// with Phi the normal distribution function and phi its density. Output and input gradient bf16.
static void test_gelu_bf16_matches_reference(void **state) {
  (void)state;
  enum { N = 6000 };
  Pair p;
  pair_init_bf16_activations(&p, 1);
  Eltwise l32, l16;
  size_t before = act_bytes_live();
  eltwise_init(&l32, &p.f32.b, ELTWISE_GELU, N, 1);
  size_t mid = act_bytes_live();
  eltwise_init(&l16, &p.bf16.b, ELTWISE_GELU, N, 1);
  size_t after = act_bytes_live();
  assert_int_equal(mid - before, (size_t)N * 4 * 2);  // output and input gradient
  assert_int_equal(after - mid, (size_t)N * 2 * 2);

  float *x = new_tensor(N), *dy = new_tensor(N);
  fill_uniform(x, N, -4, 4, 25);
  fill_uniform(dy, N, -1, 1, 26);
  float *x16 = to_bf16(x, N), *dy16 = to_bf16(dy, N);
  eltwise_forward(&l16, &p.bf16.ctx, x16);
  eltwise_backward(&l16, &p.bf16.ctx, dy16);
  double *y = calloc(N, sizeof *y), *dx = calloc(N, sizeof *dx);
  for (int i = 0; i < N; i++) {
    const double cdf = 0.5 * (1 + erf(x[i] / sqrt(2.0)));
    const double pdf = exp(-0.5 * (double)x[i] * x[i]) / sqrt(2 * M_PI);
    y[i] = x[i] * cdf;
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
  expect_within("gelu out (bf16)", relative_error_ref(l16.out, 1, y, N), 5e-3);
  expect_within("gelu din (bf16)", relative_error_ref(l16.din, 1, dx, N), 5e-3);
  free(y), free(dx);
  tl_free(x), tl_free(dy), tl_free(x16), tl_free(dy16);
  eltwise_destroy(&l32);
  eltwise_destroy(&l16);
  pair_destroy(&p);
}

// n bf16 values as f32, in a buffer of their own.
static float *from_bf16(const void *h, size_t n) {
  float *x = new_tensor(n);
  for (size_t i = 0; i < n; i++) x[i] = act_get(h, i, 1);
  return x;
}

// Attention on bf16 activations against the f32 op on the same (rounded) qkv and output gradient,
// at a short sequence (dense heads) and a long one (strided views, attention.c). Every tensor it
// keeps or writes is bf16: half the f32 op's bytes, which are (in floats) the output N T D, the
// probabilities N H T T, with dense heads their copy 3 N T D; the gradients dQKV 3 N T D, dP
// N H T T, with dense heads their copy 3 N T D.
static void check_attention_bf16(int T) {
  enum { N = 6, D = 64, H = 4 };
  const size_t n_qkv = (size_t)N * T * 3 * D, n_out = (size_t)N * T * D;
  const size_t scores = (size_t)N * H * T * T, heads = T < 32 ? 3 * n_out : 0;
  Pair p;
  pair_init_bf16_activations(&p, 1);
  Attention a32, a16;
  size_t before = act_bytes_live();
  attention_init(&a32, &p.f32.b, N, T, D, H);
  size_t mid = act_bytes_live();
  attention_init(&a16, &p.bf16.b, N, T, D, H);
  size_t after = act_bytes_live();
  const size_t f32_floats = (n_out + scores + heads) + (n_qkv + scores + heads);
  assert_int_equal(mid - before, f32_floats * 4);
  assert_int_equal(after - mid, f32_floats * 2);

  float *qkv = new_tensor(n_qkv), *dout = new_tensor(n_out);
  fill_uniform(qkv, n_qkv, -2, 2, 27);
  fill_uniform(dout, n_out, -1, 1, 28);
  float *qkv16 = to_bf16(qkv, n_qkv), *dout16 = to_bf16(dout, n_out);
  attention_forward(&a32, &p.f32.ctx, qkv);
  attention_forward(&a16, &p.bf16.ctx, qkv16);
  float *out = from_bf16(a16.out, n_out);
  expect_bf16_close("attention out", out, a32.out, n_out);
  attention_backward(&a32, &p.f32.ctx, dout);
  attention_backward(&a16, &p.bf16.ctx, dout16);
  float *din = from_bf16(a16.din, n_qkv);
  expect_bf16_close("attention din", din, a32.din, n_qkv);

  tl_free(out), tl_free(din);
  tl_free(qkv), tl_free(dout), tl_free(qkv16), tl_free(dout16);
  attention_destroy(&a32);
  attention_destroy(&a16);
  pair_destroy(&p);
}

static void test_attention_bf16_short_matches_f32(void **state) {
  (void)state;
  check_attention_bf16(17);
}

static void test_attention_bf16_long_matches_f32(void **state) {
  (void)state;
  check_attention_bf16(65);
}

// A linear layer between bf16 activations reads its input and output gradient where they are:
// it keeps no copy of either, and writes a bf16 output and input gradient. Its values agree with
// the f32 layer's on the same rounded inputs.
static void test_linear_on_bf16_activations_copies_nothing(void **state) {
  (void)state;
  enum { M = 520, IC = 128, OC = 384 };
  Pair p;
  pair_init_bf16_activations(&p, linear_floats(IC, OC, 1));
  Linear a, b;
  linear_init(&a, &p.f32.b, "fc", M, IC, OC, 1, 1, 0.0f);
  size_t before_act = tl_mem_live(MEM_ACT), before_grad = tl_mem_live(MEM_ACT_GRAD);
  linear_init(&b, &p.bf16.b, "fc", M, IC, OC, 1, 1, 0.0f);
  assert_int_equal(tl_mem_live(MEM_ACT) - before_act, (size_t)M * OC * 2);        // the output
  assert_int_equal(tl_mem_live(MEM_ACT_GRAD) - before_grad, (size_t)M * IC * 2);  // din
  assert_true(linear_backward_reads_input(&b));
  fill_uniform(p.bf16.ps.data, p.bf16.ps.count, -0.2f, 0.2f, 29);
  memcpy(p.f32.ps.data, p.bf16.ps.data, p.f32.ps.count * sizeof(float));

  float *in = new_tensor((size_t)M * IC), *dout = new_tensor((size_t)M * OC);
  fill_uniform(in, (size_t)M * IC, -1, 1, 30);
  fill_uniform(dout, (size_t)M * OC, -1, 1, 31);
  float *in16 = to_bf16(in, (size_t)M * IC), *dout16 = to_bf16(dout, (size_t)M * OC);
  linear_forward(&a, &p.f32.ctx, in);
  linear_forward(&b, &p.bf16.ctx, in16);
  float *out = from_bf16(b.out, (size_t)M * OC);
  expect_bf16_close("linear out (bf16 activations)", out, a.out, (size_t)M * OC);
  linear_backward(&a, &p.f32.ctx, dout);
  linear_backward(&b, &p.bf16.ctx, dout16);
  float *din = from_bf16(b.din, (size_t)M * IC);
  expect_bf16_close("linear din (bf16 activations)", din, a.din, (size_t)M * IC);
  // The products of bf16 numbers are exact in f32: the weight gradient is f32's.
  expect_within("linear dweight (bf16 activations)",
                relative_error(b.dweight, a.dweight, (size_t)OC * IC), 1e-5);

  tl_free(out), tl_free(din);
  tl_free(in), tl_free(dout), tl_free(in16), tl_free(dout16);
  linear_destroy(&a);
  linear_destroy(&b);
  pair_destroy(&p);
}

// The loss of step `step` in the ledger of run tmpdir/name.
static double run_loss(const char *name, int step) {
  char path[600], line[16384];
  snprintf(path, sizeof path, "%s/%s/ledger.jsonl", tmpdir, name);
  read_line(path, step, line, sizeof line);
  double loss = NAN;
  assert_int_equal(json_get(line, "loss", &loss), 1);
  return loss;
}

// Six steps of `objective` in each precision: the bf16 run's plan equals its ledger (its bf16
// copies counted as such). Step 0 runs identical weights on identical views, so its loss differs
// by the forward's rounding only; later steps drift apart as any two trainings do (inbatch at
// batch 32 measured up to 4% apart on single steps), so the six steps' mean is compared.
static void check_trains_like_f32(const char *objective, const char *name_f32,
                                  const char *name_bf16) {
  char args[256];
  snprintf(args, sizeof args,
           "--objective=%s --no-knn --set train.batch_size=32 --set data.limit=256", objective);
  LedgerRecord f32 = plan_equals_run(name_f32, args, "");
  LedgerRecord bf16 = plan_equals_run(name_bf16, args, "--set train.precision=bf16");
  double first_f32 = run_loss(name_f32, 0), first_bf16 = run_loss(name_bf16, 0);
  double mean_f32 = 0, mean_bf16 = 0;
  for (int step = 0; step < 6; step++) {
    double loss = run_loss(name_bf16, step);
    assert_true(isfinite(loss));
    mean_bf16 += loss / 6;
    mean_f32 += run_loss(name_f32, step) / 6;
  }
  print_message("%s: step 0 loss %.5f f32, %.5f bf16; mean %.5f, %.5f\n", objective, first_f32,
                first_bf16, mean_f32, mean_bf16);
  if (fabs(first_bf16 - first_f32) > 2e-3 * fabs(first_f32))
    fail_msg("%s: step 0 loss %.5f in bf16, %.5f in f32", objective, first_bf16, first_f32);
  if (fabs(mean_bf16 - mean_f32) > 0.03 * fabs(mean_f32))
    fail_msg("%s: mean loss %.5f in bf16, more than 3%% from f32's %.5f", objective, mean_bf16,
             mean_f32);
  // The backbone's activations are held in bf16: less than f32's (not half: the heads, the
  // statistics, the images' bf16 copy and a ViT's f32 tokens at the stack's edges stay as they
  // are).
  print_message("%s: activations %.0f bytes f32, %.0f bf16\n", objective,
                (double)f32.activation_bytes, (double)bf16.activation_bytes);
  assert_true(bf16.activation_bytes < f32.activation_bytes);
}

static void test_inbatch_resnet_trains_like_f32(void **state) {
  (void)state;
  check_trains_like_f32("inbatch", "inbatch-f32", "inbatch-bf16");
}

static void test_mae_vit_trains_like_f32(void **state) {
  (void)state;
  check_trains_like_f32("mae", "mae-f32", "mae-bf16");
}

// Two views through one ViT before backward: its edge conversions keep one output per view, and
// the plan holds what the run holds.
static void test_inbatch_vit_bf16_plans_what_it_holds(void **state) {
  (void)state;
  plan_equals_run("inbatch-vit-bf16",
                  "--objective=inbatch --config configs/inbatch-vit.ini --no-knn --set "
                  "train.batch_size=16 --set data.limit=64",
                  "--set train.precision=bf16");
  for (int step = 0; step < 6; step++) assert_true(isfinite(run_loss("inbatch-vit-bf16", step)));
}

int main(void) {
  if (cli_test_init("bf16") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_bf16_matches_f32),
      cmocka_unit_test(test_linear_bf16_matches_f32),
      cmocka_unit_test(test_batchnorm_bf16_matches_reference),
      cmocka_unit_test(test_batchnorm_relu_bf16_matches_reference),
      cmocka_unit_test(test_pool_bf16_feature_is_f32),
      cmocka_unit_test(test_layernorm_bf16_matches_reference),
      cmocka_unit_test(test_gelu_bf16_matches_reference),
      cmocka_unit_test(test_attention_bf16_short_matches_f32),
      cmocka_unit_test(test_attention_bf16_long_matches_f32),
      cmocka_unit_test(test_linear_on_bf16_activations_copies_nothing),
      cmocka_unit_test(test_inbatch_resnet_trains_like_f32),
      cmocka_unit_test(test_mae_vit_trains_like_f32),
      cmocka_unit_test(test_inbatch_vit_bf16_plans_what_it_holds),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
