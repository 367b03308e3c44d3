// VICReg: the loss against facebookresearch/vicreg's own forward run by PyTorch (values, terms
// and gradients) and against finite differences; the same global loss and the same gradient of
// each replica's rows whether the batch sits on one replica or is split unevenly over two; the
// whole step against finite differences; and, through the binary, the plan equal to the
// measured ledger and a stopped-and-resumed run equal to one done in one go.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_test_util.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fixtures/vicreg_reference.h"
#include "gradcheck.h"
#include "objectives/objective.h"
#include "objectives/vicreg_loss.h"

enum { N = VICREG_REF_N, D = VICREG_REF_DIM };

// ---- the loss on its own ----

// One replica's part of the fixture: samples [first, first + b) of the N, on `rank` of `group`.
typedef struct {
  LocalGroup *group;
  int rank, first, b;
  DnnlCtx ctx;
  Comm *comm;
  VicRegLoss loss;
  float z[2 * N * D];   // (2b, D): the replica's rows of x, then of y (view-major)
  float dz[2 * N * D];  // (2b, D)
  VicRegTerms terms;
  double value;
} Replica;

static void replica_open(Replica *r) {
  r->comm = comm_local_rank(r->group, r->rank);
  dnnl_ctx_init(&r->ctx);
  vicreg_loss_init(&r->loss, &r->ctx, N, r->b, D, VICREG_REF_SIM_COEFF, VICREG_REF_STD_COEFF,
                   VICREG_REF_COV_COEFF);
  memcpy(r->z, vicreg_ref_x + r->first * D, sizeof(float) * r->b * D);
  memcpy(r->z + r->b * D, vicreg_ref_y + r->first * D, sizeof(float) * r->b * D);
}

static double replica_loss(void *arg) {
  Replica *r = arg;
  r->value = vicreg_loss_forward_backward(&r->loss, &r->ctx, r->comm, r->z, r->dz, &r->terms);
  return r->value;
}

static void replica_close(Replica *r) {
  vicreg_loss_destroy(&r->loss);
  dnnl_ctx_destroy(&r->ctx);
  comm_destroy(r->comm);
}

static void *replica_thread(void *arg) {
  replica_open(arg);
  replica_loss(arg);
  replica_close(arg);
  return NULL;
}

// The loss over the fixture's N samples split into `world` consecutive shards of `sizes`, each
// on its own thread replica.
static void run_split(int world, const int *sizes, Replica *reps) {
  LocalGroup *g = comm_local_group_create(world);
  pthread_t ids[2];
  for (int r = 0, first = 0; r < world; first += sizes[r++]) {
    reps[r] = (Replica){.group = g, .rank = r, .first = first, .b = sizes[r]};
    assert_int_equal(pthread_create(&ids[r], NULL, replica_thread, &reps[r]), 0);
  }
  for (int r = 0; r < world; r++) pthread_join(ids[r], NULL);
  comm_local_group_destroy(g);
}

static void test_vicreg_loss_reference(void **state) {
  (void)state;
  Replica *c = calloc(1, sizeof *c);
  *c = (Replica){.group = comm_local_group_create(1), .b = N};
  replica_open(c);
  double loss = replica_loss(c);
  assert_float_equal(loss, VICREG_REF_LOSS, 1e-5 * VICREG_REF_LOSS);
  assert_float_equal(c->terms.invariance, VICREG_REF_INVARIANCE, 1e-6);
  assert_float_equal(c->terms.variance, VICREG_REF_VARIANCE, 1e-6);
  assert_float_equal(c->terms.covariance, VICREG_REF_COVARIANCE, 1e-5 * VICREG_REF_COVARIANCE);
  for (int i = 0; i < N * D; i++) {
    assert_float_equal(c->dz[i], vicreg_ref_dx[i], 1e-5);
    assert_float_equal(c->dz[N * D + i], vicreg_ref_dy[i], 1e-5);
  }
  float analytic[2 * N * D];
  memcpy(analytic, c->dz, sizeof analytic);
  double err =
      gradcheck(replica_loss, c, c->z, analytic, 2 * N * D, 2 * N * D, 1e-3f, 1e-2, "vicreg dz");
  assert_true(err < 1e-2);
  replica_close(c);
  comm_local_group_destroy(c->group);
  free(c);
}

// Samples [0, 3) on one replica and [3, 8) on another: each gathers the other's embeddings, and
// together they compute what one replica computes on all eight: one global loss, the same
// number on both, and for each replica's rows the gradient the single replica gives them.
static void test_vicreg_loss_two_replicas_equal_one(void **state) {
  (void)state;
  Replica *one = calloc(1, sizeof *one), *two = calloc(2, sizeof *two);
  run_split(1, (const int[]){N}, one);
  run_split(2, (const int[]){3, N - 3}, two);
  assert_memory_equal(&two[0].value, &two[1].value, sizeof(double));
  assert_float_equal(two[0].value, one->value, 1e-6 * one->value);
  assert_float_equal(two[0].terms.variance, one->terms.variance, 1e-7);
  assert_float_equal(two[0].terms.covariance, one->terms.covariance, 1e-6);
  for (int r = 0; r < 2; r++) {
    const Replica *p = &two[r];
    for (int v = 0; v < 2; v++)
      for (int i = 0; i < p->b * D; i++)
        assert_float_equal(p->dz[v * p->b * D + i], one->dz[(v * N + p->first) * D + i], 1e-6);
  }
  free(one);
  free(two);
}

// ---- the whole step on a tiny network ----

enum { B = 4, S = 8, C = 1 };

typedef struct {
  Config cfg;
  DnnlCtx ctx;
  LocalGroup *group;
  Comm *comm;
  ParamSet ps;
  const ObjectiveDef *def;
  Objective *obj;
  Batch batch;
  float views[2 * B * S * S * C];
  int indices[B], labels[B];
  LedgerRecord rec;
} StepCase;

// A ViT small enough for finite differences (GELU is smooth; the expander's ReLU is not, see
// below), or a ResNet for the counts.
static StepCase *step_case_new(const char *backbone) {
  StepCase *f = calloc(1, sizeof *f);
  Config *cfg = &f->cfg;
  config_defaults(cfg);
  cfg->data.image_size = S;
  cfg->data.channels = C;
  ModelSpec *m = &cfg->model.spec;
  if (!strcmp(backbone, "vit")) {
    strcpy(m->type, "vit");
    m->patch_size = 4;
    m->pad_to = 0;
    m->dim = 8;
    m->depth = 1;
    m->heads = 2;
    m->mlp_ratio = 2;
    strcpy(m->pool, "cls");
  } else {
    strcpy(m->type, "resnet");
    m->stem_channels = 4;
    m->n_stages = 2;
    m->stage_channels[0] = 4;
    m->stage_channels[1] = 8;
    m->stage_blocks[0] = m->stage_blocks[1] = 1;
    m->stage_strides[0] = 1;
    m->stage_strides[1] = 2;
  }
  cfg->model.head_hidden_dim = 16;
  cfg->model.head_out_dim = 6;
  cfg->train.batch_size = B;
  dnnl_ctx_init(&f->ctx);
  f->group = comm_local_group_create(1);
  f->comm = comm_local_rank(f->group, 0);
  f->def = objective_find("vicreg");
  assert_non_null(f->def);
  paramset_alloc(&f->ps, f->def->param_count(cfg), 3);
  ObjectiveEnv env = {cfg, &f->ctx, f->comm, &f->ps, B, B, 100, NULL};
  f->obj = f->def->create(&env);
  assert_non_null(f->obj);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (size_t i = 0; i < sizeof f->views / sizeof(float); i++) f->views[i] = rng_normal(&r);
  f->batch =
      (Batch){.n = B, .n_views = 2, .views = f->views, .indices = f->indices, .labels = f->labels};
  return f;
}

static void step_case_free(StepCase *f) {
  f->def->destroy(f->obj);
  paramset_free(&f->ps);
  comm_destroy(f->comm);
  comm_local_group_destroy(f->group);
  dnnl_ctx_destroy(&f->ctx);
  free(f);
}

static double step_loss(StepCase *f) { return f->def->step(f->obj, &f->batch, &f->rec); }

static double quotient(StepCase *f, float *x, float eps) {
  const float saved = *x;
  *x = saved + eps;
  double lp = step_loss(f);
  *x = saved - eps;
  double lm = step_loss(f);
  *x = saved;
  return (lp - lm) / (2.0 * eps);
}

// Three entries of every trainable tensor against central differences. The expander's ReLU
// makes the loss kinked: an entry whose quotients at eps and eps/2 disagree straddles a kink
// and is skipped (at most a quarter of them). The loss is ~30, so float32 rounding puts ~1e-3
// of noise in a quotient: gradients are compared on an absolute scale of 5e-2.
static void test_vicreg_step_gradient(void **state) {
  (void)state;
  StepCase *f = step_case_new("vit");
  step_loss(f);
  float *analytic = malloc(sizeof(float) * f->ps.count);
  memcpy(analytic, f->ps.grad, sizeof(float) * f->ps.count);
  Rng r = rng_stream(99, RNG_TEST, 1, 0);
  const float eps = 2e-3f;
  int checked = 0, kinks = 0, bad = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    const ParamEntry *pe = &f->ps.entries[e];
    if (pe->is_buffer) continue;
    for (int k = 0; k < 3; k++, checked++) {
      size_t i = pe->offset + rng_below(&r, (uint32_t)pe->count);
      double n1 = quotient(f, f->ps.data + i, eps), n2 = quotient(f, f->ps.data + i, eps / 2);
      if (fabs(n1 - n2) > 0.02 * (fabs(n1) + fabs(n2)) + 2e-3) {
        kinks++;
        continue;
      }
      double err = fabs(n2 - analytic[i]) / fmax(5e-2, fabs(n2) + fabs(analytic[i]));
      if (err > 2e-2) {
        bad++;
        printf("%s[%zu]: numeric %.6g analytic %.6g\n", pe->name, i - pe->offset, n2, analytic[i]);
      }
    }
  }
  printf("vicreg/vit: %d gradient entries checked, %d mismatched, %d skipped at kinks\n", checked,
         bad, kinks);
  assert_int_equal(bad, 0);
  assert_true(kinks <= checked / 4);
  free(analytic);
  step_case_free(f);
}

// What one step encodes and compares: both views with backward, one positive, no negatives,
// nothing cached, everything encoded anew next step.
static void test_vicreg_counts(void **state) {
  (void)state;
  StepCase *f = step_case_new("resnet");
  assert_true(isfinite(step_loss(f)));
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.views_grad, 2 * B);
  assert_int_equal(f->rec.views_nograd, 0);
  assert_int_equal(f->rec.positives_per_query, 1);
  assert_int_equal(f->rec.negatives_per_query, 0);
  assert_int_equal(f->rec.queue_vectors, 0);
  assert_int_equal(f->rec.encodings_next_new, 2 * B);
  assert_int_equal(f->rec.encodings_next_reused, 0);
  assert_null(f->def->state);  // nothing beyond the parameters to checkpoint
  step_case_free(f);
}

// ---- through the binary ----

static const char *small = "--set train.batch_size=32 --set data.limit=256 --no-knn";

// The value of "key" in a one-line JSON object: 1 and *v for a number, 0 for null, -1 if absent.
static int json_get(const char *line, const char *key, double *v) {
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *p = strstr(line, pattern);
  if (!p) return -1;
  p += strlen(pattern);
  if (!strncmp(p, "null", 4)) return 0;
  char *end;
  *v = strtod(p, &end);
  return end == p ? -1 : 1;
}

// Line `step` (0-based) of a file, into buf.
static void read_line(const char *path, int step, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  for (int i = 0; i <= step; i++) assert_non_null(fgets(buf, (int)cap, f));
  fclose(f);
}

// `tally plan --step 5 --json` against step 5 of a 6-step run's ledger, for every field the plan
// gives a number for (everything but time, loss and RSS): with one replica, and with two
// uneven replicas (the gathers of both views and the loss sums show in the communication bytes).
static void plan_equals_run(const char *name, const char *extra) {
  char dir[512], path[600], measured[16384], planned[16384];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
  assert_int_equal(sh("%s train --objective=vicreg --steps 6 %s %s --quiet --out %s > %s.log 2>&1",
                      bin, small, extra, dir, dir),
                   0);
  snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
  read_line(path, 5, measured, sizeof measured);
  assert_int_equal(sh("%s plan --objective=vicreg --steps 6 %s %s --json --step 5 > %s/plan.json",
                      bin, small, extra, dir),
                   0);
  snprintf(path, sizeof path, "%s/plan.json", dir);
  read_line(path, 0, planned, sizeof planned);
  int compared = 0;
  for (int i = 0; i < ledger_field_count(); i++) {
    const LedgerFieldInfo *info = ledger_field_info(i);
    double p, m;
    if (info->unit == UNIT_TEXT) continue;
    int got = json_get(planned, info->name, &p);
    if (info->measured_only) {
      assert_int_not_equal(got, 1);
      continue;
    }
    if (got != 1) fail_msg("%s: the plan gives no %s", name, info->name);
    assert_int_equal(json_get(measured, info->name, &m), 1);
    if (p != m) fail_msg("%s: %s planned %.9g, measured %.9g", name, info->name, p, m);
    compared++;
  }
  print_message("%s: %d counted fields equal\n", name, compared);
  assert_true(compared > 40);
}

static void test_vicreg_plan_equals_run(void **state) {
  (void)state;
  plan_equals_run("plan1", "");
  plan_equals_run("plan2", "--set parallel.replicas=2 --set parallel.shard_weights=1,3");
}

// --steps 6 --stop-at 3 then --resume ends with every tensor of the checkpoint byte-equal to
// --steps 6 in one go; `tally report` reads the run.
static void test_vicreg_resume_is_exact(void **state) {
  (void)state;
  assert_int_equal(
      sh("%s train --objective=vicreg --steps 6 %s --quiet --out %s/straight > /dev/null 2>&1", bin,
         small, tmpdir),
      0);
  assert_int_equal(sh("%s train --objective=vicreg --steps 6 --stop-at 3 %s --quiet --out %s/split "
                      "> /dev/null 2>&1",
                      bin, small, tmpdir),
                   0);
  assert_int_equal(sh("%s train --resume %s/split --no-knn --quiet > /dev/null 2>&1", bin, tmpdir),
                   0);
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/straight/checkpoint.safetensors", tmpdir);
  snprintf(pb, sizeof pb, "%s/split/checkpoint.safetensors", tmpdir);
  StFile fa, fb;
  if (checkpoint_read(&fa, pa) != 0) fail_msg("%s", tl_last_error());
  if (checkpoint_read(&fb, pb) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(checkpoint_step(&fa), 6);
  assert_int_equal(fa.n_tensors, fb.n_tensors);
  for (int i = 0; i < fa.n_tensors; i++) {
    const StTensor *t = st_find(&fb, fa.tensors[i].name);
    if (!t) fail_msg("the resumed checkpoint lacks %s", fa.tensors[i].name);
    assert_int_equal(t->bytes, fa.tensors[i].bytes);
    if (memcmp(t->data, fa.tensors[i].data, t->bytes) != 0)
      fail_msg("%s differs after stop and resume", t->name);
  }
  st_free(&fa);
  st_free(&fb);
  assert_int_equal(sh("%s report %s/split > /dev/null 2>&1 && grep -q vicreg %s/split/report.html",
                      bin, tmpdir, tmpdir),
                   0);
}

int main(void) {
  if (cli_test_init("vicreg") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vicreg_loss_reference),
      cmocka_unit_test(test_vicreg_loss_two_replicas_equal_one),
      cmocka_unit_test(test_vicreg_step_gradient),
      cmocka_unit_test(test_vicreg_counts),
      cmocka_unit_test(test_vicreg_plan_equals_run),
      cmocka_unit_test(test_vicreg_resume_is_exact),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
