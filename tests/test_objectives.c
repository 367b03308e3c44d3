// Whole objectives on a tiny network (the step's gradient against finite differences is
// test_contract's, for every objective): ResNet's wiring on its own, MAE's masking and loss, and
// MoCo's mechanisms:
// the key encoder has no gradient and moves exactly by the momentum rule, and the queue takes
// each step's keys in FIFO order.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/mae_loss_reference.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "objectives/mae.h"
#include "objectives/moco.h"

// The objectives' knobs at the tiny network's scale; the MoCo checks below count on the queue of
// 10 and the momentum of 0.9.
static const char *const settings[] = {
    "inbatch.temperature=0.5", "moco.temperature=0.5", "moco.queue_size=10",
    "moco.momentum=0.9",       "mae.decoder_dim=8",    "mae.decoder_heads=2",
    "mae.decoder_depth=1",     "mae.mask_ratio=0.75",  NULL};

// The objectives' own code is the same on every backbone and is checked end to end on ViT
// (smooth, so finite differences hold everywhere). ResNet's wiring is checked here on its own:
// with ReLUs every activation is a kink a difference quotient can straddle, so the network is
// small and so is the batch.
typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  Backbone *bb;
  float images[4 * S * S * C];
  float R[4 * 8];
} ResnetCase;

static double resnet_loss(void *arg) {
  ResnetCase *c = arg;
  c->bb->forward(c->bb, &c->ctx, c->images);
  double s = 0;
  for (int i = 0; i < 4 * 8; i++) s += (double)c->bb->feature[i] * c->R[i];
  return s;
}

static void test_resnet_backbone_gradient(void **state) {
  (void)state;
  ResnetCase *c = calloc(1, sizeof *c);
  Config cfg;
  tiny_config(&cfg, "resnet", NULL);
  exec_ctx_init(&c->ctx);
  paramset_alloc(&c->ps, backbone_param_count(&cfg.model.spec, S, C), 3);
  Builder b = {.ctx = &c->ctx, .params = &c->ps, .mode = OP_TRAIN};
  c->bb = backbone_create(&cfg.model.spec, &b, 4, S, C);
  assert_int_equal(c->bb->feature_dim, 8);
  assert_int_equal(c->ps.used, c->ps.count);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (int i = 0; i < 4 * S * S * C; i++) c->images[i] = rng_normal(&r);
  for (int i = 0; i < 4 * 8; i++) c->R[i] = rng_normal(&r);
  resnet_loss(c);
  c->bb->backward(c->bb, &c->ctx, c->R);
  float *analytic = malloc(sizeof(float) * c->ps.count);
  memcpy(analytic, c->ps.grad, sizeof(float) * c->ps.count);
  for (int e = 0; e < c->ps.n_entries; e++) {
    const ParamEntry *pe = &c->ps.entries[e];
    if (pe->is_buffer) continue;
    double err = gradcheck(resnet_loss, c, c->ps.data + pe->offset, analytic + pe->offset,
                           pe->count, 8, 1e-3f, 1e-2, pe->name);
    // float32 quotients near kinks: 5% of max(|g|, 1e-2); a wiring error is off by O(1).
    assert_true(err < 5e-2);
  }
  free(analytic);
  c->bb->destroy(c->bb);
  paramset_free(&c->ps);
  exec_ctx_destroy(&c->ctx);
  free(c);
}

// A network whose channel counts (16, 32) fill blocks of 16 runs its activations in oneDNN's
// blocked layout. The nhwc network (the layout the test above checks against finite
// differences; at this width ReLU kinks make difference quotients too noisy to compare) is the
// reference: on the same parameters, images and output gradient, the blocked one gives the same
// features and parameter gradients with direct convolutions and with Winograd.
typedef struct {
  float feature[4 * 32];
  float *grad;
  size_t count;
  double flops_winograd;
} ResnetRun;

static ResnetRun resnet_run(ActLayout layout, ConvAlgorithm algo) {
  Config cfg;
  tiny_config(&cfg, "resnet", NULL);
  ModelSpec *m = &cfg.model.spec;
  m->stem_channels = m->stage_channels[0] = 16;
  m->stage_channels[1] = 32;
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  BuildPolicy policy = build_policy_default();
  policy.conv_algorithm = algo;
  ParamSet ps;
  paramset_alloc(&ps, backbone_param_count(m, S, C), 3);
  Builder b = {.ctx = &ctx, .params = &ps, .mode = OP_TRAIN, .layout = layout, .policy = &policy};
  Backbone *bb = backbone_create(m, &b, 4, S, C);
  assert_int_equal(bb->feature_dim, 32);
  float images[4 * S * S * C], dfeature[4 * 32];
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (int i = 0; i < 4 * S * S * C; i++) images[i] = rng_normal(&r);
  for (int i = 0; i < 4 * 32; i++) dfeature[i] = rng_normal(&r);
  ResnetRun run = {.count = ps.count};
  paramset_zero_grad(&ps, 0);
  exec_ctx_reset_flops(&ctx);
  bb->forward(bb, &ctx, images);
  memcpy(run.feature, bb->feature, sizeof run.feature);
  bb->backward(bb, &ctx, dfeature);
  run.grad = malloc(sizeof(float) * ps.count);
  memcpy(run.grad, ps.grad, sizeof(float) * ps.count);
  run.flops_winograd = ctx.flops_winograd;
  bb->destroy(bb);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
  return run;
}

static void expect_same_run(const ResnetRun *want, const ResnetRun *got, const char *what) {
  double worst_f = 0, largest_f = 0, worst_g = 0, largest_g = 0;
  for (int i = 0; i < 4 * 32; i++) {
    worst_f = fmax(worst_f, fabs(got->feature[i] - want->feature[i]));
    largest_f = fmax(largest_f, fabs(want->feature[i]));
  }
  assert_int_equal(got->count, want->count);
  for (size_t i = 0; i < want->count; i++) {
    worst_g = fmax(worst_g, fabs(got->grad[i] - want->grad[i]));
    largest_g = fmax(largest_g, fabs(want->grad[i]));
  }
  print_message("%s: features up to %.3g differ by %.3g, gradients up to %.3g by %.3g\n", what,
                largest_f, worst_f, largest_g, worst_g);
  assert_true(largest_f > 0.1 && largest_g > 0.1);
  assert_true(worst_f <= 1e-5 * largest_f);
  assert_true(worst_g <= 1e-5 * largest_g);
}

static void test_resnet_blocked_layout_matches_nhwc(void **state) {
  (void)state;
  ResnetRun ref = resnet_run(ACT_LAYOUT_NHWC, CONV_ALGO_DIRECT);
  ResnetRun direct = resnet_run(0, CONV_ALGO_DIRECT), wino = resnet_run(0, CONV_ALGO_WINOGRAD);
  expect_same_run(&ref, &direct, "blocked, direct");
  expect_same_run(&ref, &wino, "blocked, Winograd");
  assert_true(ref.flops_winograd == 0 && direct.flops_winograd == 0);
  // Every pass of stage 1's two convolutions (16 -> 16 at 8x8) and of stage 2's second (32 -> 32
  // at 4x4); the stem reads the images and stage 2's first is strided: direct.
  const double pass1 = 2.0 * 4 * 8 * 8 * 16 * 16 * 9, pass2 = 2.0 * 4 * 4 * 4 * 32 * 32 * 9;
  if (DNNL_VERSION_MAJOR < 3) assert_float_equal(wino.flops_winograd, 6 * pass1 + 3 * pass2, 1);
  free(ref.grad);
  free(direct.grad);
  free(wino.grad);
}

// What one step of each contrastive objective compares and reuses, on ResNet.
static void test_contrastive_counts_resnet(void **state) {
  (void)state;
  Fixture *f = fixture_new("inbatch", "resnet", settings);
  double loss = step_loss(f);
  assert_true(isfinite(loss));
  // Two views of 4 images: 8 embeddings, of which a query's 7 others hold its one positive.
  assert_int_equal(f->rec.negatives_per_query, 6);
  assert_int_equal(f->rec.encodings_next_reused, 0);
  fixture_free(f);
  f = fixture_new("moco", "resnet", settings);
  loss = step_loss(f);
  assert_true(isfinite(loss));
  assert_int_equal(f->rec.negatives_per_query, 10);
  assert_true(ledger_value(&f->rec, "queue_random_vectors") == 10);
  assert_int_equal(f->rec.encodings_next_reused, 10);
  fixture_free(f);
}

static void test_moco_momentum_rule_and_queue(void **state) {
  (void)state;
  Fixture *f = fixture_new("moco", "resnet", settings);
  const ParamSet *key = moco_key_params(f->obj);
  // The key encoder has no gradient storage at all, and starts as an exact copy.
  assert_null(key->grad);
  assert_int_equal(key->count, f->ps.count);
  assert_memory_equal(key->data, f->ps.data, sizeof(float) * f->ps.count);
  const KeyQueue *q = moco_queue(f->obj);
  const int d = f->cfg.model.head_out_dim;
  float *key_before = malloc(sizeof(float) * key->count);
  for (int step = 0; step < 4; step++) {
    memcpy(key_before, key->data, sizeof(float) * key->count);
    step_loss(f);
    // A stand-in update of the online parameters, so the momentum rule has something to follow.
    for (size_t i = 0; i < f->ps.count; i++) f->ps.data[i] -= 0.05f * f->ps.grad[i];
    int next_before = q->next;
    float keys[B * 6];
    memcpy(keys, moco_last_keys(f->obj), sizeof keys);
    f->def->after_update(f->obj, &f->batch, &f->rec);
    const float m = 0.9f;
    for (int e = 0; e < f->ps.n_entries; e++) {
      const ParamEntry *pe = &f->ps.entries[e];
      for (size_t i = pe->offset; i < pe->offset + pe->count; i++) {
        float expect = pe->is_buffer ? key_before[i] : m * key_before[i] + (1 - m) * f->ps.data[i];
        if (pe->is_buffer) continue;  // the key encoder keeps its own running statistics
        assert_float_equal(key->data[i], expect, 1e-7);
      }
    }
    // The step's B keys went into the B oldest slots, tagged with the step.
    for (int i = 0; i < B; i++) {
      int slot = (next_before + i) % q->capacity;
      assert_int_equal(q->step_of[slot], step);
      assert_memory_equal(q->keys + (size_t)slot * d, keys + i * d, sizeof(float) * d);
    }
    assert_int_equal(q->next, (next_before + B) % q->capacity);
  }
  // 4 steps of 4 keys through 10 slots: the newest 10 keys are from steps 3, 2 and 1.
  KeyQueueStats st = key_queue_stats(q, 4, 0);
  assert_int_equal(st.real, 10);
  assert_int_equal(st.random, 0);
  assert_float_equal(st.oldest_age_steps, 3, 0);  // two keys of step 1 remain
  free(key_before);
  fixture_free(f);
}

// 8x8 images in 4x4 patches: P = 4; mask ratio 0.75 keeps 1 patch per image.
static void test_mae_sees_only_visible_patches(void **state) {
  (void)state;
  Fixture *f = fixture_new("mae", "vit", settings);
  for (int i = 0; i < B; i++) f->indices[i] = 7 * i;
  step_loss(f);
  int n_keep;
  const int *keep = mae_last_keep(f->obj, &n_keep);
  assert_int_equal(n_keep, 1);
  assert_int_equal(mae_encoder_tokens(f->obj), 1 + n_keep);  // cls + visible patches
  assert_true(ledger_value(&f->rec, "patches_total") == B * 4);
  assert_true(ledger_value(&f->rec, "patches_encoded") == B * 1);
  assert_true(ledger_value(&f->rec, "patches_decoded") == B * 4);
  // The kept patches are exactly the unmasked ones, recomputed from the seed.
  for (int i = 0; i < B; i++) {
    int k[4];
    unsigned char masked[4];
    mae_random_mask(f->cfg.train.seed, 0, f->indices[i], 4, 1, k, masked);
    assert_int_equal(keep[i], k[0]);
    assert_int_equal(masked[k[0]], 0);
    int n_masked = 0;
    for (int p = 0; p < 4; p++) n_masked += masked[p];
    assert_int_equal(n_masked, 3);
  }
  fixture_free(f);
}

// The loss against models_mae.py's forward_loss (norm_pix_loss) run by PyTorch; the decoder's
// output here has a cls row first, as in the real decoder, which the loss must skip.
static void test_mae_loss_reference(void **state) {
  (void)state;
  enum { N = MAE_REF_N, L = MAE_REF_L, D = MAE_REF_D, ROWS = L + 1 };
  float pred[N * ROWS * D], target[N * L * D], dpred[N * ROWS * D];
  for (int i = 0; i < N; i++) {
    for (int c = 0; c < D; c++) pred[(i * ROWS) * D + c] = 100.0f;  // cls row: ignored
    memcpy(pred + (i * ROWS + 1) * D, mae_ref_pred + i * L * D, sizeof(float) * L * D);
  }
  memcpy(target, mae_ref_target, sizeof target);
  long n_masked;
  double sum = mae_masked_mse(pred, ROWS, 1, target, mae_ref_masked, N, L, D, 1, dpred, &n_masked);
  assert_int_equal(n_masked, 4 + 4 + 5);
  assert_float_equal(sum / n_masked, MAE_REF_LOSS, 1e-6);
  for (int i = 0; i < N; i++) {
    for (int c = 0; c < D; c++) assert_float_equal(dpred[(i * ROWS) * D + c], 0.0f, 0);
    for (int k = 0; k < L * D; k++)
      assert_float_equal(dpred[(i * ROWS + 1) * D + k], mae_ref_dpred[i * L * D + k], 1e-6);
  }
}

static void test_mae_mask_per_image_and_step(void **state) {
  (void)state;
  enum { P = 64, KEEP = 16 };
  int a[KEEP], b[KEEP], c[KEEP], again[KEEP];
  unsigned char ma[P], mb[P], mc[P], m_again[P];
  mae_random_mask(5, 10, 3, P, KEEP, a, ma);
  mae_random_mask(5, 10, 4, P, KEEP, b, mb);  // another image, same step
  mae_random_mask(5, 11, 3, P, KEEP, c, mc);  // same image, next step
  mae_random_mask(5, 10, 3, P, KEEP, again, m_again);
  assert_memory_equal(a, again, sizeof a);  // reproducible from the seed
  assert_memory_not_equal(ma, mb, sizeof ma);
  assert_memory_not_equal(ma, mc, sizeof ma);
  int n_masked = 0;
  for (int p = 0; p < P; p++) n_masked += ma[p];
  assert_int_equal(n_masked, P - KEEP);
  for (int i = 0; i < KEEP; i++) assert_int_equal(ma[a[i]], 0);
  assert_int_equal(mae_keep_count(64, 0.75f), 16);
  assert_int_equal(mae_keep_count(49, 0.75f), 12);
  assert_int_equal(mae_keep_count(64, 0.0f), 64);
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mae_sees_only_visible_patches),
      cmocka_unit_test(test_mae_loss_reference),
      cmocka_unit_test(test_mae_mask_per_image_and_step),
      cmocka_unit_test(test_resnet_backbone_gradient),
      cmocka_unit_test(test_resnet_blocked_layout_matches_nhwc),
      cmocka_unit_test(test_contrastive_counts_resnet),
      cmocka_unit_test(test_moco_momentum_rule_and_queue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
