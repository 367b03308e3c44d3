// Prefetching batch loader: while the current step trains, a background thread prepares the next
// batch (OpenMP across its samples). The epoch order is a permutation drawn from
// (seed, epoch), the global batch is cut into shards by replica, and each sample's views, group
// by group, come from augment_view with the group's augmentation and a stream keyed by (seed,
// global step, sample index, view over all groups).
#pragma once
#include <pthread.h>
#include <stdint.h>

#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/views.h"

typedef struct {
  const Dataset *ds;
  ViewRecipe views;     // the groups of views each sample gets (data/views.h)
  int global_batch;     // samples per step over all replicas
  int steps_per_epoch;  // floor(ds->n / global_batch): the last partial batch is dropped
  uint64_t seed;
  int rank, world;             // this replica's shard
  const int *shard_sizes;      // (world) samples per replica per step, summing to global_batch;
                               // NULL = as even as possible (the first ranks get one more)
  struct LoaderPrivate *priv;  // thread, double buffer, permutation
} Loader;

// Starts the prefetch thread; the first batch returned is for `start_step`.
int loader_init(Loader *l, const Dataset *ds, const ViewRecipe *views, int global_batch,
                uint64_t seed, int rank, int world, const int *shard_sizes, int start_step);
// Blocks until the next batch is ready; the pointer stays valid until the following call.
// Returns the time spent waiting in *wait_ms (may be NULL). NULL with tl_last_error() when the
// batch could not be made (a streamed image that no longer decodes: the error names the file);
// the loader makes no batch after that one.
const Batch *loader_next(Loader *l, double *wait_ms);
void loader_destroy(Loader *l);

// Shard sizes from [parallel] shard_weights ("1,3": proportional, rounded, the last takes the
// rest): sizes (world) sum to global_batch. -1 with tl_last_error() on a bad list or an empty
// shard.
enum { LOADER_MAX_SHARDS = 64, LOADER_MAX_VIEWS = 64 };
int loader_shard_sizes_from_weights(const char *weights, int world, int global_batch, int *sizes);

// MEM_DATA bytes loader_init allocates for one replica (both prefetch slots and the epoch
// permutation), from sizes alone: `tally plan` adds this without starting a loader.
size_t loader_buffer_bytes(int dataset_n, int shard_size, const ViewRecipe *views, int channels);

// Shard of replica `rank` in a global batch: its first sample's offset and its size.
void loader_shard(int global_batch, int rank, int world, const int *shard_sizes, int *offset,
                  int *size);
