// CNN ops (convolution, batch normalization, ReLU/GELU, add, global average pooling): forward
// against naive reference loops written here, backward against central finite differences of
// the loss L = sum(out * R) for a fixed random R (so dL/dout = R), FLOP counters against the
// analytic counts, and BatchNorm's running statistics against hand-derived values.
//
// Tolerances (float32): forward |op - reference| < FWD_ATOL; gradients: worst relative error
// (gradcheck.h, denominator floored at GRAD_ATOL_SCALE) < GRAD_RTOL, with eps = EPS_LINEAR for
// ops linear in the checked tensor (rounding is the only error) and EPS_SMOOTH for BN and GELU
// (second-order truncation is O(eps^2)).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "ops/add.h"
#include "nn/head.h"
#include "ops/batchnorm.h"
#include "ops/conv.h"
#include "ops/eltwise.h"
#include "ops/pool.h"

#define FWD_ATOL 1e-4
#define GRAD_RTOL 1e-2
#define GRAD_ATOL_SCALE 1e-2
#define EPS_LINEAR 1e-2f
#define EPS_SMOOTH 1e-2f
// A convolution is linear in its input and in its weights, so a wide step has no truncation
// error and divides the float32 rounding of the loss by more: the 64-channel cases sum 576
// products an output, and Winograd rounds its transforms as well. Their tensors are checked at
// WIDE_SAMPLES entries each (a fixed sample) rather than all 37k weights.
#define EPS_WIDE 0.25f
#define WIDE_SAMPLES 600
// Inputs of ReLU-like kinks are kept at least this far from 0, well beyond any perturbation.
#define KINK_MARGIN 0.05f

// Magnitudes in [KINK_MARGIN, 1] with random signs: no value near ReLU's kink.
static void fill_away_from_zero(float *x, size_t n, uint64_t stream) {
  Rng r = rng_stream(42, RNG_TEST, stream, 1);
  for (size_t i = 0; i < n; i++) {
    float m = rng_uniform_range(&r, KINK_MARGIN, 1.0f);
    x[i] = rng_uniform(&r) < 0.5f ? -m : m;
  }
}

// The loss sum(out * R) after running the op's forward on `in`.
typedef struct {
  void (*forward)(void *op, ExecCtx *ctx, const float *in);
  void *op;
  ExecCtx *ctx;
  const float *in;
  const float *out;  // the op's output buffer
  const float *R;
  size_t n_out;
} LossCtx;

static double loss_fn(void *vctx) {
  LossCtx *c = vctx;
  c->forward(c->op, c->ctx, c->in);
  double s = 0;
  for (size_t i = 0; i < c->n_out; i++) s += (double)c->out[i] * c->R[i];
  return s;
}

static void expect_grad_sampled(LossCtx *lc, float *x, const float *g, size_t n, size_t samples,
                                float eps, const char *label) {
  assert_non_null(g);
  double err = gradcheck(loss_fn, lc, x, g, n, samples, eps, GRAD_ATOL_SCALE, label);
  assert_true(err < GRAD_RTOL);
}

static void expect_grad(LossCtx *lc, float *x, const float *g, size_t n, float eps,
                        const char *label) {
  expect_grad_sampled(lc, x, g, n, n, eps, label);
}

static void conv_fwd(void *l, ExecCtx *ctx, const float *in) { conv2d_forward(l, ctx, in); }
static void bn_fwd(void *l, ExecCtx *ctx, const float *in) { batchnorm_forward(l, ctx, in); }
static void eltwise_fwd(void *l, ExecCtx *ctx, const float *in) { eltwise_forward(l, ctx, in); }
static void gap_fwd(void *l, ExecCtx *ctx, const float *in) { gap_forward(l, ctx, in); }

// ---------------------------------------------------------------------------------------------
// Convolution

typedef struct {
  int N, IC, IH, IW, OC, K, stride, pad, has_bias, need_din;
} ConvCase;

// out (N, OH, OW, OC) from in (N, IH, IW, IC), w (OC, IC, K, K), zero padding.
static void conv_reference(const ConvCase *c, int OH, int OW, const float *in, const float *w,
                           const float *bias, double *out) {
  for (int n = 0; n < c->N; n++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int oc = 0; oc < c->OC; oc++) {
          double s = bias ? bias[oc] : 0.0;
          for (int ic = 0; ic < c->IC; ic++)
            for (int kh = 0; kh < c->K; kh++)
              for (int kw = 0; kw < c->K; kw++) {
                int ih = oh * c->stride - c->pad + kh, iw = ow * c->stride - c->pad + kw;
                if (ih < 0 || ih >= c->IH || iw < 0 || iw >= c->IW) continue;
                s += (double)in[((size_t)(n * c->IH + ih) * c->IW + iw) * c->IC + ic] *
                     w[((size_t)(oc * c->IC + ic) * c->K + kh) * c->K + kw];
              }
          out[((size_t)(n * OH + oh) * OW + ow) * c->OC + oc] = s;
        }
}

// Index of element (n, h, w, c) of an (N, H, W, C) tensor in oneDNN's nChw16c (C a multiple of
// 16): blocks of 16 channels, each an (H, W, 16) plane, images outermost.
static size_t blocked_index(int H, int W, int C, int n, int h, int w, int c) {
  return ((((size_t)n * (C / 16) + c / 16) * H + h) * W + w) * 16 + c % 16;
}

// nhwc `x` rearranged into (or, with to_blocked = 0, back from) nChw16c `y`.
static void reblock(const float *x, float *y, int N, int H, int W, int C, int to_blocked) {
  for (int n = 0; n < N; n++)
    for (int h = 0; h < H; h++)
      for (int w = 0; w < W; w++)
        for (int c = 0; c < C; c++) {
          size_t plain = (((size_t)n * H + h) * W + w) * C + c;
          size_t blocked = blocked_index(H, W, C, n, h, w, c);
          if (to_blocked)
            y[blocked] = x[plain];
          else
            y[plain] = x[blocked];
        }
}

// One case in the builder's activation layout (0: nhwc; ACT_LAYOUT_BLOCKED16: nChw16c, an input of
// fewer than 16 channels read nhwc as the images are) with `algo`; `winograd`: whether the op
// must have taken Winograd. The reference works in nhwc; the op's input and output are converted
// around it, while the gradients are checked in the op's own layout (the loss sum(out * R) does
// not care which).
static void check_conv_in(const ConvCase *c, ActLayout layout, ConvAlgorithm algo, int winograd,
                          float eps) {
  Env e;
  env_init(&e, conv_floats(c->IC, c->OC, c->K, c->has_bias), OP_TRAIN);
  e.b.layout = layout;
  e.policy.conv_algorithm = algo;
  Conv2d l;
  conv2d_init(&l, &e.b, "conv", c->N, c->IC, c->IH, c->IW, c->OC, c->K, c->stride, c->pad,
              c->has_bias, c->need_din);
  int OH = (c->IH + 2 * c->pad - c->K) / c->stride + 1;
  int OW = (c->IW + 2 * c->pad - c->K) / c->stride + 1;
  assert_int_equal(l.OH, OH);
  assert_int_equal(l.OW, OW);
  assert_int_equal(l.winograd, winograd);
  if (!c->need_din) assert_null(l.din);
  // A bias starting at zero would not test its forward use.
  if (c->has_bias) fill_uniform(l.bias, (size_t)c->OC, -0.5f, 0.5f, 1);

  size_t n_in = (size_t)c->N * c->IH * c->IW * c->IC, n_out = (size_t)c->N * OH * OW * c->OC;
  size_t n_w = (size_t)c->OC * c->IC * c->K * c->K;
  const int blocked_in = layout == ACT_LAYOUT_BLOCKED16 && c->IC % 16 == 0;
  const int blocked_out = layout == ACT_LAYOUT_BLOCKED16;
  float *in = new_tensor(n_in), *in_op = new_tensor(n_in), *R = new_tensor(n_out);
  float *out = new_tensor(n_out);
  double *ref = tl_alloc(n_out * sizeof(double), MEM_DATA, COMP_OTHER);
  fill_uniform(in, n_in, -1, 1, 2);
  fill_uniform(R, n_out, -1, 1, 3);
  if (blocked_in)
    reblock(in, in_op, c->N, c->IH, c->IW, c->IC, 1);
  else
    memcpy(in_op, in, n_in * sizeof(float));

  exec_ctx_reset_flops(&e.ctx);
  conv2d_forward(&l, &e.ctx, in_op);
  conv_reference(c, OH, OW, in, l.weight, l.has_bias ? l.bias : NULL, ref);
  if (blocked_out)
    reblock(l.out, out, c->N, OH, OW, c->OC, 0);
  else
    memcpy(out, l.out, n_out * sizeof(float));
  expect_close(out, ref, n_out, FWD_ATOL);

  conv2d_backward(&l, &e.ctx, R);
  // Each of the N OH OW OC outputs is a sum of IC K K products: a multiply and an add each. The
  // bias adds one per output. Backward runs the same products twice, for din (when asked) and for
  // dweight, and sums dout over positions for dbias.
  double pass = 2.0 * c->N * OH * OW * c->OC * c->IC * c->K * c->K;
  double bias = c->has_bias ? (double)c->N * OH * OW * c->OC : 0.0;
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], pass + bias, 0.5);
  assert_float_equal(e.ctx.flops_backward[COMP_ENCODER], (c->need_din ? pass : 0.0) + pass + bias,
                     0.5);
  // Winograd's passes are counted at direct convolution's arithmetic.
  assert_float_equal(e.ctx.flops_winograd, winograd ? (c->need_din ? 3 : 2) * pass : 0.0, 0.5);

  LossCtx lc = {conv_fwd, &l, &e.ctx, in_op, l.out, R, n_out};
  const size_t samples = eps == EPS_WIDE ? WIDE_SAMPLES : SIZE_MAX;
  if (c->need_din) expect_grad_sampled(&lc, in_op, l.din, n_in, samples, eps, "conv din");
  expect_grad_sampled(&lc, l.weight, l.dweight, n_w, samples, eps, "conv dweight");
  if (c->has_bias)
    expect_grad_sampled(&lc, l.bias, l.dbias, (size_t)c->OC, samples, eps, "conv dbias");

  tl_free(in);
  tl_free(in_op);
  tl_free(R);
  tl_free(out);
  tl_free(ref);
  conv2d_destroy(&l);
  env_destroy(&e);
}

static void check_conv(const ConvCase *c) { check_conv_in(c, 0, CONV_ALGO_AUTO, 0, EPS_LINEAR); }

// Convolution cases: N, IC, IH, IW, OC, K, stride, pad, has_bias, need_din.
static const ConvCase conv_cases[] = {
    {2, 3, 5, 5, 4, 3, 1, 1, 1, 1},  // stride 1, padding, bias
    {2, 3, 6, 6, 4, 3, 2, 1, 0, 1},  // stride 2, padding, no bias
    // non-square, no padding, a stride that leaves the last input row and column unused
    {3, 2, 6, 5, 3, 2, 2, 0, 1, 1},
    {2, 3, 5, 5, 4, 3, 1, 1, 1, 0},  // first layer: no input gradient, weight gradients kept
    // The shapes of a real (tiny) network: wider batches and channel counts that oneDNN's
    // optimized kernels handle differently, the 1-channel stem, a 1x1 strided projection.
    {8, 4, 8, 8, 4, 3, 1, 1, 0, 1},
    {8, 4, 8, 8, 8, 3, 2, 1, 0, 1},
    {8, 8, 6, 6, 16, 3, 1, 1, 0, 1},
    {8, 1, 8, 8, 4, 3, 1, 1, 0, 0},
    {8, 4, 8, 8, 8, 1, 2, 0, 0, 1},
};

static void test_conv_cases(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) check_conv(&conv_cases[i]);
}

// Whether this oneDNN offers Winograd here: 2.x (3.2 removed it) on an AVX-512 CPU.
static int winograd_available(void) { return DNNL_VERSION_MAJOR < 3 && cpu_has_avx512(); }

// Blocked activations, as a ResNet whose channel counts are multiples of 16 runs: direct and
// Winograd give the reference convolution and its gradients. Auto takes Winograd for 3x3
// stride-1 layers of 64 channels and more only; strided, 1x1 and image-input layers stay direct
// whatever is asked.
static void test_conv_blocked_layouts(void **state) {
  (void)state;
  const int wino = winograd_available();
  const ConvCase wide = {2, 64, 6, 6, 64, 3, 1, 1, 1, 1}, narrow = {2, 16, 5, 7, 32, 3, 1, 1, 0, 1};
  check_conv_in(&wide, ACT_LAYOUT_BLOCKED16, CONV_ALGO_DIRECT, 0, EPS_WIDE);
  check_conv_in(&wide, ACT_LAYOUT_BLOCKED16, CONV_ALGO_AUTO, wino, EPS_WIDE);
  check_conv_in(&narrow, ACT_LAYOUT_BLOCKED16, CONV_ALGO_AUTO, 0, EPS_WIDE);
  check_conv_in(&narrow, ACT_LAYOUT_BLOCKED16, CONV_ALGO_WINOGRAD, wino, EPS_WIDE);
  // The images: 3 and 1 channels read nhwc, the output blocked; never Winograd.
  const ConvCase rgb = {2, 3, 6, 6, 16, 3, 1, 1, 0, 0}, gray = {2, 1, 6, 6, 16, 3, 1, 1, 0, 0};
  check_conv_in(&rgb, ACT_LAYOUT_BLOCKED16, CONV_ALGO_WINOGRAD, 0, EPS_WIDE);
  check_conv_in(&gray, ACT_LAYOUT_BLOCKED16, CONV_ALGO_WINOGRAD, 0, EPS_WIDE);
  // A strided 3x3 and a 1x1 projection on blocked activations.
  const ConvCase strided = {2, 16, 6, 6, 32, 3, 2, 1, 0, 1},
                 proj = {2, 16, 6, 6, 32, 1, 2, 0, 0, 1};
  check_conv_in(&strided, ACT_LAYOUT_BLOCKED16, CONV_ALGO_WINOGRAD, 0, EPS_WIDE);
  check_conv_in(&proj, ACT_LAYOUT_BLOCKED16, CONV_ALGO_WINOGRAD, 0, EPS_WIDE);
  // nhwc never runs Winograd (oneDNN has none for it).
  check_conv_in(&wide, 0, CONV_ALGO_WINOGRAD, 0, EPS_WIDE);
}

// A strided 1x1 convolution's backward weights over an nhwc input of fewer than 16 channels: on
// oneDNN 2.6 and later its jit kernel writes past the scratchpad it asks for (oneDNN issue #6035).
// At this shape (a batch of 3, which two threads split unevenly) it asks 2432 bytes and writes up
// to byte 3488 on 2.6.3 here. What dnnl_pd_scratchpad_bytes says it needs must hold every write:
// the bytes after it, filled with a pattern, stay untouched over many executions. With the ask
// alone it fails.
static void test_conv_1x1_strided_scratchpad_holds_its_writes(void **state) {
  (void)state;
  enum { CN = 3, IC = 4, OC = 8, IH = 12, OH = 6, RUNS = 40, TAIL = 8192 };
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  DnnlMd src = dnnl_md_plain(4, (dnnl_dims_t){CN, IC, IH, IH}, dnnl_nhwc);
  DnnlMd dst = dnnl_md_plain(4, (dnnl_dims_t){CN, OC, OH, OH}, dnnl_nhwc);
  // The weights in the layout the kernel chooses, as ops/weighted.c asks for them.
  DnnlMd wei = dnnl_md_plain(4, (dnnl_dims_t){OC, IC, 1, 1}, dnnl_format_tag_any);
  const dnnl_dims_t strides = {2, 2}, padding = {0, 0};
  dnnl_primitive_desc_t fwd = dnnl_pd_conv_forward(
      &ctx, dnnl_forward_training, dnnl_convolution_direct, src, wei, NULL, dst, strides, padding);
  dnnl_primitive_desc_t bwd = dnnl_pd_conv_backward_weights(&ctx, dnnl_convolution_direct, src, wei,
                                                            NULL, dst, strides, padding, fwd);
  assert_non_null(bwd);
  dnnl_primitive_t prim = dnnl_prim_new(bwd);
  const size_t need = dnnl_pd_scratchpad_bytes(bwd);
  const size_t asked = dnnl_pd_md_bytes(bwd, dnnl_query_scratchpad_md, 0);
  print_message("backward weights asks %zu scratchpad bytes, is given %zu\n", asked, need);
  assert_true(asked > 0);
  float *x = new_tensor((size_t)CN * IC * IH * IH), *dy = new_tensor((size_t)CN * OC * OH * OH);
  DnnlMd dw_md = dnnl_pd_md(bwd, dnnl_query_diff_weights_md, 0);
  float *dw = new_tensor(dnnl_md_bytes(dw_md) / sizeof(float));
  fill_uniform(x, (size_t)CN * IC * IH * IH, -1, 1, 1);
  fill_uniform(dy, (size_t)CN * OC * OH * OH, -1, 1, 2);
  unsigned char *sp = malloc(need + TAIL);
  assert_non_null(sp);
  dnnl_memory_t m_src = dnnl_mem_new(&ctx, src), m_dst = dnnl_mem_new(&ctx, dst),
                m_wei = dnnl_mem_new(&ctx, dw_md);
  DnnlMd whole = dnnl_md_typed(1, (dnnl_dims_t){(dnnl_dim_t)(need + TAIL)}, dnnl_u8, dnnl_a);
  dnnl_memory_t m_sp = dnnl_mem_new(&ctx, whole);
  dnnl_mem_bind(m_src, x);
  dnnl_mem_bind(m_dst, dy);
  dnnl_mem_bind(m_wei, dw);
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, m_src}, {DNNL_ARG_DIFF_DST, m_dst}, {DNNL_ARG_DIFF_WEIGHTS, m_wei}};
  size_t past = 0;
  for (int r = 0; r < RUNS; r++) {
    memset(sp, 0xAB, need + TAIL);
    dnnl_ctx_exec_scratchpad(&ctx, prim, 3, args, m_sp, sp);
    for (size_t i = asked; i < need + TAIL; i++)
      if (sp[i] != 0xAB && i + 1 > past) past = i + 1;
  }
  print_message("the kernel wrote up to byte %zu\n", past);
  assert_true(past <= need);
  dnnl_memory_t mems[] = {m_src, m_dst, m_wei, m_sp};
  for (size_t i = 0; i < 4; i++) dnnl_memory_destroy(mems[i]);
  DnnlMd mds[] = {src, dst, wei, whole, dw_md};
  for (size_t i = 0; i < 5; i++) dnnl_md_destroy(mds[i]);
  dnnl_primitive_destroy(prim);
  dnnl_primitive_desc_destroy(bwd);
  dnnl_primitive_desc_destroy(fwd);
  free(sp);
  tl_free(x);
  tl_free(dy);
  tl_free(dw);
  exec_ctx_destroy(&ctx);
}

static void test_conv_init_and_infer_mode(void **state) {
  (void)state;
  enum { IC = 8, OC = 8, K = 3 };
  Env e;
  env_init(&e, conv_floats(IC, OC, K, 1), OP_INFER);
  size_t act_before = tl_mem_live(MEM_ACT), grad_before = tl_mem_live(MEM_ACT_GRAD);
  Conv2d l;
  conv2d_init(&l, &e.b, "conv", 2, IC, 5, 5, OC, K, 1, 1, 1, 1);
  // Forward-only: output is workspace, nothing retained, no input gradient.
  assert_null(l.din);
  assert_int_equal(tl_mem_live(MEM_ACT), act_before);
  assert_int_equal(tl_mem_live(MEM_ACT_GRAD), grad_before);
  // Kaiming normal: std sqrt(2 / (IC*K*K)) = 0.157 over 576 draws; bias zero.
  size_t n_w = (size_t)OC * IC * K * K;
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n_w; i++) sum += l.weight[i], sq += (double)l.weight[i] * l.weight[i];
  double mean = sum / n_w, sd = sqrt(sq / n_w - mean * mean), want = sqrt(2.0 / (IC * K * K));
  assert_true(fabs(mean) < 0.2 * want);
  assert_true(fabs(sd - want) < 0.1 * want);
  for (int i = 0; i < OC; i++) assert_float_equal(l.bias[i], 0.0f, 0.0f);
  conv2d_destroy(&l);
  env_destroy(&e);
}

// ---------------------------------------------------------------------------------------------
// Batch normalization

// Per-channel batch mean and biased variance of x (M, C), M = N*H*W.
static void channel_stats(const float *x, size_t M, int C, double *mean, double *var) {
  for (int c = 0; c < C; c++) {
    double s = 0, sq = 0;
    for (size_t m = 0; m < M; m++) s += x[m * C + c];
    mean[c] = s / M;
    for (size_t m = 0; m < M; m++) sq += (x[m * C + c] - mean[c]) * (x[m * C + c] - mean[c]);
    var[c] = sq / M;
  }
}

static void bn_reference(const float *x, size_t M, int C, const double *mean, const double *var,
                         const float *gamma, const float *beta, float eps, int relu, double *y) {
  for (size_t m = 0; m < M; m++)
    for (int c = 0; c < C; c++) {
      double v = gamma[c] * (x[m * C + c] - mean[c]) / sqrt(var[c] + eps) + beta[c];
      y[m * C + c] = relu && v < 0 ? 0 : v;
    }
}

// Draws inputs until every pre-ReLU output is away from the kink (deterministic: fixed streams).
static void fill_bn_input(float *x, size_t M, int C, const float *gamma, const float *beta,
                          float eps, double *y_scratch) {
  double mean[8], var[8];
  for (uint64_t stream = 100;; stream++) {
    fill_uniform(x, M * C, -2, 2, stream);
    channel_stats(x, M, C, mean, var);
    bn_reference(x, M, C, mean, var, gamma, beta, eps, 0, y_scratch);
    double closest = INFINITY;
    for (size_t i = 0; i < M * C; i++) closest = fmin(closest, fabs(y_scratch[i]));
    if (closest > KINK_MARGIN) return;
    assert_true(stream < 10000);
  }
}

static void check_batchnorm(int N, int C, int H, int W, int relu) {
  assert_true(C <= 8);
  Env e;
  env_init(&e, batchnorm_floats(C), OP_TRAIN);
  BatchNorm l;
  batchnorm_init(&l, &e.b, "bn", N, C, H, W, relu, 1);
  for (int c = 0; c < C; c++) {
    assert_float_equal(l.gamma[c], 1.0f, 0.0f);
    assert_float_equal(l.beta[c], 0.0f, 0.0f);
    assert_float_equal(l.running_mean[c], 0.0f, 0.0f);
    assert_float_equal(l.running_var[c], 1.0f, 0.0f);
  }
  // Non-trivial scale and shift, so their use in forward and their gradients are tested.
  fill_uniform(l.gamma, (size_t)C, 0.5f, 1.5f, 4);
  fill_uniform(l.beta, (size_t)C, -0.5f, 0.5f, 5);

  size_t M = (size_t)N * H * W, n = M * C;
  float *in = new_tensor(n), *R = new_tensor(n);
  double *ref = tl_alloc(n * sizeof(double), MEM_DATA, COMP_OTHER);
  fill_bn_input(in, M, C, l.gamma, l.beta, l.eps, ref);
  fill_uniform(R, n, -1, 1, 6);

  double mean[8], var[8];
  channel_stats(in, M, C, mean, var);
  exec_ctx_reset_flops(&e.ctx);
  batchnorm_forward(&l, &e.ctx, in);
  bn_reference(in, M, C, mean, var, l.gamma, l.beta, l.eps, relu, ref);
  expect_close(l.out, ref, n, FWD_ATOL);

  // One pass from (0, 1) with momentum 0.1: mean 0.1 * batch mean, var 0.9 + 0.1 * unbiased var.
  for (int c = 0; c < C; c++) {
    assert_float_equal(l.running_mean[c], 0.1 * mean[c], 1e-5);
    assert_float_equal(l.running_var[c], 0.9 + 0.1 * var[c] * M / (M - 1.0), 1e-5);
  }

  batchnorm_backward(&l, &e.ctx, R);
  // A fused ReLU: one compare more each way.
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], (double)(BN_FWD + relu) * n, 0.5);
  assert_float_equal(e.ctx.flops_backward[COMP_ENCODER], (double)(BN_BWD + relu) * n, 0.5);

  LossCtx lc = {bn_fwd, &l, &e.ctx, in, l.out, R, n};
  expect_grad(&lc, in, l.din, n, EPS_SMOOTH, "bn din");
  expect_grad(&lc, l.gamma, l.dgamma, (size_t)C, EPS_SMOOTH, "bn dgamma");
  expect_grad(&lc, l.beta, l.dbeta, (size_t)C, EPS_SMOOTH, "bn dbeta");

  tl_free(in);
  tl_free(R);
  tl_free(ref);
  batchnorm_destroy(&l);
  env_destroy(&e);
}

// bn_splits = G: each group of N/G samples is normalized with its own statistics (against the
// reference on each group separately), the running statistics follow the groups' mean, and
// every gradient matches finite differences (gamma and beta shared by the groups).
static void test_bn_split_groups(void **state) {
  (void)state;
  enum { N = 6, C = 3, H = 2, W = 2, G = 3 };
  Env e;
  env_init(&e, batchnorm_floats(C), OP_TRAIN);
  e.policy.bn_splits = G;
  BatchNorm l;
  batchnorm_init(&l, &e.b, "bn", N, C, H, W, 1, 1);
  assert_int_equal(l.splits, G);
  fill_uniform(l.gamma, C, 0.5f, 1.5f, 4);
  fill_uniform(l.beta, C, -0.5f, 0.5f, 5);
  const size_t M = (size_t)N * H * W, Mg = M / G, n = M * C, ng = Mg * C;
  float *in = new_tensor(n), *R = new_tensor(n);
  double *ref = tl_alloc(n * sizeof(double), MEM_DATA, COMP_OTHER);
  for (int g = 0; g < G; g++) fill_bn_input(in + g * ng, Mg, C, l.gamma, l.beta, l.eps, ref);
  fill_uniform(R, n, -1, 1, 6);
  batchnorm_forward(&l, &e.ctx, in);
  double mean_of_groups[C] = {0}, var_of_groups[C] = {0};
  for (int g = 0; g < G; g++) {
    double mean[C], var[C];
    channel_stats(in + g * ng, Mg, C, mean, var);
    bn_reference(in + g * ng, Mg, C, mean, var, l.gamma, l.beta, l.eps, 1, ref + g * ng);
    for (int c = 0; c < C; c++) mean_of_groups[c] += mean[c] / G, var_of_groups[c] += var[c] / G;
  }
  expect_close(l.out, ref, n, FWD_ATOL);
  for (int c = 0; c < C; c++) {
    assert_float_equal(l.running_mean[c], 0.1 * mean_of_groups[c], 1e-5);
    assert_float_equal(l.running_var[c], 0.9 + 0.1 * var_of_groups[c] * Mg / (Mg - 1.0), 1e-5);
  }
  batchnorm_backward(&l, &e.ctx, R);
  LossCtx lc = {bn_fwd, &l, &e.ctx, in, l.out, R, n};
  expect_grad(&lc, in, l.din, n, EPS_SMOOTH, "split bn din");
  expect_grad(&lc, l.gamma, l.dgamma, (size_t)C, EPS_SMOOTH, "split bn dgamma");
  expect_grad(&lc, l.beta, l.dbeta, (size_t)C, EPS_SMOOTH, "split bn dbeta");
  tl_free(in);
  tl_free(R);
  tl_free(ref);
  batchnorm_destroy(&l);
  env_destroy(&e);
}

static void test_bn_4d(void **state) {
  (void)state;
  check_batchnorm(2, 3, 5, 5, 0);
}

static void test_bn_4d_relu(void **state) {
  (void)state;
  check_batchnorm(2, 3, 5, 5, 1);
}

static void test_bn_2d(void **state) {
  (void)state;
  check_batchnorm(4, 6, 1, 1, 0);
}

static void test_bn_2d_relu(void **state) {
  (void)state;
  check_batchnorm(4, 6, 1, 1, 1);
}

// After one training pass, an inference copy bound to the same parameters normalizes with the
// running statistics; a forward-mode (momentum encoder) copy uses batch statistics, keeps
// nothing, and updates the running statistics too.
static void test_bn_modes(void **state) {
  (void)state;
  enum { N = 3, C = 4, H = 2, W = 3 };
  const size_t M = N * H * W, n = M * C;
  Env e;
  env_init(&e, batchnorm_floats(C), OP_TRAIN);
  BatchNorm train;
  batchnorm_init(&train, &e.b, "bn", N, C, H, W, 1, 1);
  fill_uniform(train.gamma, C, 0.5f, 1.5f, 7);
  fill_uniform(train.beta, C, -0.5f, 0.5f, 8);
  float *in = new_tensor(n), *in2 = new_tensor(n);
  fill_uniform(in, n, -1, 3, 9);
  fill_uniform(in2, n, -2, 1, 10);
  batchnorm_forward(&train, &e.ctx, in);
  double mean[C], var[C];
  channel_stats(in, M, C, mean, var);

  ParamSet bound;
  paramset_bind(&bound, e.ps.data, NULL, e.ps.count);
  Builder bi = {.ctx = &e.ctx, .params = &bound, .mode = OP_INFER};
  BatchNorm infer;
  batchnorm_init(&infer, &bi, "bn", N, C, H, W, 1, 1);
  assert_ptr_equal(infer.running_mean, train.running_mean);
  assert_null(infer.din);
  double run_mean[C], run_var[C], *ref = tl_alloc(n * sizeof(double), MEM_DATA, COMP_OTHER);
  for (int c = 0; c < C; c++) {
    run_mean[c] = 0.1 * mean[c];
    run_var[c] = 0.9 + 0.1 * var[c] * M / (M - 1.0);
  }
  exec_ctx_reset_flops(&e.ctx);
  batchnorm_forward(&infer, &e.ctx, in2);
  bn_reference(in2, M, C, run_mean, run_var, infer.gamma, infer.beta, infer.eps, 1, ref);
  expect_close(infer.out, ref, n, FWD_ATOL);
  // Running statistics, and the fused ReLU's compare.
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], (double)(BN_FWD_GLOBAL + 1) * n, 0.5);
  // Inference leaves the running statistics alone.
  for (int c = 0; c < C; c++) assert_float_equal(infer.running_mean[c], run_mean[c], 1e-6);

  ParamSet bound_fwd;
  paramset_bind(&bound_fwd, e.ps.data, NULL, e.ps.count);
  Builder bf = {.ctx = &e.ctx, .params = &bound_fwd, .mode = OP_FORWARD};
  BatchNorm fwd;
  batchnorm_init(&fwd, &bf, "bn", N, C, H, W, 1, 1);
  assert_null(fwd.din);
  batchnorm_forward(&fwd, &e.ctx, in2);
  double mean2[C], var2[C];
  channel_stats(in2, M, C, mean2, var2);
  bn_reference(in2, M, C, mean2, var2, fwd.gamma, fwd.beta, fwd.eps, 1, ref);
  expect_close(fwd.out, ref, n, FWD_ATOL);
  for (int c = 0; c < C; c++)
    assert_float_equal(fwd.running_mean[c], 0.9 * run_mean[c] + 0.1 * mean2[c], 1e-5);

  tl_free(in);
  tl_free(in2);
  tl_free(ref);
  batchnorm_destroy(&fwd);
  batchnorm_destroy(&infer);
  paramset_free(&bound);
  paramset_free(&bound_fwd);
  batchnorm_destroy(&train);
  env_destroy(&e);
}

// ---------------------------------------------------------------------------------------------
// Elementwise activations

static double gelu_reference(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static void check_eltwise(EltwiseKind kind) {
  enum { n = 2 * 5 * 5 * 3 };
  Env e;
  env_init(&e, 1, OP_TRAIN);
  e.b.component = COMP_HEAD;  // FLOPs go to the component the op was created under
  Eltwise l;
  eltwise_init(&l, &e.b, kind, n, 1);
  e.b.component = COMP_ENCODER;
  float *in = new_tensor(n), *R = new_tensor(n);
  double ref[n];
  if (kind == ELTWISE_RELU)
    fill_away_from_zero(in, n, 11);
  else
    fill_uniform(in, n, -3, 3, 11);
  fill_uniform(R, n, -1, 1, 12);
  for (size_t i = 0; i < n; i++)
    ref[i] = kind == ELTWISE_RELU ? fmax(0.0, in[i]) : gelu_reference(in[i]);

  exec_ctx_reset_flops(&e.ctx);
  eltwise_forward(&l, &e.ctx, in);
  expect_close(l.out, ref, n, FWD_ATOL);
  eltwise_backward(&l, &e.ctx, R);
  double fwd = kind == ELTWISE_RELU ? 1 : GELU_FWD, bwd = kind == ELTWISE_RELU ? 1 : GELU_BWD;
  assert_float_equal(e.ctx.flops_forward[COMP_HEAD], fwd * n, 0.5);
  assert_float_equal(e.ctx.flops_backward[COMP_HEAD], bwd * n, 0.5);
  assert_float_equal(exec_ctx_total_flops(&e.ctx), (fwd + bwd) * n, 0.5);

  LossCtx lc = {eltwise_fwd, &l, &e.ctx, in, l.out, R, n};
  expect_grad(&lc, in, l.din, n, kind == ELTWISE_RELU ? EPS_LINEAR : EPS_SMOOTH,
              kind == ELTWISE_RELU ? "relu din" : "gelu din");

  tl_free(in);
  tl_free(R);
  eltwise_destroy(&l);
  env_destroy(&e);
}

static void test_relu(void **state) {
  (void)state;
  check_eltwise(ELTWISE_RELU);
}

static void test_gelu(void **state) {
  (void)state;
  check_eltwise(ELTWISE_GELU);
}

// ---------------------------------------------------------------------------------------------
// Projection heads (nn/head.h)

// A three-layer GELU head (DINO's nlayers = 3): Linear -> GELU -> Linear -> GELU -> Linear,
// forward against that computed here in double, every gradient against finite differences; and
// the parameter names of a three-layer BatchNorm head, a two-layer one's with the middle layer's
// between them.
enum { PH_N = 5, PH_I = 4, PH_H = 3, PH_O = 2 };

static double gelu_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

static void linear_ref(const Linear *l, const double *x, int rows, double *y) {
  for (int n = 0; n < rows; n++)
    for (int o = 0; o < l->OC; o++) {
      double s = l->bias[o];
      for (int i = 0; i < l->IC; i++) s += (double)l->weight[o * l->IC + i] * x[n * l->IC + i];
      y[n * l->OC + o] = s;
    }
}

static void head_fwd(void *h, ExecCtx *ctx, const float *in) { head_forward(h, ctx, in); }

static void test_head_three_layers(void **state) {
  (void)state;
  Env e;
  env_init(
      &e,
      linear_floats(PH_I, PH_H, 1) + linear_floats(PH_H, PH_H, 1) + linear_floats(PH_H, PH_O, 1),
      OP_TRAIN);
  ProjectionHead h;
  head_init_with(&h, &e.b, "head", PH_N, PH_I, PH_H, PH_O, 3, HEAD_GELU);
  assert_int_equal(e.ps.used, e.ps.count);
  for (int i = 0; i < 3; i++) fill_uniform(h.fc[i].bias, (size_t)h.fc[i].OC, -0.5f, 0.5f, 10 + i);
  float *in = new_tensor(PH_N * PH_I), *R = new_tensor(PH_N * PH_O);
  fill_uniform(in, PH_N * PH_I, -2, 2, 3);
  fill_uniform(R, PH_N * PH_O, -1, 1, 6);
  double x[PH_N * PH_I], a[PH_N * PH_H], b[PH_N * PH_H], ref[PH_N * PH_O];
  for (int i = 0; i < PH_N * PH_I; i++) x[i] = in[i];
  linear_ref(&h.fc[0], x, PH_N, a);
  for (int i = 0; i < PH_N * PH_H; i++) a[i] = gelu_ref(a[i]);
  linear_ref(&h.fc[1], a, PH_N, b);
  for (int i = 0; i < PH_N * PH_H; i++) b[i] = gelu_ref(b[i]);
  linear_ref(&h.fc[2], b, PH_N, ref);
  head_forward(&h, &e.ctx, in);
  expect_close(h.out, ref, PH_N * PH_O, FWD_ATOL);
  head_backward(&h, &e.ctx, R);
  LossCtx lc = {head_fwd, &h, &e.ctx, in, h.out, R, PH_N * PH_O};
  expect_grad(&lc, in, h.din, PH_N * PH_I, EPS_SMOOTH, "head din");
  const char *labels[3] = {"head fc1", "head fc1_2", "head fc2"};
  for (int i = 0; i < 3; i++) {
    const size_t nw = (size_t)h.fc[i].OC * h.fc[i].IC;
    expect_grad(&lc, h.fc[i].weight, h.fc[i].dweight, nw, EPS_SMOOTH, labels[i]);
    expect_grad(&lc, h.fc[i].bias, h.fc[i].dbias, (size_t)h.fc[i].OC, EPS_SMOOTH, labels[i]);
  }
  tl_free(in);
  tl_free(R);
  head_destroy(&h);
  env_destroy(&e);

  env_init(&e,
           linear_floats(PH_I, PH_H, 1) + linear_floats(PH_H, PH_H, 1) +
               linear_floats(PH_H, PH_O, 1) + 2 * batchnorm_floats(PH_H),
           OP_TRAIN);
  head_init_with(&h, &e.b, "head", PH_N, PH_I, PH_H, PH_O, 3, HEAD_BN_RELU);
  assert_int_equal(e.ps.used, e.ps.count);
  const char *names[] = {"head.fc1.weight",   "head.fc1.bias",          "head.bn.gamma",
                         "head.bn.beta",      "head.bn.running_mean",   "head.bn.running_var",
                         "head.fc1_2.weight", "head.fc1_2.bias",        "head.bn_2.gamma",
                         "head.bn_2.beta",    "head.bn_2.running_mean", "head.bn_2.running_var",
                         "head.fc2.weight",   "head.fc2.bias"};
  assert_int_equal(e.ps.n_entries, (int)(sizeof names / sizeof names[0]));
  for (int i = 0; i < e.ps.n_entries; i++) assert_string_equal(e.ps.entries[i].name, names[i]);
  head_destroy(&h);
  env_destroy(&e);
}

// ---------------------------------------------------------------------------------------------
// Add and global average pooling

static void test_add(void **state) {
  (void)state;
  enum { n = 37 };
  Env e;
  env_init(&e, 1, OP_TRAIN);
  size_t act_before = tl_mem_live(MEM_ACT_GRAD);
  Add fwd, grad_sum;
  add_init(&fwd, &e.b, n, MEM_ACT, 0);
  add_init(&grad_sum, &e.b, n, MEM_ACT_GRAD, 1);
  assert_int_equal(tl_mem_live(MEM_ACT_GRAD) - act_before, n * sizeof(float));
  float *a = new_tensor(n), *b = new_tensor(n);
  double ref[n];
  fill_uniform(a, n, -1, 1, 13);
  fill_uniform(b, n, -1, 1, 14);
  for (int i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
  exec_ctx_reset_flops(&e.ctx);
  add_forward(&fwd, &e.ctx, a, b);
  expect_close(fwd.out, ref, n, 1e-6);
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], n, 0.5);
  add_forward(&grad_sum, &e.ctx, a, b);
  expect_close(grad_sum.out, ref, n, 1e-6);
  assert_float_equal(e.ctx.flops_backward[COMP_ENCODER], n, 0.5);
  tl_free(a);
  tl_free(b);
  add_destroy(&fwd);
  add_destroy(&grad_sum);
  env_destroy(&e);
}

static void test_global_avg_pool(void **state) {
  (void)state;
  enum { N = 3, H = 5, W = 6, C = 4, n_in = N * H * W * C, n_out = N * C };
  Env e;
  env_init(&e, 1, OP_TRAIN);
  GlobalAvgPool l;
  gap_init(&l, &e.b, N, H, W, C, 1);
  float *in = new_tensor(n_in), *R = new_tensor(n_out);
  fill_uniform(in, n_in, -1, 1, 15);
  fill_uniform(R, n_out, -1, 1, 16);
  double ref[n_out];
  for (int b = 0; b < N; b++)
    for (int c = 0; c < C; c++) {
      double s = 0;
      for (int p = 0; p < H * W; p++) s += in[((size_t)b * H * W + p) * C + c];
      ref[b * C + c] = s / (H * W);
    }
  exec_ctx_reset_flops(&e.ctx);
  gap_forward(&l, &e.ctx, in);
  expect_close(l.out, ref, n_out, FWD_ATOL);
  gap_backward(&l, &e.ctx, R);
  assert_float_equal(e.ctx.flops_forward[COMP_ENCODER], n_in, 0.5);
  assert_float_equal(e.ctx.flops_backward[COMP_ENCODER], n_in, 0.5);
  LossCtx lc = {gap_fwd, &l, &e.ctx, in, l.out, R, n_out};
  expect_grad(&lc, in, l.din, n_in, EPS_LINEAR, "gap din");
  tl_free(in);
  tl_free(R);
  gap_destroy(&l);
  env_destroy(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_cases),
      cmocka_unit_test(test_conv_1x1_strided_scratchpad_holds_its_writes),
      cmocka_unit_test(test_conv_blocked_layouts),
      cmocka_unit_test(test_conv_init_and_infer_mode),
      cmocka_unit_test(test_bn_4d),
      cmocka_unit_test(test_bn_4d_relu),
      cmocka_unit_test(test_bn_2d),
      cmocka_unit_test(test_bn_2d_relu),
      cmocka_unit_test(test_bn_modes),
      cmocka_unit_test(test_bn_split_groups),
      cmocka_unit_test(test_relu),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_head_three_layers),
      cmocka_unit_test(test_add),
      cmocka_unit_test(test_global_avg_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
