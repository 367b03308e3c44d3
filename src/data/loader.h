// Prefetching batch loader: while the current step trains, a background thread prepares the next
// batch (OpenMP across its samples). The epoch order is a permutation drawn from
// (seed, epoch), a replica's loader makes the shard of the global batch it is given, and each
// sample's views, group by group, come from augment_view with the group's augmentation and a stream
// keyed by (seed, global step, sample index, view over all groups).
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
  // This replica's shard, as the run cut the global batch (train/run_layout.h): its first
  // sample's place in the global batch and its samples.
  int shard_offset, shard_size;
  struct LoaderPrivate *priv;  // thread, double buffer, permutation
} Loader;

// Starts the prefetch thread; the first batch returned is for `start_step`. Each batch holds the
// samples shard_offset .. shard_offset + shard_size - 1 of the step's global batch.
int loader_init(Loader *l, const Dataset *ds, const ViewRecipe *views, int global_batch,
                uint64_t seed, int shard_offset, int shard_size, int start_step);
// Blocks until the next batch is ready; the pointer stays valid until the following call.
// Returns the time spent waiting in *wait_ms (may be NULL). NULL with tl_last_error() when the
// batch could not be made (a streamed image that no longer decodes: the error names the file);
// the loader makes no batch after that one.
const Batch *loader_next(Loader *l, double *wait_ms);
void loader_destroy(Loader *l);

enum { LOADER_MAX_VIEWS = 64 };

// MEM_DATA bytes loader_init allocates for one replica (both prefetch slots and the epoch
// permutation), from sizes alone: `tally plan` adds this without starting a loader.
size_t loader_buffer_bytes(int dataset_n, int shard_size, const ViewRecipe *views, int channels);
