// swav: Swapping Assignments between Views (Caron, Misra, Mairal, Goyal, Bojanowski & Joulin
// 2020) on multi-crop views. Every crop of an image — two global ones (data.image_size) and
// `local_crops` small ones (`local_size`, through a second instance of the same backbone) — goes
// through the online encoder, a projection head and the prototypes: K vectors the embeddings are
// compared to by cosine (a weight-normalized layer, objectives/prototypes.h). Each global crop's
// scores are turned into codes, a soft assignment of the samples to the prototypes that spreads
// the global batch evenly over them (Sinkhorn-Knopp, sums across replicas), and every other crop
// must predict those codes from its own scores (swav_loss.h). No negatives, no momentum encoder,
// no queue (the paper's queue, for batches smaller than the prototypes, is left out): nothing is
// kept between steps.
//
// The prototypes' gradient is dropped for the first freeze_prototypes_niters steps, as the
// paper's: the head first learns to place embeddings among random prototypes before they move.
#include <stdlib.h>

#include "nn/head.h"
#include "objectives/multicrop_encoder.h"
#include "objectives/objective.h"
#include "objectives/prototypes.h"
#include "objectives/swav_loss.h"

extern const ObjectiveDef objective_swav;

// [swav]
typedef struct {
  int local_crops, local_size;
  float global_crop_scale_min, local_crop_scale_min;
  int prototypes;  // K
  float temperature, epsilon;
  int sinkhorn_iterations;
  int freeze_prototypes_niters;
} SwavSettings;

// The paper's defaults, but for the crops (its 224 and 96 px; 12 of 28 here, as dino) and the
// prototypes (3000 for ImageNet; 100 for ten classes and a batch of 256, which spreads the batch
// over them without the queue) and the frozen steps (313, the first ImageNet epoch at batch 4096).
static const KeySpec swav_keys[] = {
    MULTICROP_KEYS(SwavSettings, swav, "6", "12", "0.14", "0.05"),
    INT_KEY(OWN(SwavSettings, swav, prototypes), "100", 2, 65536,
            "K, the prototype vectors the codes assign each sample to"),
    FLOAT_KEY(OWN(SwavSettings, swav, temperature), "0.1", 0, 100, 1,
              "the temperature of the predictions' softmax over the prototypes"),
    FLOAT_KEY(OWN(SwavSettings, swav, epsilon), "0.05", 0, 1e6, 1,
              "Sinkhorn-Knopp's regularization: codes from exp(scores / epsilon)"),
    INT_KEY(OWN(SwavSettings, swav, sinkhorn_iterations), "3", 1, 100,
            "Sinkhorn-Knopp's normalization rounds over the global batch"),
    INT_KEY(OWN(SwavSettings, swav, freeze_prototypes_niters), "313", 0, 1 << 30,
            "steps at the start of the run during which the prototypes do not move"),
};
static const ConfigSection swav_settings = CONFIG_SECTION(swav_keys, SwavSettings, NULL);

static const SwavSettings *settings(const Config *cfg) {
  return objective_settings(cfg, &objective_swav);
}

enum { GLOBAL_CROPS = MULTICROP_GLOBAL };

static MultiCrop multicrop(const SwavSettings *set) {
  return (MultiCrop){set->local_crops, set->local_size, set->global_crop_scale_min,
                     set->local_crop_scale_min};
}

static void swav_views(const Config *cfg, const AugmentParams *base, ViewRecipe *out) {
  const MultiCrop m = multicrop(settings(cfg));
  multicrop_views(&m, base, out);
}

typedef struct {
  Objective base;            // base.online: the backbone on the global crops (2b images)
  int b, rows;               // samples on this replica; rows = (2 + local_crops) b crops
  MultiCropEncoder encoder;  // features (rows, D) of every crop, global crops first
  ProjectionHead head;       // over every crop
  Prototypes prototypes;     // scores (rows, K): cosines of the embeddings to the prototypes
  SwavLoss loss;
  float *dscores;  // (rows, K) MEM_ACT_GRAD loss
} Swav;

static Objective *swav_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const SwavSettings *set = settings(cfg);
  const MultiCrop m = multicrop(set);
  if (!multicrop_check(&m, cfg, "swav")) return NULL;
  Swav *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  o->rows = (GLOBAL_CROPS + set->local_crops) * o->b;
  const int global_rows = GLOBAL_CROPS * o->b, K = set->prototypes;
  const int d = cfg->model.head_out_dim;

  Builder online = {
      .ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  o->base.online = multicrop_encoder_init(&o->encoder, env, &online, global_rows,
                                          o->rows - global_rows, set->local_size);
  // Named "head" like every objective's projection head, so export --with-head and --init take it.
  head_init(&o->head, &online, "head", o->rows, o->base.online->feature_dim,
            cfg->model.head_hidden_dim, d);
  prototypes_init(&o->prototypes, env->ctx, env->params, "swav.prototypes.weight", o->rows, d, K,
                  1);
  swav_loss_init(&o->loss, env->ctx, o->b, env->global_batch, GLOBAL_CROPS,
                 GLOBAL_CROPS + set->local_crops, K, set->temperature, set->epsilon,
                 set->sinkhorn_iterations);
  o->dscores = tl_alloc(sizeof(float) * (size_t)o->rows * K, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

static ObjectiveLoss swav_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Swav *o = (Swav *)base;
  ExecCtx *ctx = base->env.ctx;
  const int b = o->b;
  TL_ASSERT(batch->n == b && batch->group[0].count == GLOBAL_CROPS);

  multicrop_encoder_forward(&o->encoder, ctx, batch);
  head_forward(&o->head, ctx, o->encoder.features);
  prototypes_forward(&o->prototypes, ctx, o->head.out);
  // The codes are the global batch's, but they carry no gradient: each sample's terms depend on
  // its own rows alone, so the gradient of this replica's mean, averaged over replicas by sample
  // count, is the global one.
  double loss_sum = swav_loss_forward_backward(&o->loss, ctx, base->env.comm, o->prototypes.logits,
                                               b, o->dscores);
  objective_backward_begins(base);
  o->prototypes.frozen = batch->global_step < settings(base->env.cfg)->freeze_prototypes_niters;
  prototypes_backward(&o->prototypes, ctx, base->env.params, o->dscores);
  head_backward(&o->head, ctx, o->prototypes.z_unit.din);
  multicrop_encoder_backward(&o->encoder, ctx, o->head.din);

  rec->views_grad = o->rows;
  rec->views_nograd = 0;
  rec->negatives_per_query = 0;             // the codes' equipartition takes the place of negatives
  rec->positives_per_query = GLOBAL_CROPS;  // the global crops whose codes a crop predicts
  rec->encodings_next_new = o->rows;
  rec->encodings_next_reused = 0;
  multicrop_encoder_ledger(&o->encoder, rec);
  return (ObjectiveLoss){loss_sum, b};
}

static void swav_destroy(Objective *base) {
  Swav *o = (Swav *)base;
  multicrop_encoder_destroy(&o->encoder);
  head_destroy(&o->head);
  prototypes_destroy(&o->prototypes);
  swav_loss_destroy(&o->loss);
  tl_free(o->dscores);
  free(o);
}

const ObjectiveDef objective_swav = {
    .name = "swav",
    .settings = &swav_settings,
    .description =
        "SwAV: every crop predicts the global crops' balanced prototype assignments "
        "(Sinkhorn-Knopp over the global batch)",
    .n_views = GLOBAL_CROPS,
    .views = swav_views,
    .create = swav_create,
    .step = swav_step,
    .destroy = swav_destroy,
};
