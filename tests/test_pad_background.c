// pad_to frames an image in black as the input normalization maps it, (0 - mean_c) / std_c per
// channel: the same as padding the raw image with 0 and normalizing afterwards (torchvision's
// Pad then Normalize), on both backbones, forward and backward.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model_test_util.h"
#include "nn/backbone.h"
#include "nn/vit.h"

// N images of S x S x C in [0, 1], framed to P = S + 4 (a margin of 2: even, as resnet needs,
// and P a multiple of the vit's patch side 4).
enum { N = 2, S = 8, C = 3, P = S + 4, M = (P - S) / 2, FEATURE_DIM = 8 };

// Far from mean 0 / std 1, and different per channel, so a zero frame or one channel's value
// used for all would show.
static const float mean[C] = {0.286f, 0.61f, 0.05f};
static const float std_dev[C] = {0.353f, 0.2f, 0.9f};

// The tiny networks (both give FEATURE_DIM features) framed to `pad_to` in black.
static void tiny_spec(ModelSpec *m, const char *type, int pad_to) {
  *m = tiny_model_spec(type);
  m->pad_to = pad_to;
  snprintf(m->pad_fill, sizeof m->pad_fill, "black");
}

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  Backbone *bb;
} Encoder;

// A training backbone on images of `size`, parameters from seed 3: the parameter count does not
// depend on the image size, so encoders of one type start from the same weights.
static void encoder_open(Encoder *e, const ModelSpec *spec, int size) {
  exec_ctx_init(&e->ctx);
  paramset_alloc(&e->ps, backbone_param_count(spec, size, C), 3);
  Builder b = {.ctx = &e->ctx, .params = &e->ps, .mode = OP_TRAIN};
  e->bb = backbone_create(spec, &b, N, size, C);
  assert_non_null(e->bb);
  assert_int_equal(e->ps.used, e->ps.count);
}

static void encoder_close(Encoder *e) {
  e->bb->destroy(e->bb);
  paramset_free(&e->ps);
  exec_ctx_destroy(&e->ctx);
}

// Features (N, FEATURE_DIM) into `feature`, then backward of sum(feature * dfeature): the
// parameter gradients are left in e->ps.grad.
static void encoder_run(Encoder *e, const float *images, const float *dfeature, float *feature) {
  paramset_zero_grad(&e->ps, 0);
  e->bb->forward(e->bb, &e->ctx, images);
  memcpy(feature, e->bb->feature, sizeof(float) * N * FEATURE_DIM);
  e->bb->backward(e->bb, &e->ctx, dfeature);
}

static float normalized(float raw, int ch) { return (raw - mean[ch]) / std_dev[ch]; }

// The same raw images, normalized two ways: `small` (N, S, S, C) as they are, and `framed`
// (N, P, P, C) padded with raw 0 first, then normalized.
static void make_images(float *small, float *framed) {
  Rng r = rng_stream(21, RNG_TEST, 0, 0);
  for (int n = 0; n < N; n++)
    for (int y = 0; y < P; y++)
      for (int x = 0; x < P; x++)
        for (int ch = 0; ch < C; ch++) {
          int inside = y >= M && y < M + S && x >= M && x < M + S;
          float raw = inside ? rng_uniform(&r) : 0.0f;
          framed[((n * P + y) * P + x) * C + ch] = normalized(raw, ch);
          if (inside) small[((n * S + y - M) * S + x - M) * C + ch] = normalized(raw, ch);
        }
}

// The backbone with pad_to = P on the small images gives the features and parameter gradients of
// the same backbone without pad_to on the images framed before normalization; told no
// normalization, it frames with 0 (the data's mean grey after normalization) and differs.
static void check_frame_is_normalized_black(const char *type) {
  float small[N * S * S * C], framed[N * P * P * C], dfeature[N * FEATURE_DIM];
  make_images(small, framed);
  Rng r = rng_stream(22, RNG_TEST, 0, 0);
  for (int i = 0; i < N * FEATURE_DIM; i++) dfeature[i] = rng_normal(&r);
  ModelSpec padded_spec, plain_spec;
  tiny_spec(&padded_spec, type, P);
  tiny_spec(&plain_spec, type, 0);

  Encoder plain, padded;
  encoder_open(&plain, &plain_spec, P);
  encoder_open(&padded, &padded_spec, S);
  float want[N * FEATURE_DIM], got[N * FEATURE_DIM], grey[N * FEATURE_DIM];
  encoder_run(&plain, framed, dfeature, want);
  encoder_run(&padded, small, dfeature, grey);
  backbone_set_input_normalization(padded.bb, mean, std_dev);
  encoder_run(&padded, small, dfeature, got);

  double largest = 0, grey_diff = 0;
  for (int i = 0; i < N * FEATURE_DIM; i++) {
    assert_float_equal(got[i], want[i], 1e-5);
    largest = fmax(largest, fabs(want[i]));
    grey_diff = fmax(grey_diff, fabs(grey[i] - want[i]));
  }
  assert_true(largest > 0.1);     // not a comparison of two zero vectors
  assert_true(grey_diff > 1e-2);  // the frame's value reaches the features
  assert_int_equal(padded.ps.count, plain.ps.count);
  double grad_largest = 0;
  for (size_t i = 0; i < plain.ps.count; i++) {
    assert_float_equal(padded.ps.grad[i], plain.ps.grad[i], 1e-4);
    grad_largest = fmax(grad_largest, fabs(plain.ps.grad[i]));
  }
  assert_true(grad_largest > 1e-2);
  encoder_close(&padded);
  encoder_close(&plain);
}

// pad_fill = mean frames with the data's mean, 0 once normalized: the padded backbone equals the
// plain one on the normalized images framed with 0, on both backbones.
static void check_mean_fill(const char *type) {
  float small[N * S * S * C], framed[N * P * P * C], dfeature[N * FEATURE_DIM];
  make_images(small, framed);
  for (int n = 0; n < N; n++)
    for (int y = 0; y < P; y++)
      for (int x = 0; x < P; x++)
        if (!(y >= M && y < M + S && x >= M && x < M + S))
          for (int ch = 0; ch < C; ch++) framed[((n * P + y) * P + x) * C + ch] = 0.0f;
  for (int i = 0; i < N * FEATURE_DIM; i++) dfeature[i] = 1.0f;
  ModelSpec padded_spec, plain_spec;
  tiny_spec(&padded_spec, type, P);
  snprintf(padded_spec.pad_fill, sizeof padded_spec.pad_fill, "mean");
  tiny_spec(&plain_spec, type, 0);
  Encoder plain, padded;
  encoder_open(&plain, &plain_spec, P);
  encoder_open(&padded, &padded_spec, S);
  backbone_set_input_normalization(padded.bb, mean, std_dev);
  for (int c = 0; c < C; c++) assert_true(padded.bb->pad_value[c] == 0.0f);
  float want[N * FEATURE_DIM], got[N * FEATURE_DIM];
  encoder_run(&plain, framed, dfeature, want);
  encoder_run(&padded, small, dfeature, got);
  for (int i = 0; i < N * FEATURE_DIM; i++) assert_float_equal(got[i], want[i], 1e-5);
  encoder_close(&padded);
  encoder_close(&plain);
}

static void test_resnet_mean_fill(void **state) {
  (void)state;
  check_mean_fill("resnet");
}

static void test_vit_mean_fill(void **state) {
  (void)state;
  check_mean_fill("vit");
}

static void test_resnet_frame_is_normalized_black(void **state) {
  (void)state;
  check_frame_is_normalized_black("resnet");
}

static void test_vit_frame_is_normalized_black(void **state) {
  (void)state;
  check_frame_is_normalized_black("vit");
}

// The patches the vit embeds (and MAE reconstructs): every value outside the image is
// (0 - mean_c) / std_c of its channel, every value inside is the image's own, in place.
static void test_vit_patches_border_and_interior(void **state) {
  (void)state;
  float small[N * S * S * C], framed[N * P * P * C];
  make_images(small, framed);
  ModelSpec spec;
  tiny_spec(&spec, "vit", P);
  Encoder e;
  encoder_open(&e, &spec, S);
  backbone_set_input_normalization(e.bb, mean, std_dev);
  const Vit *v = (const Vit *)e.bb;
  const int G = P / 4, patch_dim = 4 * 4 * C;
  float *patches = malloc(sizeof(float) * N * G * G * patch_dim);
  vit_patchify(v, small, patches);
  int border = 0, interior = 0;
  for (int n = 0; n < N; n++)
    for (int y = 0; y < P; y++)
      for (int x = 0; x < P; x++)
        for (int ch = 0; ch < C; ch++) {
          int patch = (y / 4) * G + x / 4, within = ((y % 4) * 4 + x % 4) * C + ch;
          float got = patches[((size_t)n * G * G + patch) * patch_dim + within];
          if (y >= M && y < M + S && x >= M && x < M + S) {
            assert_true(got == small[((n * S + y - M) * S + x - M) * C + ch]);
            interior++;
          } else {
            assert_float_equal(got, -(double)mean[ch] / std_dev[ch], 1e-6);
            border++;
          }
        }
  assert_int_equal(border, N * (P * P - S * S) * C);
  assert_int_equal(interior, N * S * S * C);
  free(patches);
  encoder_close(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resnet_frame_is_normalized_black),
      cmocka_unit_test(test_vit_frame_is_normalized_black),
      cmocka_unit_test(test_resnet_mean_fill),
      cmocka_unit_test(test_vit_mean_fill),
      cmocka_unit_test(test_vit_patches_border_and_interior),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
