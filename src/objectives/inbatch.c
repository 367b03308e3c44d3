// inbatch: SimCLR's NT-Xent in-batch contrast. Both views of every image go through the online
// encoder with backward; each view's negatives are the other 2B - 2 views of the global batch
// (features gathered from all replicas). Nothing is kept between steps: every step re-encodes
// everything it compares against.
#include <stdlib.h>
#include <string.h>

#include "nn/head.h"
#include "objectives/ntxent.h"
#include "objectives/objective.h"
#include "ops/l2norm.h"

extern const ObjectiveDef objective_inbatch;

// [inbatch]
typedef struct {
  float temperature;  // 0.2: NT-Xent's softmax temperature
} InBatchSettings;

static const KeySpec inbatch_keys[] = {
    FLOAT_KEY(OWN(InBatchSettings, inbatch, temperature), "0.2", 0, 100, OPEN_MIN,
              "NT-Xent's softmax temperature"),
};
static const ConfigSection inbatch_settings = CONFIG_SECTION(inbatch_keys, InBatchSettings, NULL);

typedef struct {
  Objective base;
  int b;  // samples on this replica; rows = 2b views
  ProjectionHead head;
  NtXent loss;
  L2Norm unit;      // the projections normalized: out (2b, out), din the head's gradient
  float *u_all;     // (2B, out) gathered from all replicas, MEM_ACT loss
  float *du_local;  // (2b, out) MEM_ACT_GRAD
} InBatch;

static Objective *inbatch_create(const ObjectiveEnv *env) {
  const Config *cfg = env->cfg;
  const InBatchSettings *set = objective_settings(cfg, &objective_inbatch);
  // With one image its two views have no other image to be told apart from: every row's only
  // candidate is its positive, and the loss is 0 whatever the encoder does.
  if (env->global_batch < 2) {
    tl_fail(
        "the global batch has %d image; contrasting views needs at least 2, so that each has "
        "negatives (train.batch_size)",
        env->global_batch);
    return NULL;
  }
  InBatch *o = calloc(1, sizeof *o);
  if (!o) TL_DIE("out of memory");
  o->base.env = *env;
  o->b = env->local_batch;
  int rows = 2 * o->b, M = 2 * env->global_batch, d = cfg->model.head_out_dim;
  Builder bld = {.ctx = env->ctx, .params = env->params, .mode = OP_TRAIN, .policy = env->policy};
  o->base.online = objective_encoder(env, &bld, rows, &o->head, "head");
  ntxent_init(&o->loss, env->ctx, M, rows, d, set->temperature);
  Builder loss = bld;
  loss.component = COMP_LOSS;
  l2norm_init(&o->unit, &loss, rows, d, 1);
  o->u_all = tl_alloc(sizeof(float) * (size_t)M * d, MEM_ACT, COMP_LOSS);
  o->du_local = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, COMP_LOSS);
  TL_ASSERT(paramset_complete(env->params));
  return &o->base;
}

static ObjectiveLoss inbatch_step(Objective *base, const Batch *batch, LedgerRecord *rec) {
  InBatch *o = (InBatch *)base;
  ExecCtx *ctx = base->env.ctx;
  Comm *comm = base->env.comm;
  const int rows = 2 * o->b, d = o->head.out_dim, M = o->loss.M;
  TL_ASSERT(batch->n == o->b && batch->n_views == 2);

  // The batch is view-major, so views 0 and 1 of all samples form one 2b-image forward.
  base->online->forward(base->online, ctx, batch->views);
  head_forward(&o->head, ctx, base->online->feature);
  l2norm_forward(&o->unit, ctx, o->head.out);
  size_t offset = 0;
  comm_allgather(comm, o->unit.out, (size_t)rows * d, o->u_all, (size_t)M * d, &offset);
  int row0 = (int)(offset / (size_t)d);
  double loss_sum =
      ntxent_forward_backward(&o->loss, ctx, o->u_all, o->unit.out, row0, o->du_local);
  objective_backward_begins(base);

  // Column-role gradients of this replica's rows come from every replica's loss rows.
  comm_allreduce_weighted(comm, o->loss.du_col, (size_t)M * d, 1.0);
  float world = (float)comm_size(comm);
  // The trainer averages replica gradients weighted by sample count; scaling by
  // global_batch / local_batch turns that average back into the sum of contributions.
  float scale = (float)base->env.shard_to_global;
  const float *col = o->loss.du_col + (size_t)row0 * d;
  if (!ctx->dry_run)
    for (size_t i = 0; i < (size_t)rows * d; i++)
      o->du_local[i] = scale * (o->du_local[i] + world * col[i]);
  l2norm_backward(&o->unit, ctx, o->du_local);
  head_backward(&o->head, ctx, o->unit.din);
  base->online->backward(base->online, ctx, o->head.din);

  rec->views_grad = rows;
  rec->views_nograd = 0;
  rec->negatives_per_query = M - 2;
  rec->positives_per_query = 1;
  rec->encodings_next_new = rows;
  rec->encodings_next_reused = 0;
  return (ObjectiveLoss){loss_sum, rows};
}

static void inbatch_destroy(Objective *base) {
  InBatch *o = (InBatch *)base;
  base->online->destroy(base->online);
  head_destroy(&o->head);
  ntxent_destroy(&o->loss);
  l2norm_destroy(&o->unit);
  tl_free(o->u_all);
  tl_free(o->du_local);
  free(o);
}

const ObjectiveDef objective_inbatch = {
    .name = "inbatch",
    .settings = &inbatch_settings,
    .description = "SimCLR NT-Xent: 2 views per image, negatives from the whole batch",
    .n_views = 2,
    .create = inbatch_create,
    .step = inbatch_step,
    .after_update = NULL,
    .destroy = inbatch_destroy,
};
