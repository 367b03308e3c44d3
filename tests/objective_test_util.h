// For the tests of whole objectives: a tiny network to run a step on in process, the step's
// gradient against finite differences of the loss it returns, and, through the binary, a plan
// against the ledger of the run it plans and two checkpoints against each other.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli_test_util.h"
#include "core/error.h"
#include "ledger/record.h"
#include "model_test_util.h"
#include "objectives/objective.h"

// The tiny network: a batch of B images of S x S x C, a head of HEAD_HIDDEN -> HEAD_OUT, and a
// run of TOTAL_STEPS steps for the schedules.
enum { B = 4, S = 8, C = 1, HEAD_HIDDEN = 16, HEAD_OUT = 6, TOTAL_STEPS = 100 };

// The tiny network on `backbone` (model_test_util.h; "vit": GELU, smooth enough for finite
// differences; "resnet": two stages, the second strided), then `settings` (NULL-terminated, or
// NULL) for the objectives' own sections.
static inline void tiny_config(Config *cfg, const char *backbone, const char *const *settings) {
  config_defaults(cfg);
  cfg->data.image_size = S;
  cfg->data.channels = C;
  cfg->model.spec = tiny_model_spec(backbone);
  cfg->model.head_hidden_dim = HEAD_HIDDEN;
  cfg->model.head_out_dim = HEAD_OUT;
  cfg->train.batch_size = B;
  for (; settings && *settings; settings++)
    if (config_set(cfg, *settings) != 0) fail_msg("%s", tl_last_error());
}

// Every objective's section at the tiny network's scale: moco's queue of 10 and momentum 0.9,
// mae's one-block decoder, byol's predictor of 12, dino's two local crops of 4 x 4 and 8
// prototypes with temperatures closer together than the paper's, and barlow's off-diagonal weight
// at 0.2 (the paper's 0.0051 is for 8192 dimensions; at 6 its term would hardly reach the
// gradient), and swav's two local crops, 8 prototypes and an epsilon so large that its codes,
// which carry no gradient by design, hardly move when finite differences nudge a weight (its
// codes are test_swav's), so that finite differences of the loss stay smooth and see every term.
static const char *const tiny_settings[] = {"inbatch.temperature=0.5",
                                            "moco.temperature=0.5",
                                            "moco.queue_size=10",
                                            "moco.momentum=0.9",
                                            "mae.decoder_dim=8",
                                            "mae.decoder_heads=2",
                                            "mae.decoder_depth=1",
                                            "mae.mask_ratio=0.75",
                                            "byol.momentum=0.9",
                                            "byol.momentum_schedule=cosine",
                                            "byol.predictor_hidden_dim=12",
                                            "dino.local_crops=2",
                                            "dino.local_size=4",
                                            "dino.out_dim=8",
                                            "dino.student_temp=0.5",
                                            "dino.warmup_teacher_temp=0.3",
                                            "dino.teacher_temp=0.3",
                                            "dino.momentum=0.9",
                                            "barlow.lambda=0.2",
                                            "swav.local_crops=2",
                                            "swav.local_size=4",
                                            "swav.prototypes=8",
                                            "swav.epsilon=1e4",
                                            "swav.freeze_prototypes_niters=0",
                                            NULL};

// One objective on the tiny network, one replica, with a fixed batch of random views.
typedef struct {
  Config cfg;
  ExecCtx ctx;
  LocalGroup *group;
  Comm *comm;
  ParamSet ps;
  BufferArena arena;  // the backbones' pooled buffers, shared as a replica's are
  const ObjectiveDef *def;
  Objective *obj;
  Batch batch;
  float *views;  // every view group's, as the objective declares them (data/views.h)
  int indices[B], labels[B];
  LedgerRecord rec;
} Fixture;

static inline Fixture *fixture_new(const char *objective, const char *backbone,
                                   const char *const *settings) {
  Fixture *f = calloc(1, sizeof *f);
  tiny_config(&f->cfg, backbone, settings);
  exec_ctx_init(&f->ctx);
  f->group = comm_local_group_create(1);
  f->comm = comm_local_rank(f->group, 0);
  f->def = objective_find(objective);
  assert_non_null(f->def);
  paramset_alloc(&f->ps, objective_param_count(f->def, &f->cfg), 3);
  ObjectiveEnv env = {&f->cfg,     &f->ctx, f->comm, &f->ps, B,    B,        1.0,
                      TOTAL_STEPS, NULL,    NULL,    NULL,   NULL, &f->arena};
  f->obj = objective_create(f->def, &env);
  assert_non_null(f->obj);
  const AugmentParams base = {.out_size = S};
  const ViewRecipe recipe = objective_views(f->def, &f->cfg, &base);
  const size_t n_floats = (size_t)B * view_recipe_floats(&recipe, C);
  f->views = malloc(sizeof(float) * n_floats);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (size_t i = 0; i < n_floats; i++) f->views[i] = rng_normal(&r);
  f->batch = (Batch){.n = B, .views = f->views, .indices = f->indices, .labels = f->labels};
  batch_set_groups(&f->batch, &recipe, C);
  return f;
}

static inline void fixture_free(Fixture *f) {
  f->def->destroy(f->obj);
  buffer_arena_free(&f->arena);
  free(f->views);
  paramset_free(&f->ps);
  comm_destroy(f->comm);
  comm_local_group_destroy(f->group);
  exec_ctx_destroy(&f->ctx);
  free(f);
}

// One step as the trainer runs it: gradients zeroed first (ops accumulate into them).
static inline double step_loss(Fixture *f) {
  paramset_zero_grad(&f->ps, 0);
  return objective_step(f->obj, &f->batch, &f->rec);
}

// Central difference of the step's loss with respect to *x.
static inline double step_quotient(Fixture *f, float *x, float eps) {
  const float saved = *x;
  *x = saved + eps;
  double lp = step_loss(f);
  *x = saved - eps;
  double lm = step_loss(f);
  *x = saved;
  return (lp - lm) / (2.0 * eps);
}

// How a step's gradient is held against central differences: quotients at eps and eps / 2 that
// differ by more than 2% + kink_atol straddle a kink; the others must agree with the analytic
// gradient within 2% of max(grad_scale, |numeric| + |analytic|) plus the two quotients'
// difference. Each test says why its numbers.
typedef struct {
  float eps;
  double kink_atol, grad_scale;
} StepGradTolerance;

// Runs a step, then checks 3 entries (from a fixed stream) of every trainable tensor: none may
// mismatch, and at most a quarter may be skipped at kinks. Returns how many of the checked
// entries belong to tensors whose names begin with `prefix` (0 for NULL).
static inline int check_step_gradient(Fixture *f, const char *label, StepGradTolerance tol,
                                      const char *prefix) {
  step_loss(f);
  float *analytic = malloc(sizeof(float) * f->ps.count);
  memcpy(analytic, f->ps.grad, sizeof(float) * f->ps.count);
  Rng r = rng_stream(99, RNG_TEST, 1, 0);
  int checked = 0, kinks = 0, bad = 0, with_prefix = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    const ParamEntry *pe = &f->ps.entries[e];
    if (pe->is_buffer) continue;  // running statistics do not affect a training-mode loss
    for (int s = 0; s < 3; s++) {
      size_t i = pe->offset + rng_below(&r, (uint32_t)pe->count);
      double n1 = step_quotient(f, f->ps.data + i, tol.eps);
      double n2 = step_quotient(f, f->ps.data + i, tol.eps / 2);
      double a = analytic[i];
      checked++;
      with_prefix += prefix && strncmp(pe->name, prefix, strlen(prefix)) == 0;
      if (fabs(n1 - n2) > 0.02 * (fabs(n1) + fabs(n2)) + tol.kink_atol) {
        kinks++;
        continue;
      }
      // The eps/2 quotient is only as exact as the two quotients agree (float rounding in the
      // forward pass, or curvature): their disagreement is slack on top of the 2%.
      if (fabs(n2 - a) > 2e-2 * fmax(tol.grad_scale, fabs(n2) + fabs(a)) + fabs(n1 - n2)) {
        bad++;
        print_message("%s: %s[%zu] numeric %.6g, analytic %.6g\n", label, pe->name, i - pe->offset,
                      n2, a);
      }
    }
  }
  print_message("%s: %d gradient entries checked, %d mismatched, %d skipped at kinks\n", label,
                checked, bad, kinks);
  assert_int_equal(bad, 0);
  assert_true(kinks <= checked / 4);
  free(analytic);
  return with_prefix;
}

// ---- through the binary ----

// Runs a shell command (printf-style); returns its stdout (malloc'd) and checks it exited 0.
static inline char *run_ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *run_ok(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  for (size_t got; (got = fread(out + len, 1, cap - len - 1, p)) > 0;) {
    len += got;
    if (len + 1 == cap) out = realloc(out, cap *= 2);
  }
  out[len] = 0;
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("`%s` failed:\n%s", cmd, out);
  return out;
}

// The JSON value of `key` in a flat one-line object: 1 with *v set for a number, 0 for null, -1
// when the key is absent.
static inline int json_get(const char *line, const char *key, double *v) {
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *p = strstr(line, pattern);
  if (!p) return -1;
  p += strlen(pattern);
  if (strncmp(p, "null", 4) == 0) return 0;
  char *end;
  *v = strtod(p, &end);
  return end == p ? -1 : 1;
}

// Line `n` (from 0) of a file, whole, into buf.
static inline void read_line(const char *path, int n, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  for (int i = 0; i <= n; i++) {
    assert_non_null(fgets(buf, (int)cap, f));
    assert_non_null(strchr(buf, '\n'));  // a longer line would shift the count
  }
  fclose(f);
}

// `key`, a quantity the ledger counts rather than times: the plan gives a number for it (not
// null) and the run wrote the same number. `what` names the run and step in a failure.
static inline void expect_planned_as_measured(const char *what, const char *plan,
                                              const char *measured, const char *key) {
  double p = 0, m = 0;
  if (json_get(plan, key, &p) != 1) fail_msg("%s: the plan gives no %s", what, key);
  assert_int_equal(json_get(measured, key, &m), 1);
  if (p != m) fail_msg("%s: %s planned %.9g, measured %.9g", what, key, p, m);
}

// Ledger records a run in tmpdir/NAME has written so far (whole lines); 0 without a ledger.
static inline int ledger_lines(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/ledger.jsonl", tmpdir, dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

// A plan (`tally plan --json --step N`) against the ledger record the run wrote for step N:
// every field of the ledger's table that is neither text nor measured only, and every field the
// objective declares, is planned as measured; the measured-only ones are null in the plan.
// `what` names the run and step in a failure. Returns the measured record.
static inline LedgerRecord expect_plan_is_run(const char *what, const char *plan,
                                              const char *measured) {
  int compared = 0;
  // The view groups' members sit in a list ("view_groups"): compared as the reader reads them.
  LedgerRecord planned_rec = {0}, measured_rec = {0};
  if (ledger_read_json(plan, &planned_rec, objective_ledger_fields) <= 0)
    fail_msg("%s: the plan does not read back", what);
  if (ledger_read_json(measured, &measured_rec, objective_ledger_fields) <= 0)
    fail_msg("%s: the ledger does not read", what);
  assert_true(measured_rec.view_groups >= 1);
  for (int i = 0; i < ledger_field_count(); i++) {
    const LedgerFieldInfo *fi = ledger_field_info(i);
    double v;
    if (fi->unit == UNIT_TEXT) continue;
    if (!strncmp(fi->name, "view_group", 10) && fi->name[10] >= '0' && fi->name[10] <= '9') {
      const double p = ledger_field_value(&planned_rec, i),
                   m = ledger_field_value(&measured_rec, i);
      if (p != m) fail_msg("%s: %s planned %.9g, measured %.9g", what, fi->name, p, m);
      compared++;
      continue;
    }
    if (!strcmp(fi->name, "view_groups")) {
      assert_int_equal(planned_rec.view_groups, measured_rec.view_groups);
      compared++;
      continue;
    }
    if (fi->measured_only) {
      if (json_get(plan, fi->name, &v) != 0) fail_msg("%s: the plan gives %s", what, fi->name);
      continue;
    }
    expect_planned_as_measured(what, plan, measured, fi->name);
    compared++;
  }
  // The objective's own fields, as it declares them.
  assert_ptr_equal(planned_rec.own_fields, measured_rec.own_fields);
  for (int k = 0; measured_rec.own_fields && k < measured_rec.own_fields->n; k++) {
    const LedgerFieldInfo *fi = &measured_rec.own_fields->field[k];
    double v;
    if (fi->measured_only) {
      assert_int_equal(json_get(plan, fi->name, &v), 0);
      assert_true(isnan(planned_rec.own[k]));
      assert_int_equal(json_get(measured, fi->name, &v), 1);
      continue;
    }
    expect_planned_as_measured(what, plan, measured, fi->name);
    compared++;
  }
  print_message("%s: %d counted fields equal\n", what, compared);
  assert_true(compared > 40);
  return measured_rec;
}

// `tally train ARGS EXTRA --steps 6` into tmpdir/NAME and `tally plan ARGS EXTRA --steps 6
// --step 5 --json` agree on step 5 (expect_plan_is_run). Returns the run's record of step 5.
static inline LedgerRecord plan_equals_run(const char *name, const char *args, const char *extra) {
  assert_int_equal(sh("%s train %s %s --steps 6 --quiet --out %s/%s > %s/%s.log 2>&1", bin, args,
                      extra, tmpdir, name, tmpdir, name),
                   0);
  char *plan = run_ok("%s plan %s %s --steps 6 --step 5 --json", bin, args, extra);
  char path[600], measured[16384];
  snprintf(path, sizeof path, "%s/%s/ledger.jsonl", tmpdir, name);
  read_line(path, 5, measured, sizeof measured);
  char what[128];
  snprintf(what, sizeof what, "%s, step 5", name);
  LedgerRecord r = expect_plan_is_run(what, plan, measured);
  assert_int_equal(r.step, 5);
  free(plan);
  return r;
}

// Every tensor of the checkpoints of runs tmpdir/A and tmpdir/B, byte for byte; A's must hold a
// tensor called `held` unless that is NULL. Returns the steps A's checkpoint holds.
static inline long expect_same_checkpoint(const char *a, const char *b, const char *held) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/%s/checkpoint.safetensors", tmpdir, a);
  snprintf(pb, sizeof pb, "%s/%s/checkpoint.safetensors", tmpdir, b);
  StFile fa, fb;
  if (checkpoint_read(&fa, pa) != 0) fail_msg("%s", tl_last_error());
  if (checkpoint_read(&fb, pb) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(fa.n_tensors, fb.n_tensors);
  if (held && !st_find(&fa, held)) fail_msg("%s lacks %s", pa, held);
  for (int i = 0; i < fa.n_tensors; i++) {
    const StTensor *t = st_find(&fb, fa.tensors[i].name);
    if (!t) fail_msg("%s lacks %s", pb, fa.tensors[i].name);
    assert_int_equal(t->bytes, fa.tensors[i].bytes);
    if (memcmp(t->data, fa.tensors[i].data, t->bytes) != 0)
      fail_msg("%s differs between %s and %s", t->name, a, b);
  }
  long steps = checkpoint_step(&fa);
  st_free(&fa);
  st_free(&fb);
  return steps;
}

// `--steps 6` straight equals `--steps 6 --stop-at 3` then `--resume`, on one replica and on two
// (`args`: the objective and its small run): every tensor of the checkpoints, byte for byte, A's
// holding `held` (the objective's own state).
static inline void expect_stop_and_resume_bit_exact(const char *args, const char *held) {
  const char *replicas[] = {"1", "2"};
  for (int k = 0; k < 2; k++) {
    const char *common = "--no-knn --quiet --set parallel.checksum_every=1";
    const char *r = replicas[k];
    assert_int_equal(sh("%s train %s %s --set parallel.replicas=%s --steps 6 --out %s/straight%s"
                        " > /dev/null 2>&1",
                        bin, args, common, r, tmpdir, r),
                     0);
    assert_int_equal(sh("%s train %s %s --set parallel.replicas=%s --steps 6 --stop-at 3 --out "
                        "%s/split%s > /dev/null 2>&1",
                        bin, args, common, r, tmpdir, r),
                     0);
    assert_int_equal(
        sh("%s train --resume %s/split%s --no-knn --quiet > /dev/null 2>&1", bin, tmpdir, r), 0);
    char straight[32], split[32];
    snprintf(straight, sizeof straight, "straight%s", r);
    snprintf(split, sizeof split, "split%s", r);
    expect_same_checkpoint(straight, split, held);
  }
}
