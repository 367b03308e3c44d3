// byol: Bootstrap Your Own Latent (Grill et al. 2020). Both views go through the online encoder,
// projector and predictor with backward; both go through the target — an EMA copy of encoder and
// projector, no predictor — forward only, holding nothing for backward. Each view's prediction
// regresses onto the target's projection of the other view: no negatives at all, and nothing
// cached but the target's weights, so every step encodes 4b views anew (2b of them without
// gradient).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/head.h"
#include "objectives/byol_loss.h"
#include "objectives/objective.h"
#include "objectives/teacher.h"

extern const ObjectiveDef objective_byol;

// [byol]
typedef struct {
  float momentum;              // 0.99: the target's EMA coefficient τ at step 0
  char momentum_schedule[16];  // cosine (tau rises to 1 over the run, as the paper) | constant
  int predictor_hidden_dim;    // 256: the predictor maps out -> hidden -> out
  int asymmetric;              // 1: the paper's two augmentations, one per view
} ByolSettings;

// The paper's tau = 0.996 is for runs of 300-1000 epochs: over one epoch of ~234 steps its
// memory (1 / (1 - tau) = 250 steps) is longer than the run, and the target would stay near its
// random start. 0.99 remembers ~100 steps, well inside a short run.
static const KeySpec byol_keys[] = {
    FLOAT_KEY(OWN(ByolSettings, byol, momentum), "0.99", 0, 1, 0,
              "the target's EMA coefficient τ at step 0"),
    TEXT_KEY(OWN(ByolSettings, byol, momentum_schedule), "cosine", "constant|cosine",
             "`cosine`: τ rises from `momentum` to 1 over the run (as the paper), or "
             "`constant`"),
    INT_KEY(OWN(ByolSettings, byol, predictor_hidden_dim), "256", 1, 65536,
            "the predictor's hidden width (it maps head_out_dim → hidden → head_out_dim)"),
    BOOL_KEY(OWN(ByolSettings, byol, asymmetric), "0",
             "1: the paper's asymmetric pair, two view groups of one view: the first always "
             "blurred and never solarized, the second blurred with probability 0.1 and solarized "
             "with 0.2 (overriding augment.blur_prob and solarize_prob); 0: both views the "
             "recipe's [augment]"),
};
static const ConfigSection byol_settings = CONFIG_SECTION(byol_keys, ByolSettings, NULL);

static const ByolSettings *settings(const Config *cfg) {
  return objective_settings(cfg, &objective_byol);
}

typedef struct {
  Objective base;
  int b;                      // samples on this replica; rows = 2b views
  ProjectionHead projector;   // online: feature -> hidden -> d
  ProjectionHead predictor;   // online: d -> predictor_hidden -> d
  MomentumTeacher target;     // EMA of the online backbone + projector
  Backbone *target_backbone;  // OP_FORWARD: batch statistics, nothing kept
  ProjectionHead target_projector;
  ByolLoss loss;
  float *dp;                 // (2b, d) MEM_ACT_GRAD
  size_t encoder_act_bytes;  // the online backbone's activations (both views')
} Byol;

static Objective *byol_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  Byol *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  const int rows = 2 * o->b, d = cfg->model.head_out_dim;

  Builder online = {
      .ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  const long long act0 = tl_mem_thread_net(MEM_ACT, COMP_ENCODER);
  o->base.online = objective_encoder(env, &online, rows, &o->projector, "head");
  o->encoder_act_bytes = (size_t)(tl_mem_thread_net(MEM_ACT, COMP_ENCODER) - act0);
  // Online parameters: backbone, projector ("head", as every objective's), then the predictor;
  // the target mirrors the part before the predictor, the online parameters handed out by now.
  // It starts as an exact copy of them and then only follows the momentum rule.
  const ByolSettings *set = settings(cfg);
  Builder target = momentum_teacher_begin(&o->target, env, set->momentum, set->momentum_schedule);
  head_init(&o->predictor, &online, "predictor", rows, d, settings(cfg)->predictor_hidden_dim, d);

  o->target_backbone = objective_encoder(env, &target, rows, &o->target_projector, "head");
  momentum_teacher_ready(&o->target, env);

  byol_loss_init(&o->loss, &online, rows, d);
  o->dp = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

// Two views of the recipe's augmentation, or with `asymmetric` the paper's pair: two groups of one
// view at the same size, so the batch still holds view 0 then view 1 of every sample.
static void byol_views(const Config *cfg, const AugmentParams *base, ViewRecipe *out) {
  if (!settings(cfg)->asymmetric) {
    *out = view_recipe_single(base, 2);
    return;
  }
  out->n_groups = 2;
  out->group[0] = (ViewGroup){.count = 1, .aug = *base};
  out->group[0].aug.blur_prob = 1.0f;
  out->group[0].aug.solarize_prob = 0.0f;
  out->group[1] = (ViewGroup){.count = 1, .aug = *base};
  out->group[1].aug.blur_prob = 0.1f;
  out->group[1].aug.solarize_prob = 0.2f;
}

static ObjectiveLoss byol_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Byol *o = (Byol *)base;
  ExecCtx *ctx = base->env.ctx;
  const int b = o->b;
  TL_ASSERT(batch->n == b && batch->n_views == 2);

  // The batch is view-major, so views 0 and 1 of all samples form one 2b-image forward, for the
  // target as for the online network.
  o->target_backbone->forward(o->target_backbone, ctx, batch->views);
  head_forward(&o->target_projector, ctx, o->target_backbone->feature);
  base->online->forward(base->online, ctx, batch->views);
  head_forward(&o->projector, ctx, base->online->feature);
  head_forward(&o->predictor, ctx, o->projector.out);
  // The loss is a sum of per-sample terms with no coupling across replicas (no negatives, no
  // gather), so the gradient of this replica's mean, averaged over replicas weighted by sample
  // count (the trainer's allreduce), is exactly the gradient of the global mean. (BatchNorm
  // statistics are per replica, as in every objective here.)
  double loss_sum = byol_loss_forward_backward(&o->loss, ctx, o->predictor.out,
                                               o->target_projector.out, b, o->dp);
  objective_backward_begins(base);
  head_backward(&o->predictor, ctx, o->dp);
  head_backward(&o->projector, ctx, o->predictor.din);
  base->online->backward(base->online, ctx, o->projector.din);

  rec->views_grad = 2L * b;
  rec->views_nograd = 2L * b;
  rec->negatives_per_query = 0;
  rec->positives_per_query = 1;
  rec->encodings_next_new = 4L * b;
  rec->encodings_next_reused = 0;
  if (batch->n_groups == 2) {
    // One forward of both groups' 2b views through each network: the second group's half of the
    // encoders' FLOPs and activations (the batch is the same size in both).
    rec->view_groups = 2;
    rec->view_group[0].views_grad = rec->view_group[0].views_nograd = b;
    rec->view_group[1] = (LedgerViewGroup){.views_grad = b,
                                           .views_nograd = b,
                                           .flops_forward = ctx->flops_forward[COMP_ENCODER] / 2,
                                           .flops_backward = ctx->flops_backward[COMP_ENCODER] / 2,
                                           .activation_bytes = o->encoder_act_bytes / 2};
  }
  return (ObjectiveLoss){loss_sum, b};
}

static void byol_after_update(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Byol *o = (Byol *)base;
  momentum_teacher_update(&o->target, &base->env, batch->global_step, &rec->own[0]);
}

static void byol_destroy(Objective *base) {
  Byol *o = (Byol *)base;
  base->online->destroy(base->online);
  head_destroy(&o->projector);
  head_destroy(&o->predictor);
  o->target_backbone->destroy(o->target_backbone);
  head_destroy(&o->target_projector);
  momentum_teacher_destroy(&o->target);
  byol_loss_destroy(&o->loss);
  tl_free(o->dp);
  free(o);
}

// The momentum schedule is a function of the step the batch carries, so the target's weights
// (with its own BatchNorm statistics) are all a resumed run needs.
static void byol_state(Objective *base, StFile *s) {
  momentum_teacher_state(&((Byol *)base)->target, s, "byol.target.");
}

static void byol_params_loaded(Objective *base) {
  Byol *o = (Byol *)base;
  momentum_teacher_restart(&o->target, base->env.params);
}

const ObjectiveDef objective_byol = {
    .name = "byol",
    .settings = &byol_settings,
    .ledger_fields = &momentum_teacher_fields,  // the target's drift
    .description = "BYOL: predictor regresses onto an EMA target's projection, no negatives",
    .n_views = 2,
    .views = byol_views,
    .create = byol_create,
    .step = byol_step,
    .after_update = byol_after_update,
    .destroy = byol_destroy,
    .state = byol_state,
    .params_loaded = byol_params_loaded,
};
