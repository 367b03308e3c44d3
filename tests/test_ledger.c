// The trade-offs the ledger exists to show, planned in process and checked against arithmetic
// written here (that the plan is the run is test_contract's, for every objective):
// inbatch back-propagates 2B views to get 2B - 2 negatives, moco back-propagates B and reads K from
// its queue, mae's encoder sees (1 - r) of the patches; and the ResNet's conv FLOPs.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "plan/plan.h"
#include "train/run_layout.h"
#include "objective_test_util.h"

// ---- trade-offs, in-process through plan_build ----

static Config base_config(const char *model) {
  Config c;
  config_defaults(&c);
  char path[CONFIG_PATH_MAX];
  snprintf(path, sizeof path, "models/%s.ini", model);
  if (config_load_model(&c, path) != 0) fail_msg("%s", tl_last_error());
  const char *sets[] = {"data.limit=256", "data.test_limit=128", "train.batch_size=32",
                        "train.steps=3"};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    if (config_set(&c, sets[i]) != 0) fail_msg("%s", tl_last_error());
  return c;
}

static void plan(const Config *c, const char *objective, long step, LedgerRecord *r,
                 PlanTotals *t) {
  static const PlanOptions no_knn = {.no_knn = 1};
  if (plan_build(c, objective, step, &no_knn, r, t) != 0) fail_msg("%s", tl_last_error());
}

static void test_contrast_tradeoffs(void **state) {
  (void)state;
  const long K = 4096;
  Config c = base_config("resnet-small");
  LedgerRecord in, mo;
  PlanTotals t;
  plan(&c, "inbatch", 0, &in, &t);
  plan(&c, "moco", 0, &mo, &t);
  // How many views each encodes is test_view_counts_match_encoder_work's; here, what they compare.
  // inbatch's 64 embeddings (two views of 32): each query is compared with the 63 others, one of
  // which is its positive.
  assert_int_equal(in.negatives_per_query, 62);
  assert_int_equal(mo.negatives_per_query, K);
  assert_int_equal(mo.encodings_next_reused, K);
  // The queue: 4096 slots, each a key of 64 floats (256 bytes) and the 8-byte step it was pushed
  // at: 4096 x 264.
  assert_int_equal(mo.queue_bytes, 1081344);
  // moco holds activations for B views, inbatch for 2B: about half. What does not halve: the
  // (B, K) logits moco keeps for its loss, against inbatch's (2B, 2B).
  double ratio = (double)mo.activation_bytes / (double)in.activation_bytes;
  print_message("moco / inbatch activation bytes: %.3f\n", ratio);
  assert_true(ratio >= 0.4 && ratio <= 0.6);
  // Same backbone, half the images with backward: backward encoder FLOPs halve exactly.
  assert_true(fabs(mo.flops_backward_by[COMP_ENCODER] * 2 - in.flops_backward_by[COMP_ENCODER]) <
              1e-6 * in.flops_backward_by[COMP_ENCODER]);
}

// The FIFO by hand: K = 100 slots, 32 keys a step. Before step 4, 128 keys were pushed; the last
// 100 are kept: 32 each from steps 3, 2, 1 (ages 1, 2, 3) and 4 from step 0 (age 4).
static void test_queue_arithmetic(void **state) {
  (void)state;
  Config c = base_config("resnet-small");
  assert_int_equal(config_set(&c, "moco.queue_size=100"), 0);
  assert_int_equal(config_set(&c, "moco.queue_max_age_steps=2"), 0);
  assert_int_equal(config_set(&c, "train.steps=10"), 0);
  LedgerRecord r;
  PlanTotals t;
  plan(&c, "moco", 4, &r, &t);
  assert_true(ledger_value(&r, "queue_vectors") == 100);
  assert_true(ledger_value(&r, "queue_random_vectors") == 0);
  assert_true(ledger_value(&r, "queue_oldest_age_steps") == 4);
  assert_true(fabs(ledger_value(&r, "queue_mean_age_steps") - (32 * (1 + 2 + 3) + 4 * 4) / 100.0) <
              1e-12);
  assert_int_equal(r.negatives_per_query, 64);  // ages 1 and 2 only
  plan(&c, "moco", 1, &r, &t);
  assert_true(ledger_value(&r, "queue_vectors") == 32);
  assert_true(ledger_value(&r, "queue_random_vectors") == 68);
  assert_int_equal(r.negatives_per_query, 100);  // random slots always count
}

// MAE with r = 0.75 on vit-tiny (64 patches, cls token) against the same model with nothing
// masked (mask_ratio 0 is outside the config's range, so it is set directly: the plain
// autoencoder every patch goes through).
static void test_mae_tradeoffs(void **state) {
  (void)state;
  const long B = 32, P = 64;
  const double r = 0.75;
  Config c = base_config("vit-tiny");
  LedgerRecord masked, full;
  PlanTotals t;
  plan(&c, "mae", 0, &masked, &t);
  assert_true(ledger_value(&masked, "patches_total") == P * B);
  assert_true(ledger_value(&masked, "patches_encoded") == (long)((1 - r) * P) * B);
  assert_true(ledger_value(&masked, "patches_decoded") == P * B);
  // The smallest ratio that masks nothing of 64 patches but one: int(64 * 0.99) = 63 kept.
  assert_int_equal(config_set(&c, "mae.mask_ratio=0.01"), 0);
  plan(&c, "mae", 0, &full, &t);
  assert_true(ledger_value(&full, "patches_encoded") == (P - 1) * B);
  // Per-token work and buffers scale with the tokens: 1 + 16 against 1 + 64 (the cls token is
  // encoded either way), 0.26. Attention's (T, T) scores scale with the square, 0.07, and pull
  // the FLOPs ratio down a little. The activation ratio comes out higher. What a block keeps per
  // token (nn/transformer.c): its input, qkv (3 D), attention's output, x1, fc1's output (4 D):
  // 10 D floats, and H = 4 attention probabilities per token of the sequence. Below 32 tokens the
  // attention op keeps a dense copy of Q, K and V (3 D, ops/attention.c) instead of qkv, which its
  // backward then does not read. So, per block, 17 (10 D + 4 * 17) against 65 (10 D + 4 * 65)
  // floats at D = 128: 0.229. The decoder, which sees every position in both, is not in these
  // numbers.
  double flops = masked.flops_forward_by[COMP_ENCODER] / full.flops_forward_by[COMP_ENCODER];
  double act = (double)masked.activation_bytes_by[COMP_ENCODER] /
               (double)full.activation_bytes_by[COMP_ENCODER];
  print_message("mae encoder forward FLOPs ratio %.3f, activation ratio %.3f (1 - r = %.2f)\n",
                flops, act, 1 - r);
  assert_true(flops > (1 - r) - 0.05 && flops < (1 - r) + 0.03);
  const double D = 128, kept = 17 * (10 * D + 4 * 17) / (65 * (10 * D + 4 * 65));
  assert_true(fabs(act - kept) < 0.02);
}

// 2 * OH * OW * OC * IC * K * K FLOPs per image for one convolution pass.
static double conv_flops(int out_side, int oc, int ic, int k) {
  return 2.0 * out_side * out_side * oc * ic * k * k;
}

// resnet-small on 28x28x1: stem 3x3 1->32 at 28; stage 1: 3x3 32->32 twice at 28; stage 2:
// 3x3 32->64 stride 2 to 14, 3x3 64->64 at 14, 1x1 projection 32->64 at 14; stage 3: the same
// from 64 to 128 at 7. Everything else (batch norm, ReLU, sums, pooling) is elementwise, under
// 2% here.
// A standard ResNet-18 for small images is a model file, not code: its parameter count, planned
// from models/resnet18-small-images.ini, equals torchvision's ResNet-18 with a 3x3 one-channel
// stem and no classifier, counted here from the architecture's definition (conv weights, and per
// BatchNorm channel its weight, bias, running mean and running variance), plus the head.
static void test_resnet18_is_a_model_file(void **state) {
  (void)state;
  Config c = base_config("resnet18-small-images");
  long bn = 4, params = 1 * 64 * 9 + 64 * bn;  // stem
  const int widths[4] = {64, 128, 256, 512};
  int in = 64;
  for (int s = 0; s < 4; s++)
    for (int b = 0; b < 2; b++) {
      int out = widths[s], stride = s > 0 && b == 0 ? 2 : 1;
      params += (long)in * out * 9 + out * bn + (long)out * out * 9 + out * bn;
      if (in != out || stride != 1) params += (long)in * out + out * bn;  // projection shortcut
      in = out;
    }
  // torchvision's resnet18 has 11,689,512 parameters: less its classifier (512 x 1000 + 1000) and
  // its 3-channel 7x7 stem, plus our 1-channel 3x3 one and the BatchNorm buffers of 4800 channels.
  assert_int_equal(params, 11689512 - 513000 - 9408 + 576 + 2 * 4800);
  const int hidden = c.model.head_hidden_dim, out = c.model.head_out_dim;
  long head = 512L * hidden + hidden + hidden * bn + (long)hidden * out + out;
  LedgerRecord r;
  PlanTotals t;
  plan(&c, "inbatch", 0, &r, &t);
  assert_int_equal(t.param_count, params + head);
}

static void test_resnet_conv_flops(void **state) {
  (void)state;
  const int B = 32, N = 2 * B;  // inbatch encodes both views
  double stem = conv_flops(28, 32, 1, 3);
  double per_image = stem + 2 * conv_flops(28, 32, 32, 3) + conv_flops(14, 64, 32, 3) +
                     conv_flops(14, 64, 64, 3) + conv_flops(14, 64, 32, 1) +
                     conv_flops(7, 128, 64, 3) + conv_flops(7, 128, 128, 3) +
                     conv_flops(7, 128, 64, 1);
  Config c = base_config("resnet-small");
  LedgerRecord r;
  PlanTotals t;
  plan(&c, "inbatch", 0, &r, &t);
  double fwd = r.flops_forward_by[COMP_ENCODER], bwd = r.flops_backward_by[COMP_ENCODER];
  print_message("conv forward %.4g, encoder forward %.4g (x%.4f)\n", N * per_image, fwd,
                fwd / (N * per_image));
  assert_true(fwd >= N * per_image && fwd <= 1.02 * N * per_image);
  // Backward: data and weight gradients for every conv, except the stem's data gradient (the
  // images need none).
  double conv_bwd = N * (2 * per_image - stem);
  assert_true(bwd >= conv_bwd && bwd <= 1.02 * conv_bwd);
  // train.conv_algorithm = auto runs Winograd for the 3x3 stride-1 layers of 32 channels and more
  // (stage 1's two convolutions, stages 2 and 3's second ones; not the stem, whose input is the
  // one-channel image), all three passes, where oneDNN has it (2.x, AVX-512).
  const int wino = DNNL_VERSION_MAJOR < 3 && cpu_has_avx512();
  const double winograd =
      3.0 * N *
      (2 * conv_flops(28, 32, 32, 3) + conv_flops(14, 64, 64, 3) + conv_flops(7, 128, 128, 3));
  print_message("Winograd %.4g of %.4g FLOPs\n", r.flops_winograd, fwd + bwd);
  assert_float_equal(r.flops_winograd, wino ? winograd : 0.0, 1.0);
  assert_true(config_set(&c, "train.conv_algorithm=direct") == 0);
  plan(&c, "inbatch", 0, &r, &t);
  assert_float_equal(r.flops_winograd, 0.0, 0.0);
}

// One image's convolution FLOPs in resnet-small's encoder at `side` pixels (the architecture as
// in test_resnet_conv_flops; padding 1 for 3x3, 0 for 1x1, so a stride-2 stage ends at
// ceil(side / 2)); *stem gets the stem's part.
static double resnet_small_image_flops(int side, double *stem) {
  const int s1 = side, s2 = (s1 + 1) / 2, s3 = (s2 + 1) / 2;
  *stem = conv_flops(s1, 32, 1, 3);
  return *stem + 2 * conv_flops(s1, 32, 32, 3) + conv_flops(s2, 64, 32, 3) +
         conv_flops(s2, 64, 64, 3) + conv_flops(s2, 64, 32, 1) + conv_flops(s3, 128, 64, 3) +
         conv_flops(s3, 128, 128, 3) + conv_flops(s3, 128, 64, 1);
}

// The views every objective of the table says it encoded, with and without gradient, group by
// group (dino's local crops are a group of their own size), against the work its encoders did:
// forward FLOPs are one image's convolution arithmetic at the group's size for every view,
// backward FLOPs that of the views with gradient (data and weight gradients, the stem's data
// gradient excepted). The counts are the objective's own words; the FLOPs are counted by the ops
// as they run, so a count that does not match what was encoded fails here. MAE encodes only the
// visible patches of a ViT (no per-image constant to hold it to): its patch counts are
// test_mae_tradeoffs'.
static void test_view_counts_match_encoder_work(void **state) {
  (void)state;
  char names[256];
  snprintf(names, sizeof names, "%s", objective_names());
  Config c = base_config("resnet-small");
  int checked = 0;
  for (char *save, *name = strtok_r(names, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
    if (!strcmp(name, "mae")) continue;
    LedgerRecord r;
    PlanTotals t;
    plan(&c, name, 0, &r, &t);
    assert_true(r.views_grad > 0);
    assert_true(r.view_groups >= 1);
    long grad = 0, nograd = 0;
    double fwd_all = 0, bwd_all = 0;
    for (int g = 0; g < r.view_groups; g++) {
      const LedgerViewGroup *v = &r.view_group[g];
      double stem, per_image = resnet_small_image_flops(v->size, &stem);
      double views = (double)(v->views_grad + v->views_nograd);
      double conv_bwd = (double)v->views_grad * (2 * per_image - stem);
      print_message(
          "%s group %d (%d px): %ld + %ld views, forward %.4f images' convolutions, "
          "backward %.4f\n",
          name, g, v->size, v->views_grad, v->views_nograd, v->flops_forward / per_image,
          v->flops_backward / (2 * per_image - stem));
      assert_true(v->views_grad > 0);
      assert_true(v->flops_forward >= views * per_image &&
                  v->flops_forward <= 1.02 * views * per_image);
      assert_true(v->flops_backward >= conv_bwd && v->flops_backward <= 1.02 * conv_bwd);
      grad += v->views_grad;
      nograd += v->views_nograd;
      fwd_all += v->flops_forward;
      bwd_all += v->flops_backward;
    }
    // The groups are the whole step: their views the record's, their work the encoders'. Every
    // view is of a new image, so the next step encodes as many again, all anew.
    assert_int_equal(grad, r.views_grad);
    assert_int_equal(nograd, r.views_nograd);
    assert_int_equal(r.encodings_next_new, grad + nograd);
    assert_float_equal(fwd_all, r.flops_forward_by[COMP_ENCODER], 1e-9 * fwd_all);
    assert_float_equal(bwd_all, r.flops_backward_by[COMP_ENCODER], 1e-9 * bwd_all);
    checked++;
  }
  assert_true(checked >= 5);
}

// A timed probe runs real steps: a finite positive median, the run's time its steps at that
// pace in --json, and a refusal (not a wrong number) for several replicas.
static void test_timed_probe(void **state) {
  (void)state;
  Config c = base_config("resnet-small");
  assert_int_equal(config_set(&c, "train.batch_size=8"), 0);
  double ms = NAN, range[2] = {NAN, NAN};
  assert_int_equal(plan_time_steps(&c, "moco", 3, &ms, range), 0);
  assert_true(isfinite(ms) && ms > 0);
  assert_true(range[0] > 0 && range[0] <= ms && ms <= range[1]);
  Config two = c;
  assert_int_equal(config_set(&two, "parallel.replicas=2"), 0);
  assert_int_equal(plan_time_steps(&two, "moco", 3, &ms, NULL), -1);
  assert_non_null(strstr(tl_last_error(), "one replica"));
  char *plan = run_ok("%s plan --objective=inbatch %s --steps 7 --no-knn --time --json", bin,
                      "--set train.batch_size=8 --set data.limit=256 --set data.test_limit=128");
  double step_ms = NAN, run_s = NAN;
  assert_int_equal(json_get(plan, "timed_step_ms", &step_ms), 1);
  assert_int_equal(json_get(plan, "timed_run_seconds", &run_s), 1);
  assert_true(step_ms > 0 && fabs(run_s - 7 * step_ms / 1e3) < 0.051);
  free(plan);
  // Without --time both are null.
  plan =
      run_ok("%s plan --objective=inbatch --set train.batch_size=8 --steps 7 --no-knn --json", bin);
  assert_int_equal(json_get(plan, "timed_step_ms", &step_ms), 0);
  free(plan);
}

// The global batch cut into shards, as every replica and its loader take them: as even as
// possible with the first ranks one sample larger, or by [parallel] shard_weights.
static void test_shards_split_the_global_batch(void **state) {
  (void)state;
  static Config cfg;
  config_defaults(&cfg);
  RunLayout L;
  cfg.train.batch_size = 10;
  assert_int_equal(run_layout_init(&L, &cfg, NULL, 4), 0);
  assert_int_equal(run_layout_set_shards(&L, &cfg), 0);
  const int expect_offset[4] = {0, 3, 6, 8}, expect_local[4] = {3, 3, 2, 2};
  for (int r = 0; r < 4; r++) {
    RunShard s = run_layout_shard(&L, r);
    assert_true(s.offset == expect_offset[r] && s.local == expect_local[r] && s.global == 10);
  }
  cfg.train.batch_size = 6;
  assert_int_equal(config_set(&cfg, "parallel.shard_weights=1,1,4"), 0);
  assert_int_equal(run_layout_init(&L, &cfg, NULL, 3), 0);
  assert_int_equal(run_layout_set_shards(&L, &cfg), 0);
  RunShard last = run_layout_shard(&L, 2);
  assert_true(last.offset == 2 && last.local == 4);
  assert_int_equal(run_layout_init(&L, &cfg, NULL, 2), 0);
  assert_int_equal(run_layout_set_shards(&L, &cfg), -1);
  assert_int_equal(run_layout_init(&L, &cfg, NULL, 7), -1);
}

static void test_memory_budget(void **state) {
  (void)state;
  size_t two_gib, b;
  assert_int_equal(plan_parse_size("2GiB", &two_gib), 0);
  assert_true(two_gib == 2ull << 30);
  assert_int_equal(plan_parse_size("512 MiB", &b), 0);
  assert_true(b == 512ull << 20);
  assert_int_equal(plan_parse_size("3GB", &b), 0);
  assert_true(b == 3000000000ull);
  assert_int_equal(plan_parse_size("1.5kb", &b), 0);
  assert_true(b == 1500);
  assert_int_equal(plan_parse_size("4096", &b), 0);
  assert_true(b == 4096);
  assert_int_equal(plan_parse_size("2 parsecs", &b), -1);
  assert_int_equal(plan_parse_size("", &b), -1);

  // The boundary is exact: the found batch fits, one more does not.
  static const PlanOptions no_knn = {.no_knn = 1};
  const size_t budget = 256ull << 20;
  Config c = base_config("resnet-small"), fitted, more;
  long value;
  assert_int_equal(plan_fit_budget(&c, "inbatch", budget, &no_knn, &fitted, &value), 0);
  assert_int_equal(fitted.train.batch_size, value);
  PlanTotals t;
  assert_int_equal(plan_build(&fitted, "inbatch", -1, &no_knn, NULL, &t), 0);
  assert_true(t.total_bytes <= budget);
  more = fitted;
  more.train.batch_size = (int)value + 1;
  assert_int_equal(plan_build(&more, "inbatch", -1, &no_knn, NULL, &t), 0);
  assert_true(t.total_bytes > budget);
  // moco spends the budget on its queue, the batch stays.
  assert_int_equal(plan_fit_budget(&c, "moco", budget, &no_knn, &fitted, &value), 0);
  assert_int_equal(fitted.train.batch_size, 32);
  char queue[64];
  assert_int_equal(config_get(&fitted, "moco.queue_size", queue, sizeof queue), 0);
  assert_int_equal(strtol(queue, NULL, 10), value);
  assert_int_equal(plan_build(&fitted, "moco", -1, &no_knn, NULL, &t), 0);
  assert_true(t.total_bytes <= budget);
  more = fitted;
  snprintf(queue, sizeof queue, "moco.queue_size=%ld", value + 1);
  assert_int_equal(config_set(&more, queue), 0);
  assert_int_equal(plan_build(&more, "moco", -1, &no_knn, NULL, &t), 0);
  assert_true(t.total_bytes > budget);
  // A budget below the smallest configuration is an error that says so.
  assert_int_equal(plan_fit_budget(&c, "inbatch", 1 << 20, &no_knn, &fitted, &value), -1);
  assert_non_null(strstr(tl_last_error(), "more than the budget"));
}

// An objective's own fields, declared outside the ledger: written after the common ones under
// their own names (whole numbers as such, NaN as null and an empty CSV cell, measured-only ones
// null in a plan), read back through the lookup, and absent from a record whose objective the
// lookup does not know.
static const LedgerOwnFields test_own = {
    3,
    {{"widgets_kept", LEDGER_CACHED, UNIT_COUNT, 0},
     {"widget_age_steps", LEDGER_CACHED, UNIT_STEPS, 0},
     {"widget_drift", LEDGER_CACHED, UNIT_RATIO, 1}},
};
static const LedgerOwnFields *test_lookup(const char *objective) {
  return strcmp(objective, "widgets") == 0 ? &test_own : NULL;
}

static void test_own_fields_round_trip(void **state) {
  (void)state;
  LedgerRecord r = {.step = 7, .objective = "widgets", .own_fields = &test_own};
  r.own[0] = 12345678901.0;  // above 2^32: written whole, not as 1.23456789e+10
  r.own[1] = 2.5;
  r.own[2] = NAN;
  char line[8192], planned[8192];
  FILE *f = fmemopen(line, sizeof line, "w");
  ledger_write_json(f, &r);
  fclose(f);
  assert_non_null(strstr(line,
                         "\"widgets_kept\":12345678901,\"widget_age_steps\":2.5,"
                         "\"widget_drift\":null,\"view_groups\":["));
  r.own[2] = 0.125;
  f = fmemopen(planned, sizeof planned, "w");
  ledger_write_json_members(f, &r, 1);
  fclose(f);
  assert_non_null(strstr(planned, "\"widget_drift\":null"));
  f = fmemopen(line, sizeof line, "w");
  ledger_write_json(f, &r);
  fclose(f);

  LedgerRecord back = {0};
  assert_true(ledger_read_json(line, &back, test_lookup) > 0);
  assert_ptr_equal(back.own_fields, &test_own);
  assert_true(back.own[0] == 12345678901.0);
  assert_true(ledger_value(&back, "widget_age_steps") == 2.5);
  assert_true(ledger_value(&back, "widget_drift") == 0.125);
  assert_true(ledger_value(&back, "step") == 7);
  assert_true(isnan(ledger_value(&back, "queue_vectors")));
  // Without the lookup (or for an objective it does not know) they are skipped, not misread.
  LedgerRecord blind = {0};
  assert_true(ledger_read_json(line, &blind, NULL) > 0);
  assert_null(blind.own_fields);
  assert_true(isnan(ledger_value(&blind, "widgets_kept")));
  assert_true(blind.step == 7);

  char csv[16384];
  f = fmemopen(csv, sizeof csv, "w");
  ledger_write_csv_header(f, &test_own);
  r.own[1] = NAN;
  ledger_write_csv(f, &r);
  fclose(f);
  const char *nl = strchr(csv, '\n');
  assert_non_null(nl);
  assert_non_null(strstr(csv, ",widgets_kept,widget_age_steps,widget_drift\n"));
  assert_non_null(strstr(nl, ",12345678901,,0.125\n"));
}

int main(void) {
  objective_register_config();
  if (cli_test_init("ledger") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_own_fields_round_trip),
      cmocka_unit_test(test_contrast_tradeoffs),
      cmocka_unit_test(test_queue_arithmetic),
      cmocka_unit_test(test_mae_tradeoffs),
      cmocka_unit_test(test_resnet_conv_flops),
      cmocka_unit_test(test_view_counts_match_encoder_work),
      cmocka_unit_test(test_resnet18_is_a_model_file),
      cmocka_unit_test(test_shards_split_the_global_batch),
      cmocka_unit_test(test_memory_budget),
      cmocka_unit_test(test_timed_probe),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) return 1;
  return failed;
}
