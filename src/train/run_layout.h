// The shape of a training run, drawn from its configuration in one place for `tally train`
// (train/trainer.c) and `tally plan` (train/plan.c): the objective, the check of the images'
// geometry, the steps of an epoch and of the run, the replicas and their shards of the global
// batch, and the threads each replica gets. A plan describes the run the trainer would start
// because both take these numbers from here. The image size and channels are read from the
// configuration itself ([data]), which is their one place.
#pragma once
#include <stddef.h>

#include "config.h"
#include "core/alloc.h"
#include "ledger/record.h"
#include "objectives/objective.h"
#include "parallel/comm.h"

typedef struct {
  const ObjectiveDef *def;
  int world;            // replicas: [parallel] replicas, or the rank count under the mpi backend
  int global_batch;     // [train] batch_size: images a step takes over every replica
  int n_train;          // training images (after [data] limit); 0 until run_layout_set_images
  int steps_per_epoch;  // whole global batches in the training set
  int total_steps;      // [train] steps or epochs (a budget's length is settled by training)
  int shard_sizes[CONFIG_MAX_REPLICAS];  // [parallel] shard_weights, when given
  int has_shard_sizes;
} RunLayout;

// One replica's part of the global batch.
typedef struct {
  int offset;  // its first sample's place in the global batch
  int local;   // its samples
  int global;  // the global batch's
} RunShard;

// The objective called `name`; NULL with tl_last_error() naming the choices when there is none.
const ObjectiveDef *run_objective(const char *name);

// The layout's objective, replicas and batch from cfg. -1 with tl_last_error() when the batch
// cannot be split over the replicas (a shard of 0).
int run_layout_init(RunLayout *L, const Config *cfg, const ObjectiveDef *def, int world);

// Training images of `path` read as h x w must be [data] image_size square. -1 with
// tl_last_error() otherwise.
int run_check_image_size(const Config *cfg, const char *path, int h, int w);

// How the run's own training folder is listed and read: DATASET_STREAM for data.stream = 1,
// DATASET_UNLABELED for data.labels = none (subfolders are not classes).
int dataset_flags(const Config *cfg);

// The training set's size, and what follows from it: the steps of an epoch and of the run. -1
// with tl_last_error() when it holds fewer images than one batch, or the run's length is invalid.
int run_layout_set_images(RunLayout *L, const Config *cfg, int n_train);

// The shards from [parallel] shard_weights (nothing when it is empty; the batch is then split
// evenly). -1 with tl_last_error() on a bad list.
int run_layout_set_shards(RunLayout *L, const Config *cfg);

// Replica `rank`'s shard, computed here alone: its replica and its loader take this one.
RunShard run_layout_shard(const RunLayout *L, int rank);

// A per-sample count of one shard scaled to the global batch: `per_shard` x global / local. The
// global/local batch ratio is computed here alone (FLOPs of every replica from rank 0's, the
// BatchNorm statistics' weight), always in this order, so sums of it are the same bits everywhere.
double run_shard_to_global(const RunShard *s, double per_shard);
// The shard's share of the global batch: local / global.
double run_shard_weight(const RunShard *s);
// The FLOPs of a step over every replica, from one shard's record (forward and backward).
double run_step_flops(const RunShard *s, const LedgerRecord *rec);

// The OpenMP threads a replica gets: the cores this process may run on (its affinity, as
// taskset sets it) split evenly over the world's replicas, at least one. oneDNN splits its
// reductions by thread, so a run's numbers depend on this count: checkpoints and summaries
// record it.
int run_threads_per_replica(int world);
// Sets this thread's OpenMP threads to run_threads_per_replica(world), as every replica of a
// local run and every planned one takes them.
void run_split_threads(int world);

// Runs fn(shared, rank, comm) for every rank of a local group of `world` replicas, rank 0 on the
// calling thread (an objective's error message stays on it) and the others on threads of their
// own; returns once all have, with their communicators and the group destroyed.
void run_local_replicas(int world, void (*fn)(void *shared, int rank, Comm *comm), void *shared);

// Live bytes by category and component.
typedef size_t MemSnapshot[MEM_NCAT][COMP_NCOMP];
void run_memory_snapshot(MemSnapshot s);
size_t run_memory_category(MemSnapshot s, MemCategory c);
// The training memory of a ledger record from a snapshot: activations (by component) and their
// gradients, parameters, gradients, optimizer, momentum encoder and workspace.
void run_fill_memory(LedgerRecord *rec, MemSnapshot m);
