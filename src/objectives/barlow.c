// barlow: Barlow Twins (Zbontar, Jing, Misra, LeCun & Deny 2021). Both views of every image go
// through the online encoder and a projector with backward; nothing is compared against other
// images. The loss drives the cross-correlation matrix between the two views' standardized
// embeddings, a statistic of the global batch gathered from all replicas, towards the identity:
// each dimension agrees across views (diagonal 1) and carries what no other dimension does
// (off-diagonal 0). No negatives, no momentum encoder, nothing kept between steps.
//
// The projector is the paper's shape, three linear layers with BatchNorm + ReLU between them, at
// the widths [model] head_hidden_dim (both hidden layers) and head_out_dim: the paper's are 8192
// on a 2048-wide ResNet-50 feature, configs/barlow.ini scales them to this encoder.
#include <stdlib.h>

#include "nn/head.h"
#include "objectives/barlow_loss.h"
#include "objectives/objective.h"
#include "objectives/two_view_step.h"

extern const ObjectiveDef objective_barlow;

enum { PROJECTOR_LAYERS = 3 };

// [barlow]
typedef struct {
  float lambda;  // 0.0051: the off-diagonal term's weight
} BarlowSettings;

static const KeySpec barlow_keys[] = {
    FLOAT_KEY(OWN(BarlowSettings, barlow, lambda), "0.0051", 0, 1e3, 0,
              "λ, the weight of the redundancy-reduction term (squared off-diagonal entries of "
              "the two views' cross-correlation over the global batch) against the invariance "
              "term (its diagonal pulled to 1); the paper's 0.0051 is for 8192 dimensions"),
};
static const ConfigSection barlow_settings = CONFIG_SECTION(barlow_keys, BarlowSettings, NULL);

typedef struct {
  Objective base;
  int b;  // samples on this replica; rows = 2b views
  ProjectionHead projector;
  BarlowLoss loss;
  float *dz;  // (2b, d) MEM_ACT_GRAD loss
} Barlow;

static Objective *barlow_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const BarlowSettings *set = objective_settings(cfg, &objective_barlow);
  // A standard deviation over one sample is undefined.
  if (!two_view_batch_ok(env, "standardizing its embeddings needs")) return NULL;
  Barlow *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  const int rows = 2 * o->b, d = cfg->model.head_out_dim;
  Builder bld = {.ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  o->base.online = objective_encoder(env, &bld, rows, NULL, NULL);
  // Named "head" like every objective's projection head, so export --with-head and --init take it.
  head_init_with(&o->projector, &bld, "head", rows, o->base.online->feature_dim,
                 cfg->model.head_hidden_dim, d, PROJECTOR_LAYERS, HEAD_BN_RELU);
  barlow_loss_init(&o->loss, env->ctx, env->global_batch, o->b, d, set->lambda);
  o->dz = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

static double global_loss(void *loss, ExecCtx *ctx, Comm *comm, const float *z, float *dz) {
  return barlow_loss_forward_backward(loss, ctx, comm, z, dz, NULL);
}

static ObjectiveLoss barlow_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Barlow *o = (Barlow *)base;
  TL_ASSERT(batch->n == o->b);
  return two_view_step(base, &o->projector, global_loss, &o->loss, o->dz, batch, rec);
}

static void barlow_destroy(Objective *base) {
  Barlow *o = (Barlow *)base;
  base->online->destroy(base->online);
  head_destroy(&o->projector);
  barlow_loss_destroy(&o->loss);
  tl_free(o->dz);
  free(o);
}

const ObjectiveDef objective_barlow = {
    .name = "barlow",
    .settings = &barlow_settings,
    .description = "Barlow Twins: cross-correlation of the two views pulled to the identity",
    .n_views = 2,
    .create = barlow_create,
    .step = barlow_step,
    .after_update = NULL,
    .destroy = barlow_destroy,
};
