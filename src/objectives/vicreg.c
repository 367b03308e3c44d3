// vicreg: VICReg (Bardes, Ponce & LeCun 2022). Both views of every image go through the online
// encoder and an expander with backward; nothing is compared against other images. Instead the
// loss keeps the two views' embeddings close (invariance) while every embedding dimension keeps
// a standard deviation of at least 1 over the batch (variance) and the dimensions stay
// decorrelated (covariance), statistics of the global batch gathered from all replicas. No
// negatives, no momentum encoder, nothing kept between steps.
//
// The expander is the project's projection head (Linear -> BatchNorm + ReLU -> Linear, widths
// [model] head_hidden_dim and head_out_dim): the paper's is three 8192-wide layers on a
// 2048-wide ResNet-50 feature, configs/vicreg.ini scales it to this encoder.
#include <stdlib.h>

#include "nn/head.h"
#include "objectives/objective.h"
#include "objectives/two_view_step.h"
#include "objectives/vicreg_loss.h"

extern const ObjectiveDef objective_vicreg;

// [vicreg]
typedef struct {
  float sim_coeff;  // 25: lambda, the invariance term's weight
  float std_coeff;  // 25: mu, the variance term's weight
  float cov_coeff;  // 1: nu, the covariance term's weight
} VicRegSettings;

static const KeySpec vicreg_keys[] = {
    FLOAT_KEY(OWN(VicRegSettings, vicreg, sim_coeff), "25", 0, 1e6, 0,
              "λ, the weight of the invariance term (mean squared difference of the two "
              "views' embeddings)"),
    FLOAT_KEY(OWN(VicRegSettings, vicreg, std_coeff), "25", 0, 1e6, 0,
              "μ, the weight of the variance term (a hinge keeping each dimension's standard "
              "deviation over the global batch at least 1)"),
    FLOAT_KEY(OWN(VicRegSettings, vicreg, cov_coeff), "1", 0, 1e6, 0,
              "ν, the weight of the covariance term (squared off-diagonal covariances over "
              "the global batch)"),
};
static const ConfigSection vicreg_settings = CONFIG_SECTION(vicreg_keys, VicRegSettings, NULL);

typedef struct {
  Objective base;
  int b;  // samples on this replica; rows = 2b views
  ProjectionHead expander;
  VicRegLoss loss;
  float *dz;  // (2b, d) MEM_ACT_GRAD loss
} VicReg;

static Objective *vicreg_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const VicRegSettings *set = objective_settings(cfg, &objective_vicreg);
  // A standard deviation and a covariance over one sample are undefined.
  if (!two_view_batch_ok(env, "its variance and covariance need")) return NULL;
  VicReg *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  const int rows = 2 * o->b, d = cfg->model.head_out_dim;
  Builder bld = {.ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  // Named "head" like every objective's projection head, so export --with-head and --init take it.
  o->base.online = objective_encoder(env, &bld, rows, &o->expander, "head");
  vicreg_loss_init(&o->loss, env->ctx, env->global_batch, o->b, d, set->sim_coeff, set->std_coeff,
                   set->cov_coeff);
  o->dz = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

static double global_loss(void *loss, ExecCtx *ctx, Comm *comm, const float *z, float *dz) {
  return vicreg_loss_forward_backward(loss, ctx, comm, z, dz, NULL);
}

static ObjectiveLoss vicreg_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  VicReg *o = (VicReg *)base;
  TL_ASSERT(batch->n == o->b);
  return two_view_step(base, &o->expander, global_loss, &o->loss, o->dz, batch, rec);
}

static void vicreg_destroy(Objective *base) {
  VicReg *o = (VicReg *)base;
  base->online->destroy(base->online);
  head_destroy(&o->expander);
  vicreg_loss_destroy(&o->loss);
  tl_free(o->dz);
  free(o);
}

const ObjectiveDef objective_vicreg = {
    .name = "vicreg",
    .settings = &vicreg_settings,
    .description = "VICReg: invariance, variance and covariance terms; no negatives",
    .n_views = 2,
    .create = vicreg_create,
    .step = vicreg_step,
    .after_update = NULL,
    .destroy = vicreg_destroy,
};
