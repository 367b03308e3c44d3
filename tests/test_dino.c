// DINO as a specification: its loss equals the reference implementation's DINOLoss in PyTorch
// (values and gradients); the centre follows the teacher outputs' mean by its
// momentum; and, through the binary, what the ledger says of its teacher and its local crops.
// That its step's gradient matches finite differences, its plan is its run and it resumes
// exactly is test_contract's.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/dino_reference.h"
#include "nn/backbone.h"
#include "objective_test_util.h"
#include "objectives/dino_loss.h"

// ---- the loss against PyTorch ----

enum {
  RB = DINO_REF_B,
  RK = DINO_REF_K,
  RG = DINO_REF_GLOBAL,
  RV = DINO_REF_GLOBAL + DINO_REF_LOCAL
};

typedef struct {
  ExecCtx ctx;
  DinoLoss loss;
  float s[RV * RB * RK], ds[RV * RB * RK];
} LossCase;

static double loss_case_run(void *arg) {
  LossCase *c = arg;
  return dino_loss_forward_backward(&c->loss, &c->ctx, c->s, dino_ref_teacher, dino_ref_center,
                                    DINO_REF_STUDENT_TEMP, DINO_REF_TEACHER_TEMP, RB, c->ds) /
         RB;
}

static void test_loss_matches_pytorch(void **state) {
  (void)state;
  LossCase *c = calloc(1, sizeof *c);
  exec_ctx_init(&c->ctx);
  dino_loss_init(&c->loss, &c->ctx, RB, RG, RV, RK);
  memcpy(c->s, dino_ref_student, sizeof c->s);
  assert_int_equal(dino_loss_pairs(RG, RV), RG * RV - RG);
  const double loss = loss_case_run(c);
  assert_true(fabs(loss - DINO_REF_LOSS) < 1e-5 * fabs(DINO_REF_LOSS));
  for (int i = 0; i < RV * RB * RK; i++) assert_float_equal(c->ds[i], dino_ref_dstudent[i], 1e-5);
  dino_loss_destroy(&c->loss);
  exec_ctx_destroy(&c->ctx);
  free(c);
}

// ---- the whole step ----

// What a step compares: each crop with the teacher's two global ones; the checkpoint holds the
// teacher (every student parameter) and the centre, which follows the teacher outputs' batch mean:
// c <- 0.9 c + 0.1 mean. The tiny settings: two local crops of 4 x 4 beside the two global ones
// of 8 x 8, 8 prototypes, momentum 0.9.
static void test_counts_teacher_and_centre(void **state) {
  (void)state;
  Fixture *f = fixture_new("dino", "resnet", tiny_settings);
  StFile st = {0};
  f->def->state(f->obj, &st);
  const StTensor *center = st_find(&st, "dino.center");
  assert_non_null(center);
  assert_int_equal(center->bytes, sizeof(float) * 8);
  int teacher_tensors = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    char name[ST_NAME_MAX];
    snprintf(name, sizeof name, "dino.teacher.%s", f->ps.entries[e].name);
    teacher_tensors += st_find(&st, name) != NULL;
  }
  assert_int_equal(teacher_tensors, f->ps.n_entries);
  assert_int_equal(st.n_tensors, f->ps.n_entries + 1);

  double loss = step_loss(f);
  assert_true(loss > 0 && loss < 2 * log(8.0) / 0.5);
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.positives_per_query, 2);
  assert_int_equal(f->rec.negatives_per_query, 0);
  float before[8];
  memcpy(before, center->data, sizeof before);
  for (int k = 0; k < 8; k++) assert_float_equal(before[k], 0, 0);
  f->def->after_update(f->obj, &f->batch, &f->rec);
  float after_one[8];
  memcpy(after_one, center->data, sizeof after_one);
  // The same teacher outputs again: the centre moves 10% of the way to the same mean.
  f->def->after_update(f->obj, &f->batch, &f->rec);
  const float *c = (const float *)center->data;
  double moved = 0;
  for (int k = 0; k < 8; k++) {
    const double mean = after_one[k] / 0.1;  // c1 = 0.1 mean
    assert_float_equal(c[k], 0.9 * after_one[k] + 0.1 * mean, 1e-6);
    moved += fabs(after_one[k]);
  }
  assert_true(moved > 0);
  st_free(&st);
  fixture_free(f);
}

// The student's backbone keeps the running statistics of its global crops, the size it is
// evaluated and exported at: the local crops' instance normalizes with its own batch statistics
// and leaves them. The teacher, a copy of the student at the first step, encodes only the global
// crops, so after one step every running statistic of the student's backbone equals the
// teacher's (and has moved from its start).
static void test_running_stats_from_global_crops(void **state) {
  (void)state;
  Fixture *f = fixture_new("dino", "resnet", tiny_settings);
  StFile st = {0};
  f->def->state(f->obj, &st);
  step_loss(f);
  const size_t backbone_floats = backbone_param_count(&f->cfg.model.spec, S, C);
  int buffers = 0;
  double moved = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    const ParamEntry *pe = &f->ps.entries[e];
    if (!pe->is_buffer || pe->offset >= backbone_floats) continue;
    char name[ST_NAME_MAX];
    snprintf(name, sizeof name, "dino.teacher.%s", pe->name);
    const StTensor *t = st_find(&st, name);
    assert_non_null(t);
    const float *teacher = (const float *)t->data, *student = f->ps.data + pe->offset;
    const float start = strstr(pe->name, "running_var") ? 1.0f : 0.0f;
    for (size_t i = 0; i < pe->count; i++) {
      assert_float_equal(student[i], teacher[i], 1e-5 * (1 + fabs(teacher[i])));
      moved += fabs(student[i] - start);
    }
    buffers++;
  }
  assert_true(buffers > 0 && moved > 0);
  st_free(&st);
  fixture_free(f);
}

// The recipe's backbone: a ResNet whose second instance (the local crops) shares the global
// crops' weights and BatchNorm parameters and adds its gradients to theirs. test_contract checks
// the step's gradient on the ViT; here on the ResNet, the teacher moved off the student first.
static void test_resnet_step_gradient(void **state) {
  (void)state;
  Fixture *f = fixture_new("dino", "resnet", tiny_settings);
  step_loss(f);
  for (size_t i = 0; i < f->ps.count; i++) f->ps.data[i] -= 0.5f * f->ps.grad[i];
  f->def->after_update(f->obj, &f->batch, &f->rec);
  const StepGradTolerance tol = {.eps = 1e-2f, .kink_atol = 2e-4, .grad_scale = 1e-2};
  assert_true(check_step_gradient(f, "dino/resnet", tol, "stem") > 0);
  fixture_free(f);
}

// ---- through the binary ----

// A slice of Fashion-MNIST in batches of 32 (8 steps an epoch); 2 global crops of 28 and 4 local
// ones of 12.
static const char *small =
    "--objective=dino --set train.batch_size=32 --set data.limit=256 --set data.test_limit=128 "
    "--set dino.local_crops=4 --set dino.local_size=12";
enum { LOCAL = 12 };

// The ledger's answers (the crops each group encodes are test_ledger's, held to the FLOPs the
// encoders counted): the teacher's parameters and the centre held as the momentum encoder, and
// what a local crop costs beside a global one. Also with two uneven replicas, and with the
// paper's three-layer head.
static void test_plan_equals_run(void **state) {
  (void)state;
  LedgerRecord r = plan_equals_run("one", small, "");
  assert_true(ledger_value(&r, "momentum_distance") > 0);
  assert_int_equal(r.images_source, 32);
  // The teacher (a copy of every student parameter) and the centre (out_dim floats).
  assert_int_equal(r.momentum_encoder_bytes, r.param_bytes + sizeof(float) * 1024);
  // Two view groups: the 2 global crops (student and teacher) and the 4 local ones (student
  // only), each at its own size.
  assert_int_equal(r.view_groups, 2);
  const LedgerViewGroup *g = r.view_group, *l = r.view_group + 1;
  assert_true(g->size == 28 && g->count == 2 && l->size == LOCAL && l->count == 4);
  // A local crop costs its share of the pixels: (LOCAL / 28)^2 of a global crop's forward (the
  // student's and the teacher's on the global ones), and its backward twice its forward (data
  // and weight gradients).
  const double per_global = g->flops_forward / (2.0 * 2 * 32),
               per_local = l->flops_forward / (4 * 32);
  assert_float_equal(per_local / per_global, (LOCAL / 28.0) * (LOCAL / 28.0), 1e-3);
  assert_float_equal(l->flops_backward / l->flops_forward, 2.0, 0.05);
  assert_true(l->activation_bytes > 0 && g->activation_bytes > l->activation_bytes);
  // On one replica the groups' activations are all the encoder's (counted at the build on the
  // replica's thread, against the allocator's live total at the step).
  assert_int_equal(g->activation_bytes + l->activation_bytes, r.activation_bytes_by[COMP_ENCODER]);
  const size_t one_params = r.param_bytes;
  r = plan_equals_run("two", small,
                      "--set parallel.replicas=2 --set parallel.shard_weights=1,3 --no-knn");
  assert_int_equal(r.shard_samples, 8);
  // The paper's three-layer head with BatchNorm: a hidden (256 x 256) layer with its bias more,
  // and two BatchNorms (gamma, beta and the running mean and variance) that GELU does not have.
  r = plan_equals_run("deep", small, "--set dino.head_layers=3 --set dino.head_bn=1 --no-knn");
  assert_int_equal(r.param_bytes - one_params, sizeof(float) * (256 * 256 + 256 + 2 * 4 * 256));
}

int main(void) {
  objective_register_config();
  if (cli_test_init("dino") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_matches_pytorch),

      cmocka_unit_test(test_counts_teacher_and_centre),
      cmocka_unit_test(test_running_stats_from_global_crops),
      cmocka_unit_test(test_resnet_step_gradient),
      cmocka_unit_test(test_plan_equals_run),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
