#include "train/replica.h"

#include <stdio.h>
#include <string.h>

#include "core/timer.h"
#include "data/loader.h"
#include "nn/backbone.h"
#include "ops/conv.h"
#include "parallel/replica_sync.h"

_Static_assert((int)VIEW_MAX_GROUPS <= (int)LEDGER_MAX_VIEW_GROUPS,
               "the ledger has a place for every view group");

// [model] sync_bn: BatchNorm's per-channel buffers averaged over replicas by sample count.
static void sync_bn_average(void *comm, float *buf, size_t n, double samples) {
  comm_allreduce_weighted(comm, buf, n, samples);
}

MonitorSettings replica_monitor_settings(const Config *cfg) {
  return (MonitorSettings){.spec = &cfg->model.spec,
                           .image_size = cfg->data.image_size,
                           .channels = cfg->data.channels,
                           .batch = cfg->eval.batch_size,
                           .train_limit = cfg->eval.knn_train_limit,
                           .k = cfg->eval.knn_k,
                           .temperature = cfg->eval.knn_temperature,
                           .linear = cfg->eval.linear,
                           .seed = cfg->train.seed};
}

ViewRecipe replica_views(const Config *cfg, const ObjectiveDef *def, const float *mean,
                         const float *std) {
  AugmentParams a = {
      .out_size = cfg->data.image_size,
      .crop_scale_min = cfg->augment.crop_scale_min,
      .crop_scale_max = cfg->augment.crop_scale_max,
      .crop_ratio_min = 3.0f / 4.0f,
      .crop_ratio_max = 4.0f / 3.0f,
      .flip_prob = cfg->augment.flip_prob,
      .jitter_strength = cfg->augment.jitter_strength,
      .jitter_prob = cfg->augment.jitter_prob,
      .grayscale_prob = cfg->augment.grayscale_prob,
      .solarize_prob = cfg->augment.solarize_prob,
      .blur_prob = cfg->augment.blur_prob,
  };
  for (int c = 0; c < cfg->data.channels && mean && std; c++) {
    a.mean[c] = mean[c];
    a.std[c] = std[c];
  }
  return objective_views(def, cfg, &a);
}

// The online parameters on a set of exactly their count, learned from a counting build first.
static int replica_alloc_exact(Replica *r) {
  const size_t count = objective_param_count(r->def, r->cfg);
  if (count == 0) return -1;
  paramset_alloc(&r->ps, count, r->cfg->train.seed);
  return 0;
}

int replica_build(Replica *r, const ReplicaSpec *spec, Comm *comm) {
  const Config *cfg = spec->cfg;
  memset(r, 0, sizeof *r);
  const RunLayout *L = spec->layout;
  r->cfg = cfg;
  r->def = L->def;
  r->rank = spec->rank;
  r->world = L->world;
  r->shard = run_layout_shard(L, spec->rank);
  r->comm = comm;
  exec_ctx_init(&r->ctx);
  r->ctx.dry_run = spec->dry_run;
  comm_set_dry_run(comm, spec->dry_run);
  r->policy = (BuildPolicy){
      .bf16 = strcmp(cfg->train.precision, "bf16") == 0,
      .recompute = cfg->train.recompute,
      .conv_algorithm = conv_algorithm_parse(cfg->train.conv_algorithm),
      .bn_splits = cfg->model.bn_splits,
  };
  if (cfg->model.sync_bn && r->world > 1)
    r->policy.bn_sync = (BnSync){sync_bn_average, comm, run_shard_to_global(&r->shard, 1.0)};
  // One build: the parameter set grows as the builders take their slices, and is sealed at the
  // size they took. No window (an address space too small to reserve one): counted first.
  const int growing = paramset_alloc_growing(&r->ps, cfg->train.seed) == 0;
  if (!growing && replica_alloc_exact(r) != 0) return -1;
  ObjectiveEnv env = {cfg,
                      &r->ctx,
                      comm,
                      &r->ps,
                      r->shard.local,
                      r->shard.global,
                      run_shard_to_global(&r->shard, 1.0),
                      spec->total_steps,
                      spec->rank == 0 ? spec->out_dir : NULL,
                      spec->input_mean,
                      spec->input_std,
                      &r->policy,
                      &r->arena};
  // This thread's own: several local replicas build at once.
  long long act0 = tl_mem_thread_net(MEM_ACT, COMP_ENCODER);
  r->obj = objective_create(r->def, &env);
  if (r->obj && r->ps.overflowed) {
    // The model outgrew the window an address-space limit left (ulimit -v; without one the
    // window is far beyond any model): that build's later slices aliased and hold nothing. It
    // goes, and the model is built again on a set of exactly the size it took, counted first as
    // before the sets grew. Costs a build; a run under a tight limit still trains.
    if (r->rank == 0)
      fprintf(stderr,
              "tally: note: the parameters outgrew the address space an address-space limit "
              "(ulimit -v) leaves them while the network is built; built again at their counted "
              "size\n");
    r->def->destroy(r->obj);
    r->obj = NULL;
    buffer_arena_free(&r->arena);  // its backbones' pools went with it
    paramset_free(&r->ps);
    if (replica_alloc_exact(r) != 0) return -1;
    act0 = tl_mem_thread_net(MEM_ACT, COMP_ENCODER);
    r->obj = objective_create(r->def, &env);
  }
  if (!r->obj) return -1;
  if (r->ps.growing) paramset_seal(&r->ps);
  r->encoder_act_bytes = (size_t)(tl_mem_thread_net(MEM_ACT, COMP_ENCODER) - act0);
  r->optim = optim_create_from_config(cfg, &r->ps);
  if (!r->optim) return -1;
  // The frozen-backbone prefix (optim.backbone_freeze_steps): what the online backbone took.
  TL_ASSERT(r->obj->online && r->obj->online->param_offset == 0);
  r->optim->backbone_floats = r->obj->online->param_floats;
  // Held for the run, like every buffer a step uses, so the ledger sees it at any moment.
  if (r->world > 1)
    r->buffer_pack =
        tl_alloc(sizeof(float) * (replica_buffer_floats(&r->ps) + 1), MEM_WORKSPACE, COMP_OTHER);
  if (r->world > 1 && comm_has_async(comm))
    r->grad_sync = grad_sync_create(comm, &r->ps, (size_t)cfg->parallel.bucket_kib * 1024);
  return 0;
}

void replica_destroy(Replica *r) {
  grad_sync_destroy(r->grad_sync);
  tl_free(r->buffer_pack);
  if (r->optim) optim_destroy(r->optim);
  if (r->obj) r->def->destroy(r->obj);
  buffer_arena_free(&r->arena);  // the backbones' pools, freed with the objective, joined it
  paramset_free(&r->ps);
  exec_ctx_destroy(&r->ctx);
  memset(r, 0, sizeof *r);
}

double replica_forward_backward(Replica *r, const Batch *batch, LedgerRecord *rec) {
  exec_ctx_reset_flops(&r->ctx);
  comm_stats_reset(r->comm);
  paramset_zero_grad(&r->ps, r->ctx.dry_run);
  if (r->grad_sync) grad_sync_begin(r->grad_sync, batch->n, r->shard.global);
  return objective_step(r->obj, batch, rec);
}

void replica_update(Replica *r, const Batch *batch, float lr, LedgerRecord *rec, StepTimes *t) {
  if (r->grad_sync)
    grad_sync_finish(r->grad_sync);
  else
    comm_allreduce_weighted(r->comm, r->ps.grad, r->ps.count, (double)batch->n);
  t->averaged = now_ms();
  if (!r->ctx.dry_run) optim_step(r->optim, lr);
  if (r->world > 1) replica_average_buffers(r->comm, &r->ps, batch->n, r->buffer_pack);
  if (r->def->after_update) r->def->after_update(r->obj, batch, rec);
  t->updated = now_ms();
}

int replica_check(Replica *r, long step, int last) {
  const int every = r->cfg->parallel.checksum_every;
  if (r->world <= 1 || (!last && (every <= 0 || (step + 1) % every != 0))) return -1;
  return replica_check_identical(r->comm, &r->ps);
}

void replica_count(const Replica *r, LedgerRecord *rec) {
  CommStats cs = comm_stats(r->comm);
  for (int c = 0; c < COMP_NCOMP; c++) {
    rec->flops_forward_by[c] = r->ctx.flops_forward[c];
    rec->flops_backward_by[c] = r->ctx.flops_backward[c];
    rec->flops_forward += r->ctx.flops_forward[c];
    rec->flops_backward += r->ctx.flops_backward[c];
  }
  rec->flops_winograd = r->ctx.flops_winograd;
  ledger_record_comm(rec, &cs);
  rec->shard_samples = r->shard.local;
  rec->shard_weight = run_shard_weight(&r->shard);
}
