// VICReg: the loss against facebookresearch/vicreg's own forward run by PyTorch (values, terms
// and gradients) and against finite differences; the same global loss and the same gradient of
// each replica's rows whether the batch sits on one replica or is split unevenly over two. That
// its whole step matches finite differences, its plan is its run and it resumes exactly is
// test_contract's, as for every objective.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/vicreg_reference.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "objectives/vicreg_loss.h"
#include "replica_test_util.h"

enum { N = VICREG_REF_N, D = VICREG_REF_DIM };

// ---- the loss on its own ----

static void loss_init(LossReplica *r) {
  vicreg_loss_init(r->loss, &r->ctx, N, r->b, D, VICREG_REF_SIM_COEFF, VICREG_REF_STD_COEFF,
                   VICREG_REF_COV_COEFF);
}

static double loss_run(LossReplica *r) {
  return vicreg_loss_forward_backward(r->loss, &r->ctx, r->comm, r->z, r->dz, r->terms);
}

static void loss_destroy(LossReplica *r) { vicreg_loss_destroy(r->loss); }

static const LossHarness harness = {
    .n = N,
    .d = D,
    .views = 2,
    .view = (const float *const[]){vicreg_ref_x, vicreg_ref_y},
    .loss_bytes = sizeof(VicRegLoss),
    .terms_bytes = sizeof(VicRegTerms),
    .init = loss_init,
    .run = loss_run,
    .destroy = loss_destroy,
};

#define TERMS(r) ((const VicRegTerms *)(r)->terms)

static void test_vicreg_loss_reference(void **state) {
  (void)state;
  LossReplica *c = calloc(1, sizeof *c);
  *c = (LossReplica){.h = &harness, .group = comm_local_group_create(1), .b = N};
  loss_replica_open(c);
  double loss = loss_replica_run(c);
  assert_float_equal(loss, VICREG_REF_LOSS, 1e-5 * VICREG_REF_LOSS);
  assert_float_equal(TERMS(c)->invariance, VICREG_REF_INVARIANCE, 1e-6);
  assert_float_equal(TERMS(c)->variance, VICREG_REF_VARIANCE, 1e-6);
  assert_float_equal(TERMS(c)->covariance, VICREG_REF_COVARIANCE, 1e-5 * VICREG_REF_COVARIANCE);
  for (int i = 0; i < N * D; i++) {
    assert_float_equal(c->dz[i], vicreg_ref_dx[i], 1e-5);
    assert_float_equal(c->dz[N * D + i], vicreg_ref_dy[i], 1e-5);
  }
  float analytic[2 * N * D];
  memcpy(analytic, c->dz, sizeof analytic);
  double err = gradcheck(loss_replica_run, c, c->z, analytic, 2 * N * D, 2 * N * D, 1e-3f, 1e-2,
                         "vicreg dz");
  assert_true(err < 1e-2);
  loss_replica_close(c);
  loss_replica_free(c);
  comm_local_group_destroy(c->group);
  free(c);
}

// Samples [0, 3) on one replica and [3, 8) on another: each gathers the other's embeddings, and
// together they compute what one replica computes on all eight: one global loss, the same
// number on both, and for each replica's rows the gradient the single replica gives them.
static void test_vicreg_loss_two_replicas_equal_one(void **state) {
  (void)state;
  LossReplica *one = calloc(1, sizeof *one), *two = calloc(2, sizeof *two);
  loss_replicas_run(&harness, 1, (const int[]){N}, one);
  loss_replicas_run(&harness, 2, (const int[]){3, N - 3}, two);
  assert_memory_equal(&two[0].value, &two[1].value, sizeof(double));
  assert_float_equal(two[0].value, one->value, 1e-6 * one->value);
  assert_float_equal(TERMS(&two[0])->variance, TERMS(one)->variance, 1e-7);
  assert_float_equal(TERMS(&two[0])->covariance, TERMS(one)->covariance, 1e-6);
  for (int r = 0; r < 2; r++) {
    const LossReplica *p = &two[r];
    for (int v = 0; v < 2; v++)
      for (int i = 0; i < p->b * D; i++)
        assert_float_equal(p->dz[v * p->b * D + i], one->dz[(v * N + p->first) * D + i], 1e-6);
  }
  for (int r = 0; r < 2; r++) loss_replica_free(&two[r]);
  loss_replica_free(one);
  free(one);
  free(two);
}

// ---- the whole step on a tiny network ----

// What one step compares: one positive, no negatives, nothing cached or reused.
static void test_vicreg_counts(void **state) {
  (void)state;
  Fixture *f = fixture_new("vicreg", "resnet", NULL);
  assert_true(isfinite(step_loss(f)));
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.positives_per_query, 1);
  assert_int_equal(f->rec.negatives_per_query, 0);
  assert_null(f->rec.own_fields);  // nothing of its own: no queue, no target
  assert_int_equal(f->rec.encodings_next_reused, 0);
  assert_null(f->def->state);  // nothing beyond the parameters to checkpoint
  fixture_free(f);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("vicreg") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vicreg_loss_reference),
      cmocka_unit_test(test_vicreg_loss_two_replicas_equal_one),
      cmocka_unit_test(test_vicreg_counts),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
