// moco: MoCo v2. Queries go through the online encoder with backward; keys through a momentum
// copy (theta_k <- m theta_k + (1 - m) theta_q), forward only, holding nothing for backward.
// The negatives are K keys from earlier steps in a FIFO queue, so each step encodes B keys and
// reuses K, instead of encoding K images.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/head.h"
#include "objectives/infonce.h"
#include "objectives/key_queue.h"
#include "objectives/moco.h"
#include "objectives/objective.h"
#include "objectives/teacher.h"
#include "ops/l2norm.h"

extern const ObjectiveDef objective_moco;

// [moco]
typedef struct {
  float temperature;           // 0.2
  int queue_size;              // 4096: K keys held between steps
  float momentum;              // 0.99: the key encoder's EMA coefficient m
  char momentum_schedule[16];  // constant | cosine (m rises to 1 over the run, as MoCo v3)
  int queue_max_age_steps;     // 0 = off; else keys older than this are not used as negatives
  int symmetric;               // 0; 1: both views are queries (and keys for each other)
} MocoSettings;

static const KeySpec moco_keys[] = {
    FLOAT_KEY(OWN(MocoSettings, moco, temperature), "0.2", 0, 100, OPEN_MIN,
              "InfoNCE's softmax temperature"),
    INT_KEY(OWN(MocoSettings, moco, queue_size), "4096", 1, 1 << 24,
            "K: keys from earlier steps held in the queue as negatives"),
    FLOAT_KEY(OWN(MocoSettings, moco, momentum), "0.99", 0, 1, 0,
              "the key encoder's EMA coefficient m: θk ← m θk + (1 − m) θq"),
    TEXT_KEY(OWN(MocoSettings, moco, momentum_schedule), "constant", "constant|cosine",
             "`constant`, or `cosine`: m rises from `momentum` to 1 over the run (MoCo v3)"),
    INT_KEY(OWN(MocoSettings, moco, queue_max_age_steps), "0", 0, INT_MAX,
            "keys older than this many steps are not used as negatives; 0 = off"),
    BOOL_KEY(OWN(MocoSettings, moco, symmetric), "0",
             "1: both views are queries, and keys for each other"),
};
static const ConfigSection moco_settings = CONFIG_SECTION(moco_keys, MocoSettings, NULL);

static const MocoSettings *settings(const Config *cfg) {
  return objective_settings(cfg, &objective_moco);
}

typedef struct {
  Objective base;
  int b;               // samples on this replica
  int n_query;         // b, or 2b with the symmetric loss
  int n_query_global;  // n_query over every replica: the gathers' rows
  int image_floats;    // S*S*C
  ProjectionHead head;
  MomentumTeacher key;  // momentum copy of every online parameter: the key encoder's
  Backbone *key_backbone;
  ProjectionHead key_head;
  InfoNce loss;
  KeyQueue queue;
  long step;
  L2Norm query_unit;      // the queries normalized, out (n_query, d); din the head's gradient
  L2Norm key_unit;        // out (n_query, d): the keys for this replica's queries, normalized
  float *dq;              // (n_query, d) MEM_ACT_GRAD
  unsigned char *usable;  // (K) negatives in use this step
  float *key_images;      // (n_query, S, S, C): the views the key encoder sees, MEM_WORKSPACE
  // ShuffleBN across replicas: all key images, and all keys, of the global batch.
  float *all_images;  // (n_query_global, S, S, C)
  float *all_keys;    // (n_query_global, d)
  int *perm;          // (n_query_global)
} Moco;

static Objective *moco_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  Moco *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  o->n_query = settings(cfg)->symmetric ? 2 * o->b : o->b;
  const int S = cfg->data.image_size, C = cfg->data.channels, d = cfg->model.head_out_dim;
  const int K = settings(cfg)->queue_size, nq = o->n_query;
  const int nq_global = (settings(cfg)->symmetric ? 2 : 1) * env->global_batch;
  o->n_query_global = nq_global;
  o->image_floats = S * S * C;

  Builder online = {
      .ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  o->base.online = objective_encoder(env, &online, nq, &o->head, "head");

  // The key encoder starts as an exact copy and then only follows the momentum rule.
  Builder key = momentum_teacher_begin(&o->key, env, settings(cfg)->momentum,
                                       settings(cfg)->momentum_schedule);
  o->key_backbone = objective_encoder(env, &key, nq, &o->key_head, "key_head");

  infonce_init(&o->loss, env->ctx, nq, K, d, settings(cfg)->temperature);
  key_queue_init(&o->queue, K, d, cfg->train.seed);
  size_t qd = (size_t)nq * d;
  online.component = key.component = COMP_LOSS;
  l2norm_init(&o->query_unit, &online, nq, d, 1);
  l2norm_init(&o->key_unit, &key, nq, d, 0);
  momentum_teacher_ready(&o->key, env);
  o->dq = tl_alloc(sizeof(float) * qd, MEM_ACT_GRAD, COMP_LOSS);
  o->usable = tl_alloc((size_t)K, MEM_WORKSPACE, COMP_LOSS);
  o->key_images =
      tl_alloc(sizeof(float) * (size_t)nq * o->image_floats, MEM_WORKSPACE, COMP_ENCODER);
  if (comm_size(env->comm) > 1) {
    o->all_images =
        tl_alloc(sizeof(float) * (size_t)nq_global * o->image_floats, MEM_WORKSPACE, COMP_ENCODER);
    o->all_keys = tl_alloc(sizeof(float) * (size_t)nq_global * d, MEM_WORKSPACE, COMP_LOSS);
    o->perm = tl_alloc(sizeof(int) * (size_t)nq_global, MEM_WORKSPACE, COMP_OTHER);
  }
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

static void encode_keys_local(Moco *o, ExecCtx *ctx, const float *images) {
  o->key_backbone->forward(o->key_backbone, ctx, images);
  head_forward(&o->key_head, ctx, o->key_backbone->feature);
  l2norm_forward(&o->key_unit, ctx, o->key_head.out);
}

// ShuffleBN: with several replicas the key encoder sees a random slice of the global batch, so
// its BatchNorm statistics cannot tell a query's own positive apart (MoCo section 3.3). The
// permutation comes from (seed, step), identical on every replica.
static void encode_keys_shuffled(Moco *o, ExecCtx *ctx) {
  Comm *comm = o->base.env.comm;
  const int d = o->key_head.out_dim, f = o->image_floats;
  size_t offset_floats;
  comm_allgather(comm, o->key_images, (size_t)o->n_query * f, o->all_images,
                 (size_t)o->n_query_global * f, &offset_floats);
  const int n_global = (o->n_query / o->b) * o->base.env.global_batch;
  const int my0 = (int)(offset_floats / (size_t)f);
  // A plan walks the same collectives and encoder; only the host shuffling is skipped.
  if (!ctx->dry_run) {
    Rng r = rng_stream(o->base.env.cfg->train.seed, RNG_SHUFFLE, 0x5b, (uint64_t)o->step);
    for (int i = 0; i < n_global; i++) o->perm[i] = i;
    for (int i = n_global - 1; i > 0; i--) {
      int j = (int)rng_below(&r, (uint32_t)(i + 1));
      int t = o->perm[i];
      o->perm[i] = o->perm[j];
      o->perm[j] = t;
    }
    // This replica encodes the shuffled positions [my0, my0 + n_query).
    for (int i = 0; i < o->n_query; i++)
      memcpy(o->key_images + (size_t)i * f, o->all_images + (size_t)o->perm[my0 + i] * f,
             sizeof(float) * (size_t)f);
  }
  encode_keys_local(o, ctx, o->key_images);
  comm_allgather(comm, o->key_unit.out, (size_t)o->n_query * d, o->all_keys,
                 (size_t)o->n_query_global * d, NULL);
  // all_keys[p] is the key of sample perm[p]; pick this replica's samples back in order.
  for (int p = 0; p < n_global && !ctx->dry_run; p++) {
    int sample = o->perm[p];
    if (sample >= my0 && sample < my0 + o->n_query)
      memcpy(o->key_unit.out + (size_t)(sample - my0) * d, o->all_keys + (size_t)p * d,
             sizeof(float) * (size_t)d);
  }
}

// The ledger's view of the queue and the key encoder (LEDGER_CACHED: what is kept between steps).
enum {
  MOCO_QUEUE_VECTORS,
  MOCO_QUEUE_RANDOM_VECTORS,
  MOCO_QUEUE_OLDEST_AGE,
  MOCO_QUEUE_MEAN_AGE,
  MOCO_MOMENTUM_DISTANCE
};
static const LedgerOwnFields moco_fields = {
    5,
    {
        // real keys in the queue (the random initial entries excluded)
        {"queue_vectors", LEDGER_CACHED, UNIT_COUNT, 0},
        // initial random entries not yet replaced
        {"queue_random_vectors", LEDGER_CACHED, UNIT_COUNT, 0},
        {"queue_oldest_age_steps", LEDGER_CACHED, UNIT_STEPS, 0},
        {"queue_mean_age_steps", LEDGER_CACHED, UNIT_STEPS, 0},
        MOMENTUM_DISTANCE_FIELD,
    },
};

static void set_queue_fields(LedgerRecord *rec, const KeyQueueStats *qs) {
  rec->own[MOCO_QUEUE_VECTORS] = (double)qs->real;
  rec->own[MOCO_QUEUE_RANDOM_VECTORS] = (double)qs->random;
  rec->own[MOCO_QUEUE_OLDEST_AGE] = qs->oldest_age_steps;
  rec->own[MOCO_QUEUE_MEAN_AGE] = qs->mean_age_steps;
}

static ObjectiveLoss moco_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  Moco *o = (Moco *)base;
  const Config *cfg = base->env.cfg;
  ExecCtx *ctx = base->env.ctx;
  Comm *comm = base->env.comm;
  const int b = o->b, f = o->image_floats;
  TL_ASSERT(batch->n == b && batch->n_views == 2);
  const float *view0 = batch->views, *view1 = batch->views + (size_t)b * f;

  // Queries: view 0 (and view 1 when symmetric). Keys: the other view of each query.
  const float *query_images = batch->views;  // [view 0; view 1] is already contiguous
  if (!ctx->dry_run) {
    memcpy(o->key_images, view1, sizeof(float) * (size_t)b * f);
    if (settings(cfg)->symmetric)
      memcpy(o->key_images + (size_t)b * f, view0, sizeof(float) * (size_t)b * f);
  }
  if (comm_size(comm) > 1)
    encode_keys_shuffled(o, ctx);
  else
    encode_keys_local(o, ctx, o->key_images);

  base->online->forward(base->online, ctx, query_images);
  head_forward(&o->head, ctx, base->online->feature);
  const int max_age = settings(cfg)->queue_max_age_steps;
  if (!ctx->dry_run) {
    for (int i = 0; i < o->queue.capacity; i++)
      o->usable[i] = (unsigned char)key_queue_usable(&o->queue, i, o->step, max_age);
  }
  l2norm_forward(&o->query_unit, ctx, o->head.out);
  double loss_sum = infonce_forward_backward(&o->loss, ctx, o->query_unit.out, o->key_unit.out,
                                             o->queue.keys, o->usable, o->n_query, o->dq);
  objective_backward_begins(base);
  l2norm_backward(&o->query_unit, ctx, o->dq);
  head_backward(&o->head, ctx, o->query_unit.din);
  base->online->backward(base->online, ctx, o->head.din);

  // A plan's queue holds nothing: the planner asks moco_plan what it would hold at its step.
  KeyQueueStats qs = {0};
  if (!ctx->dry_run) qs = key_queue_stats(&o->queue, o->step, max_age);
  rec->views_grad = o->n_query;
  rec->views_nograd = o->n_query;
  rec->negatives_per_query = qs.usable;
  rec->positives_per_query = 1;
  set_queue_fields(rec, &qs);
  rec->queue_bytes = key_queue_bytes(&o->queue);
  rec->encodings_next_new = 2L * o->n_query;
  rec->encodings_next_reused = o->queue.capacity;
  return (ObjectiveLoss){loss_sum, o->n_query};
}

static void moco_after_update(Objective *base, const Batch *batch, LedgerRecord *rec) {
  (void)batch;
  Moco *o = (Moco *)base;
  Comm *comm = base->env.comm;
  const int d = o->key_head.out_dim;
  const int dry_run = base->env.ctx->dry_run;
  momentum_teacher_update(&o->key, &base->env, o->step, &rec->own[MOCO_MOMENTUM_DISTANCE]);
  // Every replica enqueues the keys of the whole global batch, so all queues stay identical.
  if (comm_size(comm) > 1) {
    comm_allgather(comm, o->key_unit.out, (size_t)o->n_query * d, o->all_keys,
                   (size_t)o->n_query_global * d, NULL);
    int n_global = (o->n_query / o->b) * base->env.global_batch;
    if (!dry_run) key_queue_push(&o->queue, o->all_keys, n_global, o->step);
  } else if (!dry_run) {
    key_queue_push(&o->queue, o->key_unit.out, o->n_query, o->step);
  }
  o->step++;
}

static void moco_destroy(Objective *base) {
  Moco *o = (Moco *)base;
  base->online->destroy(base->online);
  head_destroy(&o->head);
  o->key_backbone->destroy(o->key_backbone);
  head_destroy(&o->key_head);
  momentum_teacher_destroy(&o->key);
  infonce_destroy(&o->loss);
  key_queue_destroy(&o->queue);
  l2norm_destroy(&o->query_unit);
  l2norm_destroy(&o->key_unit);
  tl_free(o->dq);
  tl_free(o->usable);
  tl_free(o->key_images);
  tl_free(o->all_images);
  tl_free(o->all_keys);
  tl_free(o->perm);
  free(o);
}

// Queries (and keys) per step over all replicas: the global batch, twice when symmetric.
static long keys_per_step(const Config *cfg, int global_batch) {
  return (settings(cfg)->symmetric ? 2L : 1L) * global_batch;
}

static void moco_plan(const Config *cfg, long step, int global_batch, LedgerRecord *rec) {
  const MocoSettings *set = settings(cfg);
  KeyQueueStats qs = key_queue_planned_stats(set->queue_size, keys_per_step(cfg, global_batch),
                                             set->queue_max_age_steps, step);
  set_queue_fields(rec, &qs);
  rec->negatives_per_query = qs.usable;
}

static void moco_params_loaded(Objective *base) {
  Moco *o = (Moco *)base;
  momentum_teacher_restart(&o->key, base->env.params);
}

static void moco_state(Objective *base, StFile *s) {
  Moco *o = (Moco *)base;
  momentum_teacher_state(&o->key, s, "moco.key.");
  int64_t kd[2] = {o->queue.capacity, o->queue.dim};
  st_add(s, "moco.queue.keys", ST_F32, 2, kd, o->queue.keys);
  _Static_assert(sizeof *o->queue.step_of == sizeof(int64_t), "step tags are saved as I64");
  st_add(s, "moco.queue.step_of", ST_I64, 1, kd, o->queue.step_of);
  st_add(s, "moco.queue.next", ST_I32, 0, NULL, &o->queue.next);
  _Static_assert(sizeof o->step == sizeof(int64_t), "the step is saved as I64");
  st_add(s, "moco.step", ST_I64, 0, NULL, &o->step);
}

const ParamSet *moco_key_params(const Objective *o) { return &((const Moco *)o)->key.params; }
const KeyQueue *moco_queue(const Objective *o) { return &((const Moco *)o)->queue; }
const float *moco_last_keys(const Objective *o) { return ((const Moco *)o)->key_unit.out; }

const ObjectiveDef objective_moco = {
    .name = "moco",
    .settings = &moco_settings,
    .plan = moco_plan,
    .ledger_fields = &moco_fields,
    .budget_key = "moco.queue_size",
    .description = "MoCo v2: momentum key encoder, FIFO queue of K keys as negatives",
    .n_views = 2,
    .create = moco_create,
    .step = moco_step,
    .after_update = moco_after_update,
    .destroy = moco_destroy,
    .state = moco_state,
    .params_loaded = moco_params_loaded,
};
