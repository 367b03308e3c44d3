// BYOL as a specification: its loss equals PyTorch's (values and gradients); the target is an EMA
// copy of encoder + projector only (no predictor, no gradient) that moves exactly by the momentum
// rule along its cosine schedule; and, through the binary, what the ledger says of its target and
// of its asymmetric views. That its step's gradient matches finite differences, its plan is its run
// and it resumes exactly is test_contract's.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/byol_reference.h"
#include "gradcheck.h"
#include "nn/head.h"
#include "objective_test_util.h"
#include "objectives/byol_loss.h"
#include "objectives/ema.h"

// ---- the loss against PyTorch ----

enum { RB = BYOL_REF_B, RD = BYOL_REF_DIM };

typedef struct {
  ExecCtx ctx;
  ByolLoss loss;
  float p[2 * RB * RD], dp[2 * RB * RD];
} LossCase;

static double loss_case_run(void *arg) {
  LossCase *c = arg;
  return byol_loss_forward_backward(&c->loss, &c->ctx, c->p, byol_ref_z, RB, c->dp) / RB;
}

static void test_loss_matches_pytorch(void **state) {
  (void)state;
  LossCase *c = calloc(1, sizeof *c);
  exec_ctx_init(&c->ctx);
  const Builder b = {.ctx = &c->ctx};
  byol_loss_init(&c->loss, &b, 2 * RB, RD);
  memcpy(c->p, byol_ref_p, sizeof c->p);
  assert_float_equal(loss_case_run(c), BYOL_REF_LOSS, 1e-6);
  for (int i = 0; i < 2 * RB * RD; i++) assert_float_equal(c->dp[i], byol_ref_dp[i], 1e-6);
  float analytic[2 * RB * RD];
  memcpy(analytic, c->dp, sizeof analytic);
  // A step of 1e-2, as the other losses' checks: the norms are summed in float (oneDNN's
  // reduction), whose rounding a step of 1e-3 does not rise far enough above.
  assert_true(gradcheck(loss_case_run, c, c->p, analytic, 2 * RB * RD, 2 * RB * RD, 1e-2f, 1e-4,
                        "byol dp") < 1e-2);
  // 2 - 2 cos lies in [0, 4] per view order: identical directions give 0, whatever the scale.
  float same[2 * RB * RD];
  for (int i = 0; i < 2 * RB * RD; i++) same[i] = 3.0f * byol_ref_z[(i + RB * RD) % (2 * RB * RD)];
  memcpy(c->p, same, sizeof same);
  assert_float_equal(loss_case_run(c), 0.0, 1e-6);
  byol_loss_destroy(&c->loss);
  exec_ctx_destroy(&c->ctx);
  free(c);
}

// ---- the whole step, in process, on a tiny network ----

enum { PRED_HIDDEN = 12 };

static const char *const byol_settings[] = {"byol.momentum=0.9", "byol.momentum_schedule=cosine",
                                            "byol.predictor_hidden_dim=12", NULL};

// The target's parameters as one block (the objective's state tensors are consecutive slices of
// it, over its live parameters), and their count.
static const float *target_block(const StFile *target, size_t *count) {
  size_t bytes = 0;
  for (int i = 0; i < target->n_tensors; i++) {
    const StTensor *t = &target->tensors[i];
    assert_ptr_equal((const char *)target->tensors[0].data + bytes, t->data);
    bytes += t->bytes;
  }
  *count = bytes / sizeof(float);
  return target->tensors[0].data;
}

// A projection head's floats by hand: Linear (weights + bias), BatchNorm (gamma, beta, running
// mean and variance), Linear.
static size_t head_floats(size_t in, size_t hidden, size_t out) {
  return in * hidden + hidden + 4 * hidden + hidden * out + out;
}

static size_t backbone_with_head_floats(const Config *c) {
  const ModelSpec *s = &c->model.spec;
  return backbone_param_count(s, c->data.image_size, c->data.channels) +
         head_floats((size_t)backbone_feature_dim(s), (size_t)c->model.head_hidden_dim,
                     (size_t)c->model.head_out_dim);
}

// What a step compares, and what the target is: encoder + projector with the online
// network's names and shapes, no predictor, no gradient storage.
static void test_counts_and_target_shape(void **state) {
  (void)state;
  Fixture *f = fixture_new("byol", "resnet", byol_settings);
  StFile target_state = {0};  // the state function adds to it
  f->def->state(f->obj, &target_state);
  size_t with_head = backbone_with_head_floats(&f->cfg);
  assert_int_equal(f->ps.count, with_head + head_floats(HEAD_OUT, PRED_HIDDEN, HEAD_OUT));
  size_t target_count;
  const float *target = target_block(&target_state, &target_count);
  assert_int_equal(target_count, with_head);
  assert_memory_equal(target, f->ps.data, sizeof(float) * with_head);
  int predictor_entries = 0;
  for (int e = 0; e < f->ps.n_entries; e++) {
    const ParamEntry *pe = &f->ps.entries[e];
    if (pe->offset >= with_head) {
      predictor_entries++;
      assert_int_equal(strncmp(pe->name, "predictor.", 10), 0);
      continue;
    }
    char name[ST_NAME_MAX];
    snprintf(name, sizeof name, "byol.target.%s", pe->name);
    const StTensor *t = st_find(&target_state, name);
    if (!t) fail_msg("the target has no %s", name);
    assert_int_equal(t->bytes, sizeof(float) * pe->count);
  }
  assert_int_equal(predictor_entries, 8);  // fc1 w/b, bn gamma/beta/mean/var, fc2 w/b
  assert_int_equal(target_state.n_tensors, f->ps.n_entries - predictor_entries);
  st_free(&target_state);

  double loss = step_loss(f);
  assert_true(loss > 0 && loss < 8);
  assert_int_equal(f->rec.images_source, B);
  assert_int_equal(f->rec.positives_per_query, 1);
  assert_int_equal(f->rec.negatives_per_query, 0);
  assert_int_equal(f->rec.encodings_next_reused, 0);
  // Its own fields are the target's drift alone: no queue.
  assert_ptr_equal(f->rec.own_fields, objective_ledger_fields("byol"));
  assert_true(isnan(ledger_value(&f->rec, "queue_vectors")));
  fixture_free(f);
}

// theta_t <- tau theta_t + (1 - tau) theta_o over encoder + projector, with tau rising from 0.9
// to 1 along a half cosine over the run's 100 steps; BatchNorm statistics stay the target's own,
// and momentum_distance is ||theta_t - theta_o|| / ||theta_o|| after the update.
static void test_target_follows_momentum_rule(void **state) {
  (void)state;
  Fixture *f = fixture_new("byol", "resnet", byol_settings);
  StFile target_state = {0};
  f->def->state(f->obj, &target_state);
  size_t n;
  const float *target = target_block(&target_state, &n);
  float *before = malloc(sizeof(float) * n);
  const int steps[] = {0, 1, 50, 99};
  const double tau_expected[] = {0.9, 1 - 0.1 * (cos(M_PI / 100) + 1) / 2, 0.95,
                                 1 - 0.1 * (cos(M_PI * 99 / 100) + 1) / 2};
  for (int k = 0; k < 4; k++) {
    f->batch.global_step = steps[k];
    step_loss(f);
    for (size_t i = 0; i < f->ps.count; i++) f->ps.data[i] -= 0.05f * f->ps.grad[i];
    memcpy(before, target, sizeof(float) * n);
    f->def->after_update(f->obj, &f->batch, &f->rec);
    float tau = ema_momentum_at(0.9f, "cosine", steps[k], TOTAL_STEPS);
    assert_float_equal(tau, tau_expected[k], 1e-6);
    double diff2 = 0, norm2 = 0;
    for (int e = 0; e < f->ps.n_entries; e++) {
      const ParamEntry *pe = &f->ps.entries[e];
      if (pe->offset >= n) continue;  // the predictor has no target
      for (size_t i = pe->offset; i < pe->offset + pe->count; i++) {
        if (pe->is_buffer) {
          assert_float_equal(target[i], before[i], 0);
          continue;
        }
        assert_float_equal(target[i], tau * before[i] + (1 - tau) * f->ps.data[i], 1e-7);
        diff2 += ((double)target[i] - f->ps.data[i]) * ((double)target[i] - f->ps.data[i]);
        norm2 += (double)f->ps.data[i] * f->ps.data[i];
      }
    }
    assert_true(diff2 > 0);
    assert_float_equal(ledger_value(&f->rec, "momentum_distance"), sqrt(diff2 / norm2), 1e-9);
  }
  // --init: the target starts again from the online network.
  f->def->params_loaded(f->obj);
  assert_memory_equal(target, f->ps.data, sizeof(float) * n);
  free(before);
  st_free(&target_state);
  fixture_free(f);
}

// ---- through the binary ----

// A slice of Fashion-MNIST in batches of 32: 8 steps an epoch.
static const char *small =
    "--objective=byol --set train.batch_size=32 --set data.limit=256 --set data.test_limit=128";

// The ledger's answers for BYOL (its views are test_ledger's, held to the FLOPs the encoders
// counted): one positive and no negatives, the target's parameters held (encoder + projector: no
// predictor, no gradient, no optimizer state), no encodings reused. Also with two uneven replicas,
// and `tally report` reads the run. The target's drift is measured only: null in the plan, above 0
// in the run.
static void test_plan_equals_run(void **state) {
  (void)state;
  Config c;
  config_defaults(&c);
  if (config_load_model(&c, "models/resnet-small.ini") != 0) fail_msg("%s", tl_last_error());
  const size_t target_floats = backbone_with_head_floats(&c);
  const size_t predictor_floats =
      head_floats((size_t)c.model.head_out_dim, 256, (size_t)c.model.head_out_dim);
  const LedgerOwnFields *own = objective_ledger_fields("byol");
  assert_int_equal(own->n, 1);
  assert_string_equal(own->field[0].name, "momentum_distance");
  assert_true(own->field[0].measured_only);
  LedgerRecord r = plan_equals_run("one", small, "");
  assert_true(ledger_value(&r, "momentum_distance") > 0);
  assert_int_equal(r.images_source, 32);
  assert_int_equal(r.positives_per_query, 1);
  assert_int_equal(r.negatives_per_query, 0);
  assert_int_equal(r.encodings_next_reused, 0);
  assert_int_equal(r.momentum_encoder_bytes, sizeof(float) * target_floats);
  assert_int_equal(r.param_bytes, sizeof(float) * (target_floats + predictor_floats));
  assert_int_equal(r.queue_bytes, 0);
  r = plan_equals_run("two", small,
                      "--set parallel.replicas=2 --set parallel.shard_weights=1,3 --no-knn");
  assert_true(ledger_value(&r, "momentum_distance") > 0);
  assert_int_equal(r.shard_samples, 8);  // rank 0's quarter of 32
  assert_int_equal(
      sh("%s report %s/one --out %s/report.html > /dev/null 2>&1", bin, tmpdir, tmpdir), 0);
  assert_int_equal(sh("grep -q byol %s/report.html", tmpdir), 0);
}

// The paper's asymmetric pair: two view groups of one view each, at the same size, that split the
// step's views, FLOPs and activations in halves (one forward of both through each network); as
// planned. The first view is always blurred, the second sometimes solarized: their pixels differ
// from the symmetric recipe's.
static void test_asymmetric_views(void **state) {
  (void)state;
  Config c;
  config_defaults(&c);
  assert_int_equal(config_set(&c, "byol.asymmetric=1"), 0);
  AugmentParams base = {.out_size = 28, .blur_prob = 0.5f, .solarize_prob = 0.5f};
  const ViewRecipe v = objective_views(objective_find("byol"), &c, &base);
  assert_int_equal(v.n_groups, 2);
  assert_true(v.group[0].count == 1 && v.group[1].count == 1);
  assert_true(v.group[0].aug.blur_prob == 1.0f && v.group[0].aug.solarize_prob == 0.0f);
  assert_true(v.group[1].aug.blur_prob == 0.1f && v.group[1].aug.solarize_prob == 0.2f);
  LedgerRecord r = plan_equals_run("asym", small, "--set byol.asymmetric=1 --no-knn");
  assert_int_equal(r.view_groups, 2);
  for (int g = 0; g < 2; g++) {
    assert_int_equal(r.view_group[g].size, 28);
  }
  // Each group is 32 views through the online and the target network: what a symmetric step at
  // batch 16 (2 x 16 views) costs its encoders, planned separately.
  char *half = run_ok(
      "%s plan %s --set train.batch_size=16 --set byol.asymmetric=0 --step 0 --json", bin, small);
  double fwd = 0, bwd = 0;
  assert_int_equal(json_get(half, "flops_forward_encoder", &fwd), 1);
  assert_int_equal(json_get(half, "flops_backward_encoder", &bwd), 1);
  free(half);
  for (int g = 0; g < 2; g++) {
    assert_float_equal(r.view_group[g].flops_forward, fwd, 1e-6 * fwd);
    assert_float_equal(r.view_group[g].flops_backward, bwd, 1e-6 * bwd);
  }
  LedgerRecord sym = plan_equals_run("sym", small, "--set byol.asymmetric=0 --no-knn");
  assert_int_equal(sym.view_groups, 1);
  assert_int_equal(sym.view_group[0].count, 2);
  // Same FLOPs, other pixels: the losses part.
  assert_true(sym.flops_forward == r.flops_forward && sym.loss != r.loss);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("byol") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_matches_pytorch),
      cmocka_unit_test(test_counts_and_target_shape),
      cmocka_unit_test(test_target_follows_momentum_rule),
      cmocka_unit_test(test_plan_equals_run),
      cmocka_unit_test(test_asymmetric_views),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
