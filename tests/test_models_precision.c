// Every model file Tally ships (models/*.ini, read from the folder, so a new one is checked
// without a line here) trains in bf16 as it does in fp32: built from the same initial parameters
// under [train] precision = bf16 (activations bf16 between layers where the family keeps them so)
// and in fp32, at a batch of 4 and the largest of 64, 32 and 28 px the file accepts, its feature
// and parameter gradients agree within what bf16's 8-bit mantissa explains (see SCALE), and
// nothing is non-finite. An op that ignores the activations' data type (a max-pool that read a
// bf16 ResNet's activations as floats did) makes them non-finite.
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "config.h"
#include "core/rng.h"
#include "nn/backbone.h"
#include "objectives/objective.h"

enum { N = 4, C = 3 };

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  Backbone *bb;
  BuildPolicy policy;
} Net;

static void net_build(Net *n, const ModelSpec *spec, int S, int bf16) {
  memset(n, 0, sizeof *n);
  exec_ctx_init(&n->ctx);
  n->policy = build_policy_default();
  n->policy.bf16 = bf16;
  paramset_alloc(&n->ps, backbone_param_count(spec, S, C), 7);
  Builder b = {.ctx = &n->ctx, .params = &n->ps, .mode = OP_TRAIN, .policy = &n->policy};
  n->bb = backbone_create(spec, &b, N, S, C);
  assert_int_equal(n->ps.used, n->ps.count);
}

static void net_destroy(Net *n) {
  n->bb->destroy(n->bb);
  paramset_free(&n->ps);
  exec_ctx_destroy(&n->ctx);
}

// ||a - b|| / ||b||, or INFINITY when either holds a non-finite value.
static double relative_error(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)b[i] * b[i];
  }
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

// The smallest of a few sides the file's family accepts (and its pad_to frames), or 0.
static int smallest_side(const ModelSpec *spec, const char *file) {
  static const int sides[] = {64, 32, 28};
  for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
    const int S = sides[i];
    if (spec->pad_to && spec->pad_to < S) continue;
    const BackboneSection *sec = backbone_def(spec)->settings;
    if (!sec->validate || sec->validate(spec, S, file) == 0) return S;
  }
  return 0;
}

// What bf16 may move: the f32 network itself, with its weights rounded to bf16 (one rounding of
// each, where bf16 training rounds every activation and gradient too), sets the scale. A deep
// ResNet at initialization is that sensitive: rounding ResNet-50's weights alone moves its
// feature by 20% and its gradients by more than their size at a batch of 4, while a ViT's move by
// 0.4%. bf16 may be a few times that, plus a floor; an op that reads bf16 bytes as floats (or
// the reverse) makes values non-finite or off by orders of magnitude.
#define SCALE 6.0
#define FLOOR 0.01

// Rounds to the nearest bf16, ties to even (as oneDNN's conversion does), in place.
static void round_to_bf16(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x[i], &u, sizeof u);
  }
}

static void check_model(const char *file) {
  Config cfg;
  config_defaults(&cfg);
  if (config_load_model(&cfg, file) != 0) fail_msg("%s", tl_last_error());
  const ModelSpec *spec = &cfg.model.spec;
  const int S = smallest_side(spec, file);
  if (!S) fail_msg("%s: no image side of 64, 32 or 28 px fits it", file);
  // f32, bf16, and f32 from weights rounded to bf16 (the sensitivity).
  Net nets[3];
  for (int k = 0; k < 3; k++) net_build(&nets[k], spec, S, k == 1);
  assert_memory_equal(nets[0].ps.data, nets[1].ps.data, sizeof(float) * nets[0].ps.count);
  round_to_bf16(nets[2].ps.data, nets[2].ps.count);

  const size_t n_img = (size_t)N * S * S * C, n_feat = (size_t)N * nets[0].bb->feature_dim;
  float *images = malloc(sizeof(float) * n_img), *dfeat = malloc(sizeof(float) * n_feat);
  Rng r = rng_stream(5, RNG_TEST, 0, 0);
  for (size_t i = 0; i < n_img; i++) images[i] = rng_normal(&r);
  for (size_t i = 0; i < n_feat; i++) dfeat[i] = rng_normal(&r);
  for (int k = 0; k < 3; k++) {
    paramset_zero_grad(&nets[k].ps, 0);
    nets[k].bb->forward(nets[k].bb, &nets[k].ctx, images);
    nets[k].bb->backward(nets[k].bb, &nets[k].ctx, dfeat);
  }
  const size_t np = nets[0].ps.count;
  double feat[3], grad[3];
  for (int k = 1; k < 3; k++) {
    feat[k] = relative_error(nets[k].bb->feature, nets[0].bb->feature, n_feat);
    grad[k] = relative_error(nets[k].ps.grad, nets[0].ps.grad, np);
  }
  print_message(
      "%s at %d px, relative to fp32: bf16 feature %.2e, gradients %.2e; fp32 from "
      "bf16-rounded weights %.2e, %.2e\n",
      file, S, feat[1], grad[1], feat[2], grad[2]);
  if (!isfinite(feat[2]) || !isfinite(grad[2]))
    fail_msg("%s: fp32 from bf16-rounded weights is not finite", file);
  if (!(feat[1] <= SCALE * feat[2] + FLOOR))
    fail_msg("%s: the bf16 feature is %.3g from fp32's, against %.3g for rounded weights", file,
             feat[1], feat[2]);
  if (!(grad[1] <= SCALE * grad[2] + FLOOR))
    fail_msg("%s: the bf16 gradients are %.3g from fp32's, against %.3g for rounded weights", file,
             grad[1], grad[2]);
  free(images);
  free(dfeat);
  for (int k = 0; k < 3; k++) net_destroy(&nets[k]);
}

static int is_ini(const struct dirent *d) {
  const size_t n = strlen(d->d_name);
  return n > 4 && strcmp(d->d_name + n - 4, ".ini") == 0;
}

static void test_every_model_file_in_bf16(void **state) {
  (void)state;
  struct dirent **names;
  const int n = scandir("models", &names, is_ini, alphasort);
  if (n < 0) fail_msg("cannot read models/ (run from the checkout)");
  assert_true(n >= 5);  // resnet-small, resnet18, resnet50, vit-tiny, convnext_tiny at least
  for (int i = 0; i < n; i++) {
    char path[300];
    snprintf(path, sizeof path, "models/%s", names[i]->d_name);
    check_model(path);
    free(names[i]);
  }
  free(names);
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_model_file_in_bf16)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
