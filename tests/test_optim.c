// Optimizers against hand-derived values and independent double-precision trajectories; the
// learning-rate schedule at its key steps.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/error.h"
#include "core/params.h"
#include "core/rng.h"
#include "train/optim.h"
#include "objectives/objective.h"

// A 7-float set: "w" (3, decayed and LARS-adapted), "b" (2, no_decay), "bn.mean" (2, buffer).
enum { W_OFF = 0, W_N = 3, B_OFF = 3, B_N = 2, BUF_OFF = 5, BUF_N = 2, N = 7, STEPS = 3 };

static const float init_data[N] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 3.0f, 4.0f};
// (STEPS, N): the buffer's gradient is nonzero on purpose: it must still be ignored.
static const float step_grads[STEPS][N] = {
    {0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 9.0f, -9.0f},
    {-0.3f, 0.1f, 0.2f, 0.2f, 0.1f, 9.0f, -9.0f},
    {0.05f, 0.25f, -0.1f, -0.3f, 0.15f, 9.0f, -9.0f},
};

static void make_set(ParamSet *ps) {
  paramset_alloc(ps, N, 7);
  float *w = paramset_take(ps, "w", W_N, 0, NULL);
  float *b = paramset_take(ps, "b", B_N, 1, NULL);
  float *buf = paramset_take_buffer(ps, "bn.mean", BUF_N);
  assert_ptr_equal(w, ps->data + W_OFF);
  assert_ptr_equal(b, ps->data + B_OFF);
  assert_ptr_equal(buf, ps->data + BUF_OFF);
  memcpy(ps->data, init_data, sizeof init_data);
}

static void assert_close(double expected, double got, double tol, const char *what, int i) {
  if (fabs(expected - got) > tol)
    fail_msg("%s[%d]: expected %.9g, got %.9g", what, i, expected, got);
}

static void assert_buffer_untouched(const ParamSet *ps) {
  for (int i = BUF_OFF; i < BUF_OFF + BUF_N; i++) assert_true(ps->data[i] == init_data[i]);
}

// ---- hand-derived single-element values ------------------------------------------------------

static void test_sgd_by_hand(void **state) {
  (void)state;
  ParamSet ps;
  paramset_alloc(&ps, 1, 1);
  paramset_take(&ps, "x", 1, 0, NULL);
  ps.data[0] = 1.0f;
  Optimizer *opt = optim_create("sgd", &ps, 0.1f, 0.9f, 0.1f, 0, 0, 0, 0);
  assert_non_null(opt);
  // step 1: g = 0.5 + 0.1*1 = 0.6, buf = 0.6, p = 1 - 0.1*0.6 = 0.94
  ps.grad[0] = 0.5f;
  optim_step(opt, 0.1f);
  assert_close(0.94, ps.data[0], 1e-6, "p1", 0);
  // step 2: g = 0.5 + 0.1*0.94 = 0.594, buf = 0.9*0.6 + 0.594 = 1.134, p = 0.94 - 0.1134 = 0.8266
  optim_step(opt, 0.1f);
  assert_close(0.8266, ps.data[0], 1e-6, "p2", 0);
  assert_close(1.134, opt->momentum_buf[0], 1e-6, "buf2", 0);
  optim_destroy(opt);
  paramset_free(&ps);
}

static void test_lars_by_hand(void **state) {
  (void)state;
  ParamSet ps;
  paramset_alloc(&ps, 3, 1);
  paramset_take(&ps, "w", 2, 0, NULL);
  paramset_take(&ps, "zero", 1, 0, NULL);
  ps.data[0] = 3.0f, ps.data[1] = 4.0f, ps.data[2] = 0.0f;
  ps.grad[0] = 0.3f, ps.grad[1] = 0.4f, ps.grad[2] = 0.5f;
  Optimizer *opt = optim_create("lars", &ps, 1.0f, 0.9f, 0.0f, 0, 0, 0, 0.001f);
  assert_non_null(opt);
  // w: ||p|| = 5, ||g|| = 0.5, trust = 0.001*5/0.5 = 0.01, buf = 0.01*g = (0.003, 0.004)
  // zero: ||p|| = 0, so trust = 1, buf = 0.5, p = -0.5
  optim_step(opt, 1.0f);
  assert_close(2.997, ps.data[0], 1e-6, "w", 0);
  assert_close(3.996, ps.data[1], 1e-6, "w", 1);
  assert_close(-0.5, ps.data[2], 1e-6, "zero", 0);
  optim_destroy(opt);
  paramset_free(&ps);
}

static void test_adamw_by_hand(void **state) {
  (void)state;
  ParamSet ps;
  paramset_alloc(&ps, 1, 1);
  paramset_take(&ps, "x", 1, 0, NULL);
  ps.data[0] = 1.0f;
  Optimizer *opt = optim_create("adamw", &ps, 0.1f, 0, 0.1f, 0.9f, 0.999f, 1e-8f, 0);
  assert_non_null(opt);
  // step 1: p = 1*(1 - 0.1*0.1) = 0.99; m_hat = g, v_hat = g^2, so the step is lr*g/|g| = 0.1
  ps.grad[0] = 0.5f;
  optim_step(opt, 0.1f);
  assert_close(0.89, ps.data[0], 1e-6, "p1", 0);
  // step 2, same g: m = 0.05*0.9 + 0.05 = 0.095, m_hat = 0.095/0.19 = 0.5; v_hat = 0.25: again 0.1
  optim_step(opt, 0.1f);
  assert_close(0.89 * 0.99 - 0.1, ps.data[0], 1e-6, "p2", 0);
  optim_destroy(opt);
  paramset_free(&ps);
}

// A frozen backbone (the block's first floats): its parameters and momentum stay as they are,
// weight decay included, while the rest takes the ordinary update; unfrozen, it takes it too.
static void test_frozen_backbone_by_hand(void **state) {
  (void)state;
  const char *kinds[] = {"sgd", "lars"};
  for (int k = 0; k < 2; k++) {
    ParamSet ps;
    paramset_alloc(&ps, 2, 1);
    paramset_take(&ps, "backbone.w", 1, 0, NULL);
    paramset_take(&ps, "head.w", 1, 0, NULL);
    ps.data[0] = ps.data[1] = 1.0f;
    // lars with eta = 1: trust = ||p|| / ||g + wd p|| = 1 / 0.6, so its step is lr * g / 0.6.
    Optimizer *opt = optim_create(kinds[k], &ps, 0.1f, 0.9f, 0.1f, 0, 0, 0, 1.0f);
    assert_non_null(opt);
    opt->backbone_floats = 1;
    opt->backbone_frozen = 1;
    ps.grad[0] = ps.grad[1] = 0.5f;
    optim_step(opt, 0.1f);
    // sgd, as test_sgd_by_hand: g = 0.6, buf = 0.6, p = 0.94; lars: buf = 0.1, p = 0.9
    const double head1 = k == 0 ? 0.94 : 0.9;
    assert_true(ps.data[0] == 1.0f && opt->momentum_buf[0] == 0.0f);
    assert_close(head1, ps.data[1], 1e-6, kinds[k], 1);
    opt->backbone_frozen = 0;
    optim_step(opt, 0.1f);
    // the backbone's first update, from its untouched state: as the head's first
    assert_close(head1, ps.data[0], 1e-6, kinds[k], 0);
    optim_destroy(opt);
    paramset_free(&ps);
  }
}

// After a freeze the backbone warms up again: its learning rate is the step's times
// (step - freeze + 1) / warmup over the warm-up's steps, the head's is the step's throughout.
static void test_backbone_warmup_after_freeze(void **state) {
  (void)state;
  // freeze 20, warm-up 10: steps 20..29 scale 0.1..1.0; before (frozen anyway) and after, 1
  assert_close(0.1, backbone_lr_scale_at(20, 20, 10), 1e-7, "step", 20);
  assert_close(0.5, backbone_lr_scale_at(24, 20, 10), 1e-7, "step", 24);
  assert_close(1.0, backbone_lr_scale_at(29, 20, 10), 1e-7, "step", 29);
  assert_close(1.0, backbone_lr_scale_at(30, 20, 10), 0, "step", 30);
  assert_close(1.0, backbone_lr_scale_at(5, 20, 10), 0, "step", 5);
  // no freeze, or no warm-up: nothing to ramp
  assert_close(1.0, backbone_lr_scale_at(0, 0, 10), 0, "nofreeze", 0);
  assert_close(1.0, backbone_lr_scale_at(20, 20, 0), 0, "nowarmup", 20);
  ParamSet ps;
  paramset_alloc(&ps, 2, 1);
  paramset_take(&ps, "backbone.w", 1, 0, NULL);
  paramset_take(&ps, "head.w", 1, 0, NULL);
  ps.data[0] = ps.data[1] = 1.0f;
  Optimizer *opt = optim_create("sgd", &ps, 0.1f, 0.9f, 0.1f, 0, 0, 0, 0);
  assert_non_null(opt);
  opt->backbone_floats = 1;
  opt->backbone_lr_scale = 0.5f;
  ps.grad[0] = ps.grad[1] = 0.5f;
  optim_step(opt, 0.1f);
  // g = 0.5 + 0.1 * 1 = 0.6, buf = 0.6; backbone p = 1 - 0.05 * 0.6 = 0.97, head 1 - 0.06 = 0.94
  assert_close(0.97, ps.data[0], 1e-6, "backbone", 0);
  assert_close(0.94, ps.data[1], 1e-6, "head", 1);
  optim_destroy(opt);
  paramset_free(&ps);
}

// ---- three-step trajectories over the 7-float set, reference in double -----------------------

typedef struct {
  double p[N], buf[N], v[N];
} RefState;

static void ref_init(RefState *r) {
  memset(r, 0, sizeof *r);
  for (int i = 0; i < N; i++) r->p[i] = init_data[i];
}

static int is_decayed(int i) { return i >= W_OFF && i < W_OFF + W_N; }

static void compare_trajectory(const ParamSet *ps, const RefState *r, const char *what) {
  for (int i = 0; i < N; i++) assert_close(r->p[i], ps->data[i], 2e-6, what, i);
  assert_buffer_untouched(ps);
}

static const float LR[STEPS] = {0.1f, 0.05f, 0.2f};

static void test_sgd_trajectory(void **state) {
  (void)state;
  const double mom = 0.9, wd = 0.01;
  ParamSet ps;
  make_set(&ps);
  Optimizer *opt = optim_create("sgd", &ps, 0.1f, (float)mom, (float)wd, 0, 0, 0, 0);
  RefState r;
  ref_init(&r);
  for (int s = 0; s < STEPS; s++) {
    memcpy(ps.grad, step_grads[s], sizeof step_grads[s]);
    optim_step(opt, LR[s]);
    for (int i = 0; i < BUF_OFF; i++) {
      double g = step_grads[s][i] + (is_decayed(i) ? wd * r.p[i] : 0.0);
      r.buf[i] = s == 0 ? g : mom * r.buf[i] + g;
      r.p[i] -= LR[s] * r.buf[i];
    }
    compare_trajectory(&ps, &r, "sgd");
  }
  assert_int_equal(opt->steps_done, STEPS);
  optim_destroy(opt);
  paramset_free(&ps);
}

static void test_lars_trajectory(void **state) {
  (void)state;
  const double mom = 0.9, wd = 0.01, eta = 0.02;
  ParamSet ps;
  make_set(&ps);
  Optimizer *opt = optim_create("lars", &ps, 0.1f, (float)mom, (float)wd, 0, 0, 0, (float)eta);
  RefState r;
  ref_init(&r);
  for (int s = 0; s < STEPS; s++) {
    memcpy(ps.grad, step_grads[s], sizeof step_grads[s]);
    optim_step(opt, LR[s]);
    double g[N], p_sq = 0, g_sq = 0;
    for (int i = 0; i < BUF_OFF; i++) g[i] = step_grads[s][i] + (is_decayed(i) ? wd * r.p[i] : 0.0);
    for (int i = W_OFF; i < W_OFF + W_N; i++) p_sq += r.p[i] * r.p[i], g_sq += g[i] * g[i];
    double trust_w = eta * sqrt(p_sq) / sqrt(g_sq);
    for (int i = 0; i < BUF_OFF; i++) {
      double trust = is_decayed(i) ? trust_w : 1.0;
      r.buf[i] = mom * r.buf[i] + LR[s] * trust * g[i];
      r.p[i] -= r.buf[i];
    }
    compare_trajectory(&ps, &r, "lars");
  }
  optim_destroy(opt);
  paramset_free(&ps);
}

static void test_adamw_trajectory(void **state) {
  (void)state;
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.05;
  ParamSet ps;
  make_set(&ps);
  Optimizer *opt =
      optim_create("adamw", &ps, 0.1f, 0, (float)wd, (float)b1, (float)b2, (float)eps, 0);
  RefState r;
  ref_init(&r);
  for (int s = 0; s < STEPS; s++) {
    memcpy(ps.grad, step_grads[s], sizeof step_grads[s]);
    optim_step(opt, LR[s]);
    int t = s + 1;
    for (int i = 0; i < BUF_OFF; i++) {
      double g = step_grads[s][i];
      if (is_decayed(i)) r.p[i] *= 1.0 - LR[s] * wd;
      r.buf[i] = b1 * r.buf[i] + (1 - b1) * g;
      r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
      double m_hat = r.buf[i] / (1 - pow(b1, t));
      double v_hat = r.v[i] / (1 - pow(b2, t));
      r.p[i] -= LR[s] * m_hat / (sqrt(v_hat) + eps);
    }
    compare_trajectory(&ps, &r, "adamw");
  }
  optim_destroy(opt);
  paramset_free(&ps);
}

// ---- multi-chunk tensors: same norms, same bits on any thread count --------------------------

enum { BIG = 40000 };  // several optimizer chunks in one tensor

static void run_big_lars(float *out, int threads) {
  ParamSet ps;
  paramset_alloc(&ps, BIG + 5, 3);
  float *w = paramset_take(&ps, "w", BIG, 0, NULL);
  paramset_take(&ps, "b", 5, 1, NULL);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (int i = 0; i < BIG + 5; i++) ps.data[i] = rng_normal(&r), ps.grad[i] = 0.1f * rng_normal(&r);
  Optimizer *opt = optim_create("lars", &ps, 1.0f, 0.9f, 1e-4f, 0, 0, 0, 0.001f);
  double p_sq = 0, g_sq = 0;
  for (int i = 0; i < BIG; i++) {
    double g = ps.grad[i] + 1e-4 * (double)w[i];
    p_sq += (double)w[i] * w[i], g_sq += g * g;
  }
  double trust = 0.001 * sqrt(p_sq) / sqrt(g_sq);
  float before[3] = {w[0], w[BIG / 2], w[BIG - 1]};
  float grad[3] = {ps.grad[0], ps.grad[BIG / 2], ps.grad[BIG - 1]};
  omp_set_num_threads(threads);
  optim_step(opt, 0.5f);
  int idx[3] = {0, BIG / 2, BIG - 1};
  for (int k = 0; k < 3; k++) {
    double expected = before[k] - 0.5 * trust * (grad[k] + 1e-4 * (double)before[k]);
    assert_close(expected, w[idx[k]], 1e-6, "big w", idx[k]);
  }
  memcpy(out, ps.data, sizeof(float) * (BIG + 5));
  optim_destroy(opt);
  paramset_free(&ps);
}

static void test_lars_multichunk_deterministic(void **state) {
  (void)state;
  static float one[BIG + 5], two[BIG + 5];
  int saved = omp_get_max_threads();
  run_big_lars(one, 1);
  run_big_lars(two, 2);
  omp_set_num_threads(saved);
  assert_memory_equal(one, two, sizeof one);
}

// ---- creation, errors, accounting -----------------------------------------------------------

static void test_create_errors_and_state_bytes(void **state) {
  (void)state;
  ParamSet ps;
  make_set(&ps);
  assert_null(optim_create("rmsprop", &ps, 0.1f, 0.9f, 0, 0, 0, 0, 0));
  assert_non_null(strstr(tl_last_error(), "rmsprop"));
  assert_null(optim_create("sgd", &ps, 0.1f, 1.5f, 0, 0, 0, 0, 0));
  assert_non_null(strstr(tl_last_error(), "momentum"));
  assert_null(optim_create("adamw", &ps, 0.1f, 0, 0, 0.9f, 0.95f, 0.0f, 0));
  assert_non_null(strstr(tl_last_error(), "eps"));

  assert_int_equal(optim_state_bytes("sgd", 10), 40);
  assert_int_equal(optim_state_bytes("lars", 10), 40);
  assert_int_equal(optim_state_bytes("adamw", 10), 80);
  const char *names[] = {"sgd", "lars", "adamw"};
  for (int k = 0; k < 3; k++) {
    size_t before = tl_mem_live(MEM_OPTIM);
    Optimizer *opt = optim_create(names[k], &ps, 0.1f, 0.9f, 0.01f, 0.9f, 0.95f, 1e-8f, 0.001f);
    assert_non_null(opt);
    assert_int_equal(tl_mem_live(MEM_OPTIM) - before, optim_state_bytes(names[k], ps.count));
    optim_destroy(opt);
    assert_int_equal(tl_mem_live(MEM_OPTIM), before);
  }
  paramset_free(&ps);
}

// ---- schedule --------------------------------------------------------------------------------

static void test_schedule(void **state) {
  (void)state;
  const float peak = 2.0f;
  const int warmup = 10, total = 110;
  assert_close(0.2, lr_at_step(peak, 0, warmup, total, "cosine"), 1e-7, "step", 0);
  assert_close(1.0, lr_at_step(peak, 4, warmup, total, "cosine"), 1e-7, "step", 4);
  assert_close(2.0, lr_at_step(peak, 9, warmup, total, "cosine"), 1e-7, "step", 9);
  assert_close(2.0, lr_at_step(peak, 10, warmup, total, "cosine"), 1e-7, "step", 10);
  // halfway through the 100 decay steps: cos(pi/2) = 0, so half the peak
  assert_close(1.0, lr_at_step(peak, 60, warmup, total, "cosine"), 1e-6, "step", 60);
  assert_close(1.0 + cos(M_PI * 0.25), lr_at_step(peak, 35, warmup, total, "cosine"), 1e-6, "step",
               35);
  assert_close(1.0 + cos(M_PI * 0.99), lr_at_step(peak, 109, warmup, total, "cosine"), 1e-6, "step",
               109);
  assert_close(0.0, lr_at_step(peak, 110, warmup, total, "cosine"), 0, "step", 110);
  assert_close(0.0, lr_at_step(peak, 500, warmup, total, "cosine"), 0, "step", 500);

  assert_close(0.2, lr_at_step(peak, 0, warmup, total, "constant"), 1e-7, "const", 0);
  assert_close(2.0, lr_at_step(peak, 10, warmup, total, "constant"), 0, "const", 10);
  assert_close(2.0, lr_at_step(peak, 109, warmup, total, "constant"), 0, "const", 109);

  // no warm-up: the first step is at the peak
  assert_close(2.0, lr_at_step(peak, 0, 0, 100, "cosine"), 0, "nowarm", 0);
  assert_close(2.0, lr_at_step(peak, 0, 0, 100, "constant"), 0, "nowarm", 0);
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_by_hand),
      cmocka_unit_test(test_lars_by_hand),
      cmocka_unit_test(test_adamw_by_hand),
      cmocka_unit_test(test_frozen_backbone_by_hand),
      cmocka_unit_test(test_backbone_warmup_after_freeze),
      cmocka_unit_test(test_sgd_trajectory),
      cmocka_unit_test(test_lars_trajectory),
      cmocka_unit_test(test_adamw_trajectory),
      cmocka_unit_test(test_lars_multichunk_deterministic),
      cmocka_unit_test(test_create_errors_and_state_bytes),
      cmocka_unit_test(test_schedule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
