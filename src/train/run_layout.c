#include "train/run_layout.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/dataset.h"

const ObjectiveDef *run_objective(const char *name) {
  const ObjectiveDef *def = objective_find(name);
  if (!def) tl_fail("unknown objective '%s' (choose one of: %s)", name, objective_names());
  return def;
}

int run_layout_init(RunLayout *L, const Config *cfg, const ObjectiveDef *def, int world) {
  memset(L, 0, sizeof *L);
  L->def = def;
  L->world = world;
  L->global_batch = cfg->train.batch_size;
  if (L->global_batch < L->world)
    return tl_fail("train.batch_size = %d cannot be split over %d replicas (a shard of 0)",
                   L->global_batch, L->world);
  return 0;
}

int dataset_flags(const Config *cfg) {
  return (cfg->data.stream ? DATASET_STREAM : 0) |
         (strcmp(cfg->data.labels, "none") == 0 ? DATASET_UNLABELED : 0);
}

int run_check_image_size(const Config *cfg, const char *path, int h, int w) {
  if (h != cfg->data.image_size || w != cfg->data.image_size)
    return tl_fail("%s: images are %dx%d but [data] image_size = %d", path, h, w,
                   cfg->data.image_size);
  return 0;
}

int run_layout_set_images(RunLayout *L, const Config *cfg, int n_train) {
  L->n_train = n_train;
  if (n_train < L->global_batch)
    return tl_fail(
        "%s: %d training images, fewer than one batch of %d (give a smaller batch, "
        "e.g. --batch-size %d)",
        cfg->data.train, n_train, L->global_batch, n_train >= 16 ? 16 : n_train);
  L->steps_per_epoch = n_train / L->global_batch;
  return config_total_steps(cfg, L->steps_per_epoch, &L->total_steps);
}

// Shard sizes from [parallel] shard_weights ("1,3": proportional, rounded, the last takes the
// rest): sizes (world) sum to global_batch. -1 with tl_last_error() on a bad list or an empty
// shard.
static int shard_sizes_from_weights(const char *weights, int world, int global_batch, int *sizes) {
  double w[CONFIG_MAX_REPLICAS], total = 0;
  int n = 0;
  for (const char *p = weights; *p && n < CONFIG_MAX_REPLICAS;) {
    char *end;
    w[n] = strtod(p, &end);
    if (end == p || w[n] <= 0)
      return tl_fail("[parallel] shard_weights = '%s': not positive numbers", weights);
    total += w[n++];
    p = *end == ',' ? end + 1 : end;
  }
  if (n != world)
    return tl_fail("[parallel] shard_weights has %d entries for %d replicas", n, world);
  int assigned = 0;
  for (int r = 0; r < n; r++) {
    sizes[r] = r + 1 == n ? global_batch - assigned : (int)floor(global_batch * w[r] / total + 0.5);
    if (sizes[r] < 1) return tl_fail("[parallel] shard_weights gives replica %d no samples", r);
    assigned += sizes[r];
  }
  return 0;
}

int run_layout_set_shards(RunLayout *L, const Config *cfg) {
  const char *weights = cfg->parallel.shard_weights;
  if (!weights[0]) return 0;
  if (shard_sizes_from_weights(weights, L->world, L->global_batch, L->shard_sizes) != 0) return -1;
  L->has_shard_sizes = 1;
  return 0;
}

RunShard run_layout_shard(const RunLayout *L, int rank) {
  RunShard s = {.global = L->global_batch};
  if (L->has_shard_sizes) {
    for (int r = 0; r < rank; r++) s.offset += L->shard_sizes[r];
    s.local = L->shard_sizes[rank];
    return s;
  }
  // As even as possible: the first ranks take one sample more.
  const int base = L->global_batch / L->world, extra = L->global_batch % L->world;
  s.local = base + (rank < extra);
  s.offset = rank * base + (rank < extra ? rank : extra);
  return s;
}

double run_shard_to_global(const RunShard *s, double per_shard) {
  return per_shard * s->global / (double)s->local;
}

double run_shard_weight(const RunShard *s) { return (double)s->local / s->global; }

double run_step_flops(const RunShard *s, const LedgerRecord *rec) {
  return run_shard_to_global(s, rec->flops_forward + rec->flops_backward);
}

int run_threads_per_replica(int world) {
  const int ncores = omp_get_num_procs();
  return ncores / world > 0 ? ncores / world : 1;
}

void run_split_threads(int world) { omp_set_num_threads(run_threads_per_replica(world)); }

typedef struct {
  void (*fn)(void *shared, int rank, Comm *comm);
  void *shared;
  int rank;
  Comm *comm;
} LocalReplica;

static void *local_replica_main(void *arg) {
  LocalReplica *r = arg;
  r->fn(r->shared, r->rank, r->comm);
  return NULL;
}

void run_local_replicas(int world, void (*fn)(void *shared, int rank, Comm *comm), void *shared) {
  LocalGroup *group = comm_local_group_create(world);
  LocalReplica reps[CONFIG_MAX_REPLICAS];
  pthread_t threads[CONFIG_MAX_REPLICAS];
  for (int r = 0; r < world; r++) {
    reps[r] = (LocalReplica){fn, shared, r, comm_local_rank(group, r)};
    const int rc = r > 0 ? pthread_create(&threads[r], NULL, local_replica_main, &reps[r]) : 0;
    if (rc != 0)
      tl_fatal_input(
          "cannot start replica %d's thread: %s (too little memory or address space for "
          "its stack: an address-space limit, ulimit -v?)",
          r, strerror(rc));
  }
  local_replica_main(&reps[0]);
  for (int r = 1; r < world; r++) pthread_join(threads[r], NULL);
  for (int r = 0; r < world; r++) comm_destroy(reps[r].comm);
  comm_local_group_destroy(group);
}

void run_memory_snapshot(MemSnapshot s) {
  for (int c = 0; c < MEM_NCAT; c++)
    for (int k = 0; k < COMP_NCOMP; k++)
      s[c][k] = tl_mem_live_comp((MemCategory)c, (MemComponent)k);
}

size_t run_memory_category(MemSnapshot s, MemCategory c) {
  size_t sum = 0;
  for (int k = 0; k < COMP_NCOMP; k++) sum += s[c][k];
  return sum;
}

void run_fill_memory(LedgerRecord *r, MemSnapshot m) {
  r->activation_bytes = run_memory_category(m, MEM_ACT);
  for (int k = 0; k < COMP_NCOMP; k++) r->activation_bytes_by[k] = m[MEM_ACT][k];
  r->activation_grad_bytes = run_memory_category(m, MEM_ACT_GRAD);
  r->param_bytes = run_memory_category(m, MEM_PARAM);
  r->grad_bytes = run_memory_category(m, MEM_GRAD);
  r->optimizer_bytes = run_memory_category(m, MEM_OPTIM);
  r->momentum_encoder_bytes = run_memory_category(m, MEM_MOMENTUM);
  r->workspace_bytes = run_memory_category(m, MEM_WORKSPACE);
}
