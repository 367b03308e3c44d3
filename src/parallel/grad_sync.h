// Gradient averaging overlapped with backward, as PyTorch's DistributedDataParallel does it.
// The gradient block of one ParamSet is cut into buckets of about `bucket_bytes`, laid out from
// the END of the block because backward produces the last layers' gradients first. Ops report
// each gradient slice as soon as they have written it (paramset_grad_ready); when every
// trainable float of a bucket has been reported, the bucket is scaled by this replica's share
// of the global batch, w / W, and a non-blocking sum over the replicas starts on it while
// backward goes on. grad_sync_finish then waits for all of them, and first starts any bucket
// that never completed (parameters unused this step). The result is the weighted mean
// sum_r w_r grad_r / W, as comm_allreduce_weighted computes it, up to float rounding.
//
// Buckets start strictly in index order on every rank, whatever order the reports arrive in:
// MPI matches collectives by the order they are called, so all ranks must start the same
// buckets in the same sequence even if their backward passes report slices differently.
//
// On a backend without non-blocking collectives (local threads) nothing starts early: finish
// does the blocking comm_allreduce_weighted of the whole block, as before.
#pragma once
#include <stddef.h>

#include "core/params.h"
#include "parallel/comm.h"

typedef struct GradSync GradSync;

// Lays the buckets out over ps's grad block, from its entries: a bucket is closed at the first
// entry boundary where it reaches bucket_bytes, so no tensor is split and a tensor larger than
// bucket_bytes has a bucket of its own. ps must have all its entries taken and a grad block.
GradSync *grad_sync_create(Comm *c, ParamSet *ps, size_t bucket_bytes);
// Frees the bucketer; a step begun and not finished is waited for first (every rank started
// the same sums, so the wait ends), and ps's callback is removed.
void grad_sync_destroy(GradSync *gs);

// Before backward: installs the callback on ps and zeroes the counts. local_weight = this
// replica's samples, total_weight = the global batch (the sum over replicas of local_weight).
// Invalid weights stop every rank through comm_abort, as in comm_allreduce_weighted.
void grad_sync_begin(GradSync *gs, double local_weight, double total_weight);
// After backward: ps->grad holds the weighted mean over the replicas; ps's callback is removed.
void grad_sync_finish(GradSync *gs);

// The layout and its progress, for tests, and for a plan predicting the overlap (on a backend
// without non-blocking sums nothing starts, but reports still complete buckets). Bucket 0 ends
// at the end of the block.
int grad_sync_bucket_count(const GradSync *gs);
// Bucket b covers grad floats [*offset, *offset + *count).
void grad_sync_bucket_range(const GradSync *gs, int b, size_t *offset, size_t *count);
// 1 once every trainable float of bucket b has been reported since grad_sync_begin.
int grad_sync_bucket_complete(const GradSync *gs, int b);
// Buckets whose sums have started since grad_sync_begin: they are 0 .. this - 1.
int grad_sync_buckets_started(const GradSync *gs);
