// Barlow Twins: the loss against facebookresearch/barlowtwins' own forward run by PyTorch (value,
// terms and gradients) and against finite differences; the same global loss and the same
// gradient of each replica's rows whether the batch sits on one replica or is split unevenly over
// two, since the standardization and the cross-correlation are the global batch's. That its whole
// step matches finite differences, its plan is its run and it resumes exactly is test_contract's,
// as for every objective.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/barlow_reference.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "objectives/barlow_loss.h"
#include "replica_test_util.h"

enum { N = BARLOW_REF_N, D = BARLOW_REF_DIM };

// ---- the loss on its own ----

static void loss_init(LossReplica *r) {
  barlow_loss_init(r->loss, &r->ctx, N, r->b, D, BARLOW_REF_LAMBDA);
}

static double loss_run(LossReplica *r) {
  return barlow_loss_forward_backward(r->loss, &r->ctx, r->comm, r->z, r->dz, r->terms);
}

static void loss_destroy(LossReplica *r) { barlow_loss_destroy(r->loss); }

static const LossHarness harness = {
    .n = N,
    .d = D,
    .views = 2,
    .view = (const float *const[]){barlow_ref_z1, barlow_ref_z2},
    .loss_bytes = sizeof(BarlowLoss),
    .terms_bytes = sizeof(BarlowTerms),
    .init = loss_init,
    .run = loss_run,
    .destroy = loss_destroy,
};

#define TERMS(r) ((const BarlowTerms *)(r)->terms)

static void test_barlow_loss_reference(void **state) {
  (void)state;
  LossReplica *c = calloc(1, sizeof *c);
  *c = (LossReplica){.h = &harness, .group = comm_local_group_create(1), .b = N};
  loss_replica_open(c);
  double loss = loss_replica_run(c);
  assert_float_equal(loss, BARLOW_REF_LOSS, 1e-5 * BARLOW_REF_LOSS);
  assert_float_equal(TERMS(c)->on_diagonal, BARLOW_REF_ON_DIAGONAL, 1e-5);
  assert_float_equal(TERMS(c)->off_diagonal, BARLOW_REF_OFF_DIAGONAL,
                     1e-5 * BARLOW_REF_OFF_DIAGONAL);
  for (int i = 0; i < N * D; i++) {
    assert_float_equal(c->dz[i], barlow_ref_dz1[i], 1e-5);
    assert_float_equal(c->dz[N * D + i], barlow_ref_dz2[i], 1e-5);
  }
  float analytic[2 * N * D];
  memcpy(analytic, c->dz, sizeof analytic);
  double err = gradcheck(loss_replica_run, c, c->z, analytic, 2 * N * D, 2 * N * D, 1e-3f, 1e-2,
                         "barlow dz");
  assert_true(err < 1e-2);
  loss_replica_close(c);
  loss_replica_free(c);
  comm_local_group_destroy(c->group);
  free(c);
}

// Two views that are the same standardized, decorrelated columns: c is the identity up to
// BatchNorm's eps, so the loss is (eps / (var + eps))^2 per dimension and nothing else, and
// neither view's rows are pushed anywhere that matters.
static void test_barlow_identity_correlation_costs_nothing(void **state) {
  (void)state;
  // Columns +-1 in the patterns of a 4x4 Hadamard matrix's rows 1-3 (each mean 0, variance 1,
  // orthogonal to the others), over 8 samples by repeating the 4.
  static const float h[4][3] = {{1, 1, 1}, {-1, 1, -1}, {1, -1, -1}, {-1, -1, 1}};
  enum { n = 8, d = 3 };
  float z[2 * n * d], dz[2 * n * d];
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < n; i++)
      for (int k = 0; k < d; k++) z[(v * n + i) * d + k] = 3 * h[i % 4][k] + (float)k;
  LocalGroup *g = comm_local_group_create(1);
  Comm *comm = comm_local_rank(g, 0);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  BarlowLoss l;
  barlow_loss_init(&l, &ctx, n, n, d, 0.5f);
  BarlowTerms t;
  double loss = barlow_loss_forward_backward(&l, &ctx, comm, z, dz, &t);
  // var 9 per column: c_ii = 9 / sqrt(9 + 1e-5)^2, off-diagonal exactly 0.
  const double cii = 9.0 / (9.0 + 1e-5);
  assert_float_equal(t.on_diagonal, d * (1 - cii) * (1 - cii), 1e-9);
  assert_float_equal(t.off_diagonal, 0, 1e-10);
  assert_float_equal(loss, t.on_diagonal, 1e-9);
  for (int i = 0; i < 2 * n * d; i++) assert_float_equal(dz[i], 0, 1e-6);
  barlow_loss_destroy(&l);
  exec_ctx_destroy(&ctx);
  comm_destroy(comm);
  comm_local_group_destroy(g);
}

// Samples [0, 3) on one replica and [3, 8) on another: each gathers the other's embeddings, and
// together they compute what one replica computes on all eight: one global loss, the same
// number on both, and for each replica's rows the gradient the single replica gives them. A
// replica that standardized or correlated only its own shard would get neither.
static void test_barlow_loss_two_replicas_equal_one(void **state) {
  (void)state;
  LossReplica *one = calloc(1, sizeof *one), *two = calloc(2, sizeof *two);
  loss_replicas_run(&harness, 1, (const int[]){N}, one);
  loss_replicas_run(&harness, 2, (const int[]){3, N - 3}, two);
  assert_memory_equal(&two[0].value, &two[1].value, sizeof(double));
  assert_float_equal(two[0].value, one->value, 1e-6 * one->value);
  assert_float_equal(TERMS(&two[0])->on_diagonal, TERMS(one)->on_diagonal, 1e-7);
  assert_float_equal(TERMS(&two[0])->off_diagonal, TERMS(one)->off_diagonal, 1e-6);
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

// What one step compares: one positive, no negatives, nothing cached or reused; the projector is
// the paper's three linear layers.
static void test_barlow_counts(void **state) {
  (void)state;
  Fixture *f = fixture_new("barlow", "resnet", NULL);
  assert_true(isfinite(step_loss(f)));
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.views_grad, 2 * B);
  assert_int_equal(f->rec.positives_per_query, 1);
  assert_int_equal(f->rec.negatives_per_query, 0);
  assert_null(f->rec.own_fields);  // nothing of its own: no queue, no target
  assert_int_equal(f->rec.encodings_next_reused, 0);
  assert_null(f->def->state);  // nothing beyond the parameters to checkpoint
  fixture_free(f);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("barlow") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_barlow_loss_reference),
      cmocka_unit_test(test_barlow_identity_correlation_costs_nothing),
      cmocka_unit_test(test_barlow_loss_two_replicas_equal_one),
      cmocka_unit_test(test_barlow_counts),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
