// dino: self-distillation with no labels (Caron et al. 2021) on multi-crop views. Each image
// gives two global crops (data.image_size) and `local_crops` small ones (`local_size`): the
// student encodes all of them — the small ones through a second instance of the same backbone,
// at their own size, whose gradients add into the same weights — and the teacher, an EMA copy of
// the student, encodes the two global crops only, without gradient. Both end in a head: an MLP,
// an L2 normalization and a weight-normalized last layer (weights divided by their row norms;
// DINO's norm_last_layer). The teacher's outputs, centred (an EMA of their batch mean, kept in
// the checkpoint) and sharpened (a temperature below the student's, warmed up), are the targets
// of the student's outputs for every other crop (dino_loss.h).
//
// Here the MLP has two layers (Linear, GELU, Linear to head_out_dim) unless `head_layers` asks
// for DINO's three, and no normalization between them, as DINO's (`head_bn` puts the other
// heads' BatchNorm there); the last layer is not frozen in the first epoch.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/head.h"
#include "objectives/dino_loss.h"
#include "objectives/multicrop_encoder.h"
#include "objectives/objective.h"
#include "objectives/prototypes.h"
#include "objectives/teacher.h"

extern const ObjectiveDef objective_dino;

// [dino]
typedef struct {
  int local_crops;              // small crops per image (the paper: 8 with ViT-S, 6 in its tables)
  int local_size;               // their side in pixels (the paper: 96 of 224)
  float global_crop_scale_min;  // global crops: [this, augment.crop_scale_max] of the image area
  float local_crop_scale_min;   // local crops: [this, global_crop_scale_min]
  int out_dim;                  // outputs of the last layer, the prototypes the softmax is over
  float student_temp, teacher_temp, warmup_teacher_temp;
  float teacher_temp_warmup;  // share of the run over which tau_t rises to teacher_temp
  float center_momentum;
  float momentum;              // the teacher's EMA coefficient at step 0
  char momentum_schedule[16];  // cosine (rises to 1 over the run, as the paper) | constant
  int head_bn;                 // BatchNorm + ReLU in the head's hidden layers, else GELU alone
  int head_layers;             // the MLP's linear layers (the paper's nlayers)
} DinoSettings;

// The paper's defaults, but for the teacher's momentum (0.996 is for 100+ epochs; its memory of
// 250 steps outlasts a short run: 0.99, as byol), the local crops' side (96/224 of 28 is 12) and
// the output dimension (65536 prototypes for ImageNet; 1024 for ten classes of 60,000 images).
static const KeySpec dino_keys[] = {
    MULTICROP_KEYS(DinoSettings, dino, "6", "12", "0.4", "0.05"),
    INT_KEY(OWN(DinoSettings, dino, out_dim), "1024", 2, 65536,
            "outputs of the head's weight-normalized last layer (the prototypes)"),
    FLOAT_KEY(OWN(DinoSettings, dino, student_temp), "0.1", 0, 100, 1, "the student's temperature"),
    FLOAT_KEY(OWN(DinoSettings, dino, teacher_temp), "0.07", 0, 100, 1,
              "the teacher's temperature after its warm-up (sharper than the student's)"),
    FLOAT_KEY(OWN(DinoSettings, dino, warmup_teacher_temp), "0.04", 0, 100, 1,
              "the teacher's temperature at step 0"),
    FLOAT_KEY(OWN(DinoSettings, dino, teacher_temp_warmup), "0.3", 0, 1, 0,
              "share of the run over which the teacher's temperature rises linearly"),
    FLOAT_KEY(OWN(DinoSettings, dino, center_momentum), "0.9", 0, 1, 0,
              "EMA coefficient of the centre (the teacher outputs' mean) the targets subtract"),
    FLOAT_KEY(OWN(DinoSettings, dino, momentum), "0.99", 0, 1, 0,
              "the teacher's EMA coefficient at step 0"),
    TEXT_KEY(OWN(DinoSettings, dino, momentum_schedule), "cosine", "constant|cosine",
             "`cosine`: the teacher's coefficient rises to 1 over the run, or `constant`"),
    INT_KEY(OWN(DinoSettings, dino, head_bn), "0", 0, 1,
            "1: BatchNorm + ReLU in the head's hidden layers, as the other objectives' heads "
            "(the paper's use_bn_in_head); 0: GELU alone, as the paper's default"),
    INT_KEY(OWN(DinoSettings, dino, head_layers), "2", 2, HEAD_MAX_LAYERS,
            "the head's linear layers before its L2 normalization (the paper's nlayers, 3): "
            "model.head_hidden_dim wide, the last to model.head_out_dim"),
};
static const ConfigSection dino_settings = CONFIG_SECTION(dino_keys, DinoSettings, NULL);

static const DinoSettings *settings(const Config *cfg) {
  return objective_settings(cfg, &objective_dino);
}

enum { GLOBAL_CROPS = MULTICROP_GLOBAL };
// The last layer's weights in checkpoints and exports (the paper's head.last_layer).
static const char LAST_LAYER[] = "dino.last_layer.weight";

static MultiCrop multicrop(const DinoSettings *set) {
  return (MultiCrop){set->local_crops, set->local_size, set->global_crop_scale_min,
                     set->local_crop_scale_min};
}

// Two global crops at data.image_size, then the local ones at their side and smaller scales.
static void dino_views(const Config *cfg, const AugmentParams *base, ViewRecipe *out) {
  const MultiCrop m = multicrop(settings(cfg));
  multicrop_views(&m, base, out);
}

typedef struct {
  Objective base;            // base.online: the student's backbone on the global crops (2b images)
  int b, local_crops, rows;  // samples on this replica; rows = (2 + local_crops) b student crops
  MultiCropEncoder student;  // features (rows, D) of every crop, global crops first
  ProjectionHead head;       // the student's MLP over every crop
  Prototypes last;           // the head's weight-normalized last layer
  MomentumTeacher teacher;   // EMA of every student parameter
  Backbone *teacher_net;     // OP_FORWARD on the global crops: batch statistics, nothing kept
  ProjectionHead teacher_head;
  Prototypes teacher_last;
  float *center;        // (K) the teacher outputs' running mean, MEM_MOMENTUM (checkpointed)
  float *batch_center;  // (K) this step's mean over every replica's teacher rows
  DinoLoss loss;
  float *dlogits;  // (rows, K) MEM_ACT_GRAD loss
} Dino;

static Objective *dino_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const DinoSettings *set = settings(cfg);
  const MultiCrop m = multicrop(set);
  if (!multicrop_check(&m, cfg, "dino")) return NULL;
  Dino *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  o->local_crops = set->local_crops;
  o->rows = (GLOBAL_CROPS + set->local_crops) * o->b;
  const int global_rows = GLOBAL_CROPS * o->b, local_rows = o->rows - global_rows;
  const int hidden = cfg->model.head_hidden_dim, bottleneck = cfg->model.head_out_dim;
  const int K = set->out_dim;

  // The student: one backbone at each crop size over the same weights, one head over all crops.
  Builder student = {
      .ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  o->base.online =
      multicrop_encoder_init(&o->student, env, &student, global_rows, local_rows, set->local_size);
  const int D = o->base.online->feature_dim;
  const HeadActivation head_activation = set->head_bn ? HEAD_BN_RELU : HEAD_GELU;
  head_init_with(&o->head, &student, "head", o->rows, D, hidden, bottleneck, set->head_layers,
                 head_activation);
  prototypes_init(&o->last, env->ctx, env->params, LAST_LAYER, o->rows, bottleneck, K, 1);

  // The teacher starts as an exact copy of every student parameter, taken in the same order.
  Builder teacher = momentum_teacher_begin(&o->teacher, env, set->momentum, set->momentum_schedule);
  o->teacher_net = objective_encoder(env, &teacher, global_rows, NULL, NULL);
  head_init_with(&o->teacher_head, &teacher, "head", global_rows, D, hidden, bottleneck,
                 set->head_layers, head_activation);
  prototypes_init(&o->teacher_last, env->ctx, &o->teacher.params, LAST_LAYER, global_rows,
                  bottleneck, K, 0);
  momentum_teacher_ready(&o->teacher, env);

  o->center = tl_alloc(sizeof(float) * (size_t)K, MEM_MOMENTUM, COMP_LOSS);
  o->batch_center = tl_alloc(sizeof(float) * (size_t)K, MEM_WORKSPACE, COMP_LOSS);
  dino_loss_init(&o->loss, env->ctx, o->b, GLOBAL_CROPS, GLOBAL_CROPS + set->local_crops, K);
  o->dlogits = tl_alloc(sizeof(float) * (size_t)o->rows * K, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

// The teacher's temperature at `step`: warmup_teacher_temp rising linearly to teacher_temp over
// the first teacher_temp_warmup of the run.
static float teacher_temp_at(const DinoSettings *set, long step, long total_steps) {
  const double warmup = set->teacher_temp_warmup * (double)total_steps;
  if (!(warmup > 0) || step >= warmup) return set->teacher_temp;
  return (float)(set->warmup_teacher_temp +
                 (set->teacher_temp - set->warmup_teacher_temp) * (double)step / warmup);
}

static ObjectiveLoss dino_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Dino *o = (Dino *)base;
  ExecCtx *ctx = base->env.ctx;
  const DinoSettings *set = settings(base->env.cfg);
  const int b = o->b, global_rows = GLOBAL_CROPS * b;
  TL_ASSERT(batch->n == b && batch->group[0].count == GLOBAL_CROPS);

  o->teacher_net->forward(o->teacher_net, ctx, batch->group[0].views);
  head_forward(&o->teacher_head, ctx, o->teacher_net->feature);
  prototypes_forward(&o->teacher_last, ctx, o->teacher_head.out);

  multicrop_encoder_forward(&o->student, ctx, batch);
  head_forward(&o->head, ctx, o->student.features);
  prototypes_forward(&o->last, ctx, o->head.out);
  // Per-sample terms with no coupling across replicas but the centre (a constant here), so the
  // gradient of this replica's mean, averaged over replicas by sample count, is the global one.
  const float tau_t = teacher_temp_at(set, batch->global_step, base->env.total_steps);
  double loss_sum =
      dino_loss_forward_backward(&o->loss, ctx, o->last.logits, o->teacher_last.logits, o->center,
                                 set->student_temp, tau_t, b, o->dlogits);
  objective_backward_begins(base);
  prototypes_backward(&o->last, ctx, base->env.params, o->dlogits);
  head_backward(&o->head, ctx, o->last.z_unit.din);
  multicrop_encoder_backward(&o->student, ctx, o->head.din);

  rec->views_grad = o->rows;
  rec->views_nograd = global_rows;
  rec->negatives_per_query = 0;
  rec->positives_per_query = GLOBAL_CROPS;
  rec->encodings_next_new = o->rows + global_rows;
  rec->encodings_next_reused = 0;
  // Global crops: the student's and the teacher's; local crops: the student's only.
  multicrop_encoder_ledger(&o->student, rec);
  rec->view_group[0].views_nograd = global_rows;
  return (ObjectiveLoss){loss_sum, b};
}

// After the update, as after DINOLoss's forward: the centre follows the mean of this step's
// teacher outputs over every replica's global crops (a step's loss uses the centre before it).
static void dino_after_update(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Dino *o = (Dino *)base;
  ExecCtx *ctx = base->env.ctx;
  const DinoSettings *set = settings(base->env.cfg);
  const int global_rows = GLOBAL_CROPS * o->b, K = o->last.K;
  if (!ctx->dry_run)
    for (int k = 0; k < K; k++) {
      double sum = 0;
      for (int r = 0; r < global_rows; r++) sum += o->teacher_last.logits[(size_t)r * K + k];
      o->batch_center[k] = (float)(sum / global_rows);
    }
  comm_allreduce_weighted(base->env.comm, o->batch_center, (size_t)K, global_rows);
  if (!ctx->dry_run)
    for (int k = 0; k < K; k++)
      o->center[k] =
          set->center_momentum * o->center[k] + (1 - set->center_momentum) * o->batch_center[k];
  ctx->flops_forward[COMP_LOSS] += 3.0 * global_rows * K;
  momentum_teacher_update(&o->teacher, &base->env, batch->global_step, &rec->own[0]);
}

static void dino_destroy(Objective *base) {
  Dino *o = (Dino *)base;
  multicrop_encoder_destroy(&o->student);
  head_destroy(&o->head);
  prototypes_destroy(&o->last);
  o->teacher_net->destroy(o->teacher_net);
  head_destroy(&o->teacher_head);
  prototypes_destroy(&o->teacher_last);
  momentum_teacher_destroy(&o->teacher);
  dino_loss_destroy(&o->loss);
  float *bufs[] = {o->center, o->batch_center, o->dlogits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tl_free(bufs[i]);
  free(o);
}

// The schedules are functions of the step the batch carries: the teacher's weights (with its
// BatchNorm statistics) and the centre are all a resumed run needs.
static void dino_state(Objective *base, StFile *s) {
  Dino *o = (Dino *)base;
  momentum_teacher_state(&o->teacher, s, "dino.teacher.");
  int64_t K = o->last.K;
  st_add(s, "dino.center", ST_F32, 1, &K, o->center);
}

static void dino_params_loaded(Objective *base) {
  Dino *o = (Dino *)base;
  momentum_teacher_restart(&o->teacher, base->env.params);
}

const ObjectiveDef objective_dino = {
    .name = "dino",
    .settings = &dino_settings,
    .ledger_fields = &momentum_teacher_fields,  // the teacher's drift
    .description =
        "DINO: a student over global and local crops matches an EMA teacher's "
        "centred, sharpened outputs on the global ones",
    .n_views = GLOBAL_CROPS,
    .views = dino_views,
    .create = dino_create,
    .step = dino_step,
    .after_update = dino_after_update,
    .destroy = dino_destroy,
    .state = dino_state,
    .params_loaded = dino_params_loaded,
};
