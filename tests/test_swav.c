// SwAV as a specification: its codes and loss equal main_swav.py's (distributed_sinkhorn and the
// swapped prediction, run by PyTorch on fixed scores), its gradient equals finite differences of
// the loss with the codes held (they carry none); split over two replicas, Sinkhorn-Knopp's sums
// over the global batch give every replica the codes one replica with the whole batch gives; and
// the prototypes stay put for their frozen steps. That its whole step matches finite
// differences, its plan is its run and it resumes exactly is test_contract's, as for every
// objective.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/swav_reference.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "objectives/swav_loss.h"
#include "replica_test_util.h"

enum { N = SWAV_REF_B, K = SWAV_REF_K, G = SWAV_REF_GLOBAL, V = SWAV_REF_GLOBAL + SWAV_REF_LOCAL };

// ---- the loss on its own, on replicas ----

// The fixture's crops as views of n samples, rows of K scores.
static const float *const crops[V] = {swav_ref_scores, swav_ref_scores + N *K,
                                      swav_ref_scores + 2 * N *K, swav_ref_scores + 3 * N *K};

// What a replica keeps of its loss: the codes of its rows of both global crops, (G b, K).
typedef struct {
  float codes[G * N * K];
} Codes;

static void loss_init(LossReplica *r) {
  swav_loss_init(r->loss, &r->ctx, r->b, N, G, V, K, SWAV_REF_TEMPERATURE, SWAV_REF_EPSILON,
                 SWAV_REF_ITERATIONS);
}

// The replica's part of the global mean loss (the parts add up to it) and its rows' gradient.
static double loss_run(LossReplica *r) {
  SwavLoss *l = r->loss;
  const double sum = swav_loss_forward_backward(l, &r->ctx, r->comm, r->z, N, r->dz);
  memcpy(r->terms, l->q, sizeof(float) * G * r->b * K);
  return sum / N;
}

static void loss_destroy(LossReplica *r) { swav_loss_destroy(r->loss); }

static const LossHarness harness = {
    .n = N,
    .d = K,
    .views = V,
    .view = crops,
    .loss_bytes = sizeof(SwavLoss),
    .terms_bytes = sizeof(Codes),
    .init = loss_init,
    .run = loss_run,
    .destroy = loss_destroy,
};

// The loss written out in double with the reference's codes held: what finite differences of the
// scores see when the codes carry no gradient.
static double loss_with_codes_held(void *arg) {
  const float *s = arg;
  double total = 0;
  for (int g = 0; g < G; g++)
    for (int v = 0; v < V; v++) {
      if (v == g) continue;
      for (int i = 0; i < N; i++) {
        const float *row = s + (v * N + i) * K, *q = swav_ref_codes + (g * N + i) * K;
        double max = row[0], sum = 0;
        for (int k = 1; k < K; k++) max = fmax(max, row[k]);
        for (int k = 0; k < K; k++) sum += exp((row[k] - max) / SWAV_REF_TEMPERATURE);
        for (int k = 0; k < K; k++)
          total -= q[k] * ((row[k] - max) / SWAV_REF_TEMPERATURE - log(sum));
      }
    }
  return total / (N * G * (V - 1));
}

static void test_swav_loss_matches_reference(void **state) {
  (void)state;
  LossReplica *c = calloc(1, sizeof *c);
  loss_replicas_run(&harness, 1, (const int[]){N}, c);
  assert_true(fabs(c->value - SWAV_REF_LOSS) < 1e-5 * SWAV_REF_LOSS);
  const float *codes = ((const Codes *)c->terms)->codes;
  for (int i = 0; i < G * N * K; i++) assert_float_equal(codes[i], swav_ref_codes[i], 1e-5);
  // Every sample's code is a distribution over the prototypes.
  for (int r = 0; r < G * N; r++) {
    double sum = 0;
    for (int k = 0; k < K; k++) sum += codes[r * K + k];
    assert_float_equal(sum, 1, 1e-6);
  }
  for (int i = 0; i < V * N * K; i++) assert_float_equal(c->dz[i], swav_ref_dscores[i], 1e-5);
  float s[V * N * K];
  memcpy(s, swav_ref_scores, sizeof s);
  double err = gradcheck(loss_with_codes_held, s, s, c->dz, V * N * K, V * N * K, 1e-3f, 1e-2,
                         "swav dscores");
  assert_true(err < 1e-2);
  loss_replica_free(c);
  free(c);
}

// Samples [0, 2) on one replica and [2, 6) on another: Sinkhorn-Knopp's sums run over both, so
// each gets for its rows the codes, and the gradient, that one replica holding all six computes,
// and their parts of the loss add up to its loss. Codes from a replica's own rows alone would
// spread its 2 samples over the 5 prototypes, not the 6.
static void test_swav_sinkhorn_two_replicas_equal_one(void **state) {
  (void)state;
  LossReplica *one = calloc(1, sizeof *one), *two = calloc(2, sizeof *two);
  loss_replicas_run(&harness, 1, (const int[]){N}, one);
  loss_replicas_run(&harness, 2, (const int[]){2, N - 2}, two);
  assert_float_equal(two[0].value + two[1].value, one->value, 1e-6 * one->value);
  const float *whole = ((const Codes *)one->terms)->codes;
  for (int r = 0; r < 2; r++) {
    const LossReplica *p = &two[r];
    const float *codes = ((const Codes *)p->terms)->codes;
    for (int g = 0; g < G; g++)
      for (int i = 0; i < p->b * K; i++)
        assert_float_equal(codes[g * p->b * K + i], whole[(g * N + p->first) * K + i], 1e-6);
    for (int v = 0; v < V; v++)
      for (int i = 0; i < p->b * K; i++)
        assert_float_equal(p->dz[v * p->b * K + i], one->dz[(v * N + p->first) * K + i], 1e-6);
  }
  for (int r = 0; r < 2; r++) loss_replica_free(&two[r]);
  loss_replica_free(one);
  free(one);
  free(two);
}

// ---- the whole step on a tiny network ----

// The prototypes' gradient over a step at `global_step`, with the first 3 steps frozen.
static double prototype_gradient_at(int global_step, double *other) {
  static const char *const frozen[] = {"swav.local_crops=2", "swav.local_size=4",
                                       "swav.prototypes=8", "swav.freeze_prototypes_niters=3",
                                       NULL};
  Fixture *f = fixture_new("swav", "resnet", frozen);
  f->batch.global_step = global_step;
  assert_true(isfinite(step_loss(f)));
  double prototypes = 0;
  *other = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    const ParamEntry *pe = &f->ps.entries[e];
    double sum = 0;
    for (size_t i = 0; i < pe->count; i++) sum += fabs(f->ps.grad[pe->offset + i]);
    if (!strcmp(pe->name, "swav.prototypes.weight"))
      prototypes = sum;
    else
      *other += sum;
  }
  fixture_free(f);
  return prototypes;
}

// Steps 0-2 train everything but the prototypes; from step 3 on they train too.
static void test_swav_prototypes_frozen_first_steps(void **state) {
  (void)state;
  double other_frozen, other;
  assert_true(prototype_gradient_at(2, &other_frozen) == 0);
  assert_true(other_frozen > 0);
  assert_true(prototype_gradient_at(3, &other) > 0);
  assert_float_equal(other, other_frozen, 1e-9 * other);  // the rest of the step is the same
}

// What one step compares: every crop predicts the codes of the global crops other than itself,
// no negatives, nothing cached, nothing kept but the parameters; the local crops are a second
// view group.
static void test_swav_counts(void **state) {
  (void)state;
  Fixture *f = fixture_new("swav", "resnet", tiny_settings);
  const double loss = step_loss(f);
  // Cross-entropies against distributions over 8 prototypes, at temperature 0.1 on cosines.
  assert_true(loss > 0 && loss < log(8.0) + 2 / 0.1);
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.views_grad, (2 + 2) * B);
  assert_int_equal(f->rec.views_nograd, 0);
  assert_int_equal(f->rec.positives_per_query, 2);
  assert_int_equal(f->rec.negatives_per_query, 0);
  assert_int_equal(f->rec.encodings_next_reused, 0);
  assert_int_equal(f->rec.view_groups, 2);
  assert_int_equal(f->rec.view_group[1].views_grad, 2 * B);
  assert_null(f->rec.own_fields);
  assert_null(f->def->state);
  assert_null(f->def->after_update);
  fixture_free(f);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("swav") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_swav_loss_matches_reference),
      cmocka_unit_test(test_swav_sinkhorn_two_replicas_equal_one),
      cmocka_unit_test(test_swav_prototypes_frozen_first_steps),
      cmocka_unit_test(test_swav_counts),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
