// What every objective of the table owes the run, checked for each, so a new objective is held to
// it without a test of its own: the gradient its step leaves equals finite differences of the
// loss it returns (in process, on a tiny ViT); and, through the binary, the plan is the run (every
// counted field of `tally plan` equals what `tally train` writes, on one replica and on two uneven
// ones, and peak RSS comes within 15% of the planned total), and a run stopped part way and resumed
// ends bit for bit where the run done in one go ends (every tensor of the checkpoint, the
// objective's own state among them, on one replica and on two). Two replicas are held to what is
// exact for every objective, counts and a replayed run, and not to one replica's losses: with
// BatchNorm's statistics over each shard they are not the same numbers. That two replicas train
// like one is test_parallel's (MAE on ViT, no batch-coupled op: equal to float rounding) and
// test_sync_bn's (ResNet with sync_bn: within 2e-3, where unsynchronized runs differ by more than
// 2e-2). What only one objective has is its own test file's.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "objective_test_util.h"

// ---- the step, in process ----

// GELU is smooth, but a few entries can still sit where the loss curves sharply at the scale of
// eps, or at a head's ReLU kink: quotients at eps and eps/2 that disagree are counted and skipped
// (at most a quarter). Gradients near zero are compared on an absolute scale of 1e-2, since
// float32 losses carry ~1e-4 noise in their difference quotients. Where an objective's loss is
// flatter or larger, its own numbers: byol's and dino's losses (near 4, noise ~1e-6) take a step
// of 1e-2, at which a 10% error fails half the entries (at 1e-3 the quotients are noise at the
// 2e-4 level); vicreg's loss is ~30, whose float32 rounding puts ~1e-3 of noise in a quotient,
// and its expander's ReLU makes kinks: an absolute scale of 5e-2. Barlow's loss (~10 here) has
// the same noise, and its standardization over 4 samples behind a projector with two ReLUs puts a
// kink within 1e-3 of a patch-embedding weight, which quotients at 2e-3 and 1e-3 both straddle
// and agree on (-0.905 against -0.975; at 1.6e-4, -0.966): a step of 1e-3. Dino's local crops reach
// the loss only through their second instance of the backbone over the same weights: were its
// gradient lost or overwritten, the backbone's entries would fail. On the ViT only: a ResNet's
// BatchNorm and ReLU under dino's sharp softmax put 4 of 75 entries 10-30% off at eps 1e-2, so
// they would test the quotients, not the step; ResNet's wiring is test_objectives'.
static const StepGradTolerance default_step = {.eps = 2e-3f, .kink_atol = 2e-4, .grad_scale = 1e-2};
static const struct {
  const char *objective;
  StepGradTolerance tol;
} own_step[] = {
    {"byol", {.eps = 1e-2f, .kink_atol = 2e-4, .grad_scale = 1e-2}},
    {"dino", {.eps = 1e-2f, .kink_atol = 2e-4, .grad_scale = 1e-2}},
    {"vicreg", {.eps = 2e-3f, .kink_atol = 2e-3, .grad_scale = 5e-2}},
    {"barlow", {.eps = 1e-3f, .kink_atol = 2e-3, .grad_scale = 5e-2}},
};

static void test_step_gradient_matches_finite_differences(void **state) {
  (void)state;
  char table[256];
  snprintf(table, sizeof table, "%s", objective_names());
  for (char *save, *name = strtok_r(table, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
    Fixture *f = fixture_new(name, "vit", tiny_settings);
    for (int i = 0; i < B; i++) f->indices[i] = 100 + i;  // mae's masks follow the image
    // One step and update first, so an objective that keeps a copy of the network (a momentum
    // encoder, a target, a teacher) is checked where the copy has moved off it, not at the
    // symmetric point where the two coincide.
    if (f->def->after_update) {
      step_loss(f);
      for (size_t i = 0; i < f->ps.count; i++) f->ps.data[i] -= 0.5f * f->ps.grad[i];
      f->def->after_update(f->obj, &f->batch, &f->rec);
    }
    StepGradTolerance tol = default_step;
    for (size_t i = 0; i < sizeof own_step / sizeof own_step[0]; i++)
      if (!strcmp(own_step[i].objective, name)) tol = own_step[i].tol;
    char label[64];
    snprintf(label, sizeof label, "%s/vit", name);
    check_step_gradient(f, label, tol, NULL);
    fixture_free(f);
  }
}

// ---- through the binary ----

// Small real runs: a slice of Fashion-MNIST, batches of 32. Where an objective's defaults would
// leave a mechanism idle in 6 steps, its settings bring it in: moco's queue of 40 wraps at the
// second step, its age limit of 1 step leaves only the newest keys usable, and at the stop (step
// 3: 96 keys pushed) its next slot is 16, not the 0 a queue that restarted would also have; dino's
// 4 local crops of 12 pixels are a second view group at its own size; swav's prototypes start to
// move at step 2, between the start and the stop.
static const char *const common =
    "--set train.batch_size=32 --set data.limit=256 --set data.test_limit=128";
static const struct {
  const char *objective, *settings;
} own_settings[] = {
    {"moco", "--set moco.queue_size=40 --set moco.queue_max_age_steps=1"},
    {"dino", "--set dino.local_crops=4 --set dino.local_size=12"},
    {"swav", "--set swav.local_crops=2 --set swav.freeze_prototypes_niters=2"},
};

// The table's objectives, and each one's run arguments.
static char names[256];
static int n_objectives;
static const char *objective[16];
static char args[16][512];

static void read_table(void) {
  snprintf(names, sizeof names, "%s", objective_names());
  for (char *save, *name = strtok_r(names, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
    const char *own = "";
    for (size_t i = 0; i < sizeof own_settings / sizeof own_settings[0]; i++)
      if (!strcmp(own_settings[i].objective, name)) own = own_settings[i].settings;
    snprintf(args[n_objectives], sizeof args[0], "--objective=%s %s %s", name, common, own);
    objective[n_objectives++] = name;
  }
}

// The run's peak RSS (summary.json) over the plan's total. A sanitizer build adds shadow memory
// and redzones no plan can count, so there only the counted fields are compared. The kNN monitor
// keeps its default batch of 500, so accounted memory (its inference model, most of it) dwarfs
// the fixed part of RSS no allocator sees (program text, libraries, oneDNN's JIT code, stacks).
static void expect_rss_near_plan(const char *name, const char *run_args) {
  char *plan = run_ok("%s plan %s --steps 6 --step 5 --json", bin, run_args);
  double planned_total = 0, rss = 0;
  assert_int_equal(json_get(plan, "planned_total_bytes", &planned_total), 1);
  free(plan);
  char path[600], summary[8192];
  snprintf(path, sizeof path, "%s/%s/summary.json", tmpdir, name);
  read_file_text(path, summary, sizeof summary);
  const char *p = strstr(summary, "\"peak_rss_bytes\":");
  assert_non_null(p);
  rss = strtod(p + strlen("\"peak_rss_bytes\":"), NULL);
  print_message("%s: peak RSS %.1f MiB, planned %.1f MiB (%.3f)\n", name, rss / 1048576,
                planned_total / 1048576, rss / planned_total);
#if !defined(__SANITIZE_ADDRESS__)
  assert_true(rss > 0.85 * planned_total && rss < 1.15 * planned_total);
#endif
}

// Two local replicas with uneven shards: gathered features, keys with ShuffleBN, gathered
// embeddings, the gradient and BatchNorm-statistics allreduces and the replica checksum every 2nd
// step all show in the communication bytes.
static void test_plan_equals_run(void **state) {
  (void)state;
  for (int i = 0; i < n_objectives; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s-plan1", objective[i]);
    plan_equals_run(name, args[i], "");
    expect_rss_near_plan(name, args[i]);
    snprintf(name, sizeof name, "%s-plan2", objective[i]);
    LedgerRecord r = plan_equals_run(name, args[i],
                                     "--set parallel.replicas=2 --set parallel.shard_weights=1,3 "
                                     "--set parallel.checksum_every=2 --no-knn");
    assert_int_equal(r.shard_samples, 8);  // rank 0's quarter of 32
    assert_true(r.comm_allreduce_bytes > 0);
  }
}

// An objective with state beyond its parameters (a queue, a target, a centre) checkpoints it
// under its own name, so the byte-for-byte comparison covers it.
static void expect_own_state_held(int i, const char *run) {
  if (!objective_find(objective[i])->state) return;
  char path[600], prefix[64];
  snprintf(path, sizeof path, "%s/%s/checkpoint.safetensors", tmpdir, run);
  snprintf(prefix, sizeof prefix, "%s.", objective[i]);
  StFile st;
  if (checkpoint_read(&st, path) != 0) fail_msg("%s", tl_last_error());
  int own = 0;
  for (int t = 0; t < st.n_tensors; t++)
    own += strncmp(st.tensors[t].name, prefix, strlen(prefix)) == 0;
  st_free(&st);
  if (own == 0) fail_msg("%s holds no %s* tensor", path, prefix);
}

// Evaluation memory after an evaluation (--knn-at-start: one before step 0), with labels (the
// kNN banks and votes, and the label-free quality's sample and what measuring it leaves) and
// without (data.labels = none: no test set, no banks, the quality's sample alone): what the run
// around any objective adds, planned as measured.
static void test_evaluated_plan_equals_run(void **state) {
  (void)state;
  plan_equals_run("evaluated", args[0], "--knn-at-start");
  plan_equals_run("unlabeled", args[0], "--set data.labels=none --knn-at-start");
}

static void test_stop_and_resume_is_bit_exact(void **state) {
  (void)state;
  for (int i = 0; i < n_objectives; i++) {
    print_message("%s\n", objective[i]);
    // The helper's run folders, fresh for each objective.
    assert_int_equal(
        sh("rm -rf %s/straight1 %s/straight2 %s/split1 %s/split2", tmpdir, tmpdir, tmpdir, tmpdir),
        0);
    expect_stop_and_resume_bit_exact(args[i], NULL);
    expect_own_state_held(i, "straight1");
  }
}

int main(void) {
  objective_register_config();
  if (cli_test_init("contract") != 0) return 1;
  read_table();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_gradient_matches_finite_differences),
      cmocka_unit_test(test_plan_equals_run),
      cmocka_unit_test(test_evaluated_plan_equals_run),
      cmocka_unit_test(test_stop_and_resume_is_bit_exact),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
