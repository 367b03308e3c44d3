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
#include "objectives/ema.h"
#include "ops/l2norm.h"
#include "objectives/objective.h"
#include "ops/matmul.h"
#include "io/param_tensors.h"

extern const ObjectiveDef objective_dino;

// [dino]
typedef struct {
  int local_crops;              // small crops per image (the paper: 8 with ViT-S, 6 in its tables)
  int local_size;               // their side in pixels (the paper: 96 of 224)
  int out_dim;                  // outputs of the last layer, the prototypes the softmax is over
  float global_crop_scale_min;  // global crops: [this, augment.crop_scale_max] of the image area
  float local_crop_scale_min;   // local crops: [this, global_crop_scale_min]
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
    INT_KEY(OWN(DinoSettings, dino, local_crops), "6", 0, 16,
            "small crops per image, encoded by the student only"),
    INT_KEY(OWN(DinoSettings, dino, local_size), "12", 1, 4096,
            "the small crops' side in pixels (at most data.image_size)"),
    INT_KEY(OWN(DinoSettings, dino, out_dim), "1024", 2, 65536,
            "outputs of the head's weight-normalized last layer (the prototypes)"),
    FLOAT_KEY(OWN(DinoSettings, dino, global_crop_scale_min), "0.4", 0, 1, 1,
              "global crops take [this, augment.crop_scale_max] of the image area"),
    FLOAT_KEY(OWN(DinoSettings, dino, local_crop_scale_min), "0.05", 0, 1, 1,
              "local crops take [this, global_crop_scale_min] of the image area"),
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

enum { GLOBAL_CROPS = 2 };

// Two global crops at data.image_size, then the local ones at their side and smaller scales.
static void dino_views(const Config *cfg, const AugmentParams *base, ViewRecipe *out) {
  const DinoSettings *set = settings(cfg);
  out->n_groups = set->local_crops > 0 ? 2 : 1;
  out->group[0] = (ViewGroup){.count = GLOBAL_CROPS, .aug = *base};
  out->group[0].aug.crop_scale_min = set->global_crop_scale_min;
  if (set->local_crops == 0) return;
  out->group[1] = (ViewGroup){.count = set->local_crops, .aug = *base};
  out->group[1].aug.out_size = set->local_size;
  out->group[1].aug.crop_scale_min = set->local_crop_scale_min;
  out->group[1].aug.crop_scale_max = set->global_crop_scale_min;
}

// The head after the MLP: z -> z / |z| -> (z / |z|) (V / |V|)^T, V (K, bottleneck) the weights,
// normalized row by row. One per network (student: every crop; teacher: the global ones).
typedef struct {
  int rows, bottleneck, K;
  float *v, *dv;        // (K, bottleneck) parameters: the student's, or the teacher's copy (no dv)
  L2Norm w_unit;        // out (K, bottleneck): V's rows normalized; its gradient goes to V's
  L2Norm z_unit;        // out (rows, bottleneck); din (rows, bottleneck) the MLP's output gradient
  float *logits;        // (rows, K)
  Matmul fwd;           // logits = z_unit w_unit^T
  Matmul dz_mm, dw_mm;  // dz_unit = dlogits w_unit; dw_unit = dlogits^T z_unit (student only)
  float *dz_unit, *dw_unit;  // (rows, bottleneck), (K, bottleneck)
} NormedLast;

static void normed_last_init(NormedLast *n, ExecCtx *ctx, ParamSet *ps, int rows, int bottleneck,
                             int K, int train) {
  memset(n, 0, sizeof *n);
  n->rows = rows, n->bottleneck = bottleneck, n->K = K;
  const MemCategory kept = train ? MEM_ACT : MEM_WORKSPACE;
  n->v = paramset_take(ps, "dino.last_layer.weight", (size_t)K * bottleneck, 0, &n->dv);
  long shape[2] = {K, bottleneck};
  paramset_set_shape(ps, 2, shape);
  paramset_init_normal(ps, n->v, (size_t)K * bottleneck, 0.02f);
  const Builder head = {.ctx = ctx, .mode = train ? OP_TRAIN : OP_FORWARD, .component = COMP_HEAD};
  l2norm_init(&n->w_unit, &head, K, bottleneck, 0);
  l2norm_init(&n->z_unit, &head, rows, bottleneck, 1);
  n->logits = tl_alloc(sizeof(float) * (size_t)rows * K, kept, COMP_HEAD);
  matmul_init(&n->fwd, ctx, rows, bottleneck, K, 0, 1, COMP_HEAD, 0);
  if (!train) return;
  paramset_grad_expect(ps, n->dv, 1);  // one backward a step writes it
  matmul_init(&n->dz_mm, ctx, rows, K, bottleneck, 0, 0, COMP_HEAD, 1);
  matmul_init(&n->dw_mm, ctx, K, rows, bottleneck, 1, 0, COMP_HEAD, 1);
  n->dz_unit = tl_alloc(sizeof(float) * (size_t)rows * bottleneck, MEM_ACT_GRAD, COMP_HEAD);
  n->dw_unit = tl_alloc(sizeof(float) * (size_t)K * bottleneck, MEM_ACT_GRAD, COMP_HEAD);
}

static void normed_last_forward(NormedLast *n, ExecCtx *ctx, const float *z) {
  l2norm_forward(&n->w_unit, ctx, n->v);
  l2norm_forward(&n->z_unit, ctx, z);
  matmul_run(&n->fwd, ctx, n->z_unit.out, n->w_unit.out, n->logits);
}

// dlogits -> dz (the MLP's output gradient) and V's gradient, reported to its set.
static void normed_last_backward(NormedLast *n, ExecCtx *ctx, const ParamSet *ps,
                                 const float *dlogits) {
  matmul_run(&n->dz_mm, ctx, dlogits, n->w_unit.out, n->dz_unit);
  matmul_run(&n->dw_mm, ctx, dlogits, n->z_unit.out, n->dw_unit);
  const size_t nv = (size_t)n->K * n->bottleneck;
  float *target = paramset_grad_target(ps, n->dv, nv, paramset_grad_accumulates(ps, n->dv), 0);
  l2norm_backward_to(&n->w_unit, ctx, n->dw_unit, target);
  l2norm_backward(&n->z_unit, ctx, n->dz_unit);
  if (!ctx->dry_run && target != n->dv) paramset_grad_commit(ps, n->dv, target, nv);
  paramset_grad_contributed(ps, n->dv, nv);
}

static void normed_last_destroy(NormedLast *n) {
  matmul_destroy(&n->fwd);
  if (n->dz_unit) {
    matmul_destroy(&n->dz_mm);
    matmul_destroy(&n->dw_mm);
  }
  l2norm_destroy(&n->w_unit);
  l2norm_destroy(&n->z_unit);
  float *bufs[] = {n->logits, n->dz_unit, n->dw_unit};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tl_free(bufs[i]);
}

typedef struct {
  Objective base;            // base.online: the student's backbone on the global crops (2b images)
  int b, local_crops, rows;  // samples on this replica; rows = (2 + local_crops) b student crops
  ParamSet local_view;       // the student's backbone weights again, for its second instance
  Backbone *local;           // the student's backbone on the local crops (local_crops b images)
  size_t local_act_bytes;    // the encoder activations held for the local crops
  float *features;           // (rows, D) both instances' features, global crops first
  ProjectionHead head;       // the student's MLP over every crop
  NormedLast last;
  ParamSet teacher_params;  // EMA of every student parameter, no gradients
  Backbone *teacher;        // OP_FORWARD on the global crops: batch statistics, nothing kept
  ProjectionHead teacher_head;
  NormedLast teacher_last;
  float *center;        // (K) the teacher outputs' running mean, MEM_MOMENTUM (checkpointed)
  float *batch_center;  // (K) this step's mean over every replica's teacher rows
  DinoLoss loss;
  float *dlogits;  // (rows, K) MEM_ACT_GRAD loss
} Dino;

// A ViT's local instance sees the local crops at their own size when its patches tile them;
// pad_to would frame them back to the global side and spend what they save.
static ModelSpec local_spec(const ModelSpec *spec, int local_size) {
  return backbone_spec_at_size(spec, local_size);
}

static Objective *dino_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const DinoSettings *set = settings(cfg);
  const int S = cfg->data.image_size, C = cfg->data.channels;
  if (set->local_crops > 0 && set->local_size > S) {
    tl_fail("[dino] local_size = %d is larger than the global crops' data.image_size = %d",
            set->local_size, S);
    return NULL;
  }
  if (set->local_crops > 0 && set->local_crop_scale_min >= set->global_crop_scale_min) {
    tl_fail(
        "[dino] local_crop_scale_min = %g must be below global_crop_scale_min = %g (local "
        "crops take the range between them)",
        set->local_crop_scale_min, set->global_crop_scale_min);
    return NULL;
  }
  if (set->global_crop_scale_min > cfg->augment.crop_scale_max) {
    tl_fail("[dino] global_crop_scale_min = %g is above [augment] crop_scale_max = %g",
            set->global_crop_scale_min, cfg->augment.crop_scale_max);
    return NULL;
  }
  Dino *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  o->local_crops = set->local_crops;
  o->rows = (GLOBAL_CROPS + set->local_crops) * o->b;
  const int global_rows = GLOBAL_CROPS * o->b, local_rows = o->rows - global_rows;
  const int hidden = cfg->model.head_hidden_dim, bottleneck = cfg->model.head_out_dim;
  const int K = set->out_dim;
  const ModelSpec *spec = &cfg->model.spec;

  // The student: one backbone at each crop size over the same weights, one head over all crops.
  Builder student = {
      .ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  // (Its head comes after the local crops' instance: one head over every crop's features.)
  o->base.online = objective_encoder(env, &student, global_rows, NULL, NULL);
  const int D = o->base.online->feature_dim;
  if (local_rows > 0) {
    // The local crops' share of the encoder's activations: what their instance adds, and their
    // rows of the features.
    const long long before = tl_mem_thread_net(MEM_ACT, COMP_ENCODER);
    paramset_view(&o->local_view, env->params, 0);
    // Its BatchNorms normalize the local crops with their own statistics and leave the running
    // ones to the global crops, the size the encoder is evaluated and exported at.
    Builder local = {.ctx = env->ctx,
                     .params = &o->local_view,
                     .mode = OP_TRAIN,
                     .policy = env->policy,
                     .keep_running_stats = 1};
    const ModelSpec small = local_spec(spec, set->local_size);
    o->local = backbone_create(&small, &local, local_rows, set->local_size, C);
    backbone_set_input_normalization(o->local, env->input_mean, env->input_std);
    o->local_act_bytes = (size_t)(tl_mem_thread_net(MEM_ACT, COMP_ENCODER) - before) +
                         sizeof(float) * (size_t)local_rows * o->base.online->feature_dim;
  }
  o->features = tl_alloc(sizeof(float) * (size_t)o->rows * D, MEM_ACT, COMP_ENCODER);
  const HeadActivation head_activation = set->head_bn ? HEAD_BN_RELU : HEAD_GELU;
  head_init_with(&o->head, &student, "head", o->rows, D, hidden, bottleneck, set->head_layers,
                 head_activation);
  normed_last_init(&o->last, env->ctx, env->params, o->rows, bottleneck, K, 1);

  // The teacher starts as an exact copy of every student parameter, taken in the same order.
  paramset_alloc_nograd(&o->teacher_params, env->params->used, cfg->train.seed, MEM_MOMENTUM);
  Builder teacher = {
      .ctx = env->ctx, .params = &o->teacher_params, .mode = OP_FORWARD, .policy = env->policy};
  o->teacher = objective_encoder(env, &teacher, global_rows, NULL, NULL);
  head_init_with(&o->teacher_head, &teacher, "head", global_rows, D, hidden, bottleneck,
                 set->head_layers, head_activation);
  normed_last_init(&o->teacher_last, env->ctx, &o->teacher_params, global_rows, bottleneck, K, 0);
  if (!env->ctx->dry_run) ema_copy(&o->teacher_params, env->params);

  o->center = tl_alloc(sizeof(float) * (size_t)K, MEM_MOMENTUM, COMP_LOSS);
  o->batch_center = tl_alloc(sizeof(float) * (size_t)K, MEM_WORKSPACE, COMP_LOSS);
  dino_loss_init(&o->loss, env->ctx, o->b, GLOBAL_CROPS, GLOBAL_CROPS + set->local_crops, K);
  o->dlogits = tl_alloc(sizeof(float) * (size_t)o->rows * K, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  TL_ASSERT(o->teacher_params.used == o->teacher_params.count);
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

// The teacher's drift from the student after the update, ||theta_t - theta_o|| /
// ||theta_o|| (LEDGER_CACHED: the teacher is what is kept between steps); known only in a run.
static const LedgerOwnFields dino_fields = {1,
                                            {{"momentum_distance", LEDGER_CACHED, UNIT_RATIO, 1}}};

static ObjectiveLoss dino_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Dino *o = (Dino *)base;
  ExecCtx *ctx = base->env.ctx;
  const DinoSettings *set = settings(base->env.cfg);
  const int b = o->b, global_rows = GLOBAL_CROPS * b;
  TL_ASSERT(batch->n == b && batch->n_groups == (o->local ? 2 : 1) &&
            batch->group[0].count == GLOBAL_CROPS);
  const float *global_views = batch->group[0].views;

  o->teacher->forward(o->teacher, ctx, global_views);
  head_forward(&o->teacher_head, ctx, o->teacher->feature);
  normed_last_forward(&o->teacher_last, ctx, o->teacher_head.out);

  Backbone *student = base->online;
  const int D = student->feature_dim;
  student->forward(student, ctx, global_views);
  // The local crops' FLOPs, for their view group's line in the ledger.
  const double local_fwd0 = ctx->flops_forward[COMP_ENCODER];
  if (o->local) o->local->forward(o->local, ctx, batch->group[1].views);
  const double local_fwd = ctx->flops_forward[COMP_ENCODER] - local_fwd0;
  if (!ctx->dry_run) {
    memcpy(o->features, student->feature, sizeof(float) * (size_t)global_rows * D);
    if (o->local)
      memcpy(o->features + (size_t)global_rows * D, o->local->feature,
             sizeof(float) * (size_t)(o->rows - global_rows) * D);
  }
  head_forward(&o->head, ctx, o->features);
  normed_last_forward(&o->last, ctx, o->head.out);
  // Per-sample terms with no coupling across replicas but the centre (a constant here), so the
  // gradient of this replica's mean, averaged over replicas by sample count, is the global one.
  const float tau_t = teacher_temp_at(set, batch->global_step, base->env.total_steps);
  double loss_sum =
      dino_loss_forward_backward(&o->loss, ctx, o->last.logits, o->teacher_last.logits, o->center,
                                 set->student_temp, tau_t, b, o->dlogits);
  objective_backward_begins(base);
  normed_last_backward(&o->last, ctx, base->env.params, o->dlogits);
  head_backward(&o->head, ctx, o->last.z_unit.din);
  const double local_bwd0 = ctx->flops_backward[COMP_ENCODER];
  if (o->local) o->local->backward(o->local, ctx, o->head.din + (size_t)global_rows * D);
  const double local_bwd = ctx->flops_backward[COMP_ENCODER] - local_bwd0;
  student->backward(student, ctx, o->head.din);

  rec->views_grad = o->rows;
  rec->views_nograd = global_rows;
  rec->negatives_per_query = 0;
  rec->positives_per_query = GLOBAL_CROPS;
  rec->encodings_next_new = o->rows + global_rows;
  rec->encodings_next_reused = 0;
  // Global crops: the student's and the teacher's; local crops: the student's only.
  rec->view_groups = o->local ? 2 : 1;
  rec->view_group[0].views_grad = global_rows;
  rec->view_group[0].views_nograd = global_rows;
  if (o->local)
    rec->view_group[1] = (LedgerViewGroup){.views_grad = o->rows - global_rows,
                                           .flops_forward = local_fwd,
                                           .flops_backward = local_bwd,
                                           .activation_bytes = o->local_act_bytes};
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
  float m = ema_momentum_at(set->momentum, set->momentum_schedule, batch->global_step,
                            base->env.total_steps);
  if (!base->env.ctx->dry_run) rec->own[0] = ema_update(&o->teacher_params, base->env.params, m);
}

static void dino_destroy(Objective *base) {
  Dino *o = (Dino *)base;
  base->online->destroy(base->online);
  if (o->local) o->local->destroy(o->local);
  paramset_free(&o->local_view);
  head_destroy(&o->head);
  normed_last_destroy(&o->last);
  o->teacher->destroy(o->teacher);
  head_destroy(&o->teacher_head);
  normed_last_destroy(&o->teacher_last);
  paramset_free(&o->teacher_params);
  dino_loss_destroy(&o->loss);
  float *bufs[] = {o->features, o->center, o->batch_center, o->dlogits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tl_free(bufs[i]);
  free(o);
}

// The schedules are functions of the step the batch carries: the teacher's weights (with its
// BatchNorm statistics) and the centre are all a resumed run needs.
static void dino_state(Objective *base, StFile *s) {
  Dino *o = (Dino *)base;
  st_add_paramset(s, "dino.teacher.", &o->teacher_params);
  int64_t K = o->last.K;
  st_add(s, "dino.center", ST_F32, 1, &K, o->center);
}

static void dino_params_loaded(Objective *base) {
  Dino *o = (Dino *)base;
  ema_copy(&o->teacher_params, base->env.params);
}

const ObjectiveDef objective_dino = {
    .name = "dino",
    .settings = &dino_settings,
    .ledger_fields = &dino_fields,
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
