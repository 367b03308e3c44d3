#include "parallel/grad_sync.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"

typedef struct {
  size_t offset, count;  // grad floats [offset, offset + count)
  size_t trainable;      // floats of its non-buffer entries: the reports that complete it
  size_t reported;       // floats reported since grad_sync_begin
} Bucket;

struct GradSync {
  Comm *comm;
  ParamSet *ps;
  Bucket *buckets;  // [n_buckets] by decreasing offset: bucket 0 ends at the end of the block
  int n_buckets;
  int n_started;        // buckets 0 .. n_started - 1 have their sums started this step
  int active;           // between grad_sync_begin and grad_sync_finish
  double local_weight;  // this replica's samples this step
  double share;         // local_weight / the global batch
};

GradSync *grad_sync_create(Comm *c, ParamSet *ps, size_t bucket_bytes) {
  TL_ASSERT(ps->grad && bucket_bytes > 0);
  GradSync *gs = calloc(1, sizeof *gs);
  // At most one bucket per entry; one for a set without entries.
  Bucket *buckets = calloc((size_t)ps->n_entries + 1, sizeof *buckets);
  if (!gs || !buckets)
    TL_DIE("out of memory for the buckets of %d parameter tensors", ps->n_entries);
  gs->comm = c;
  gs->ps = ps;
  gs->buckets = buckets;
  // Floats past the last entry (none when the model sized its block exactly) join bucket 0;
  // nothing reports them, so they count as untrainable.
  size_t end = ps->count, trainable = 0;
  for (int i = ps->n_entries - 1; i >= 0; i--) {
    const ParamEntry *e = &ps->entries[i];
    if (!e->is_buffer) trainable += e->count;
    if ((end - e->offset) * sizeof(float) >= bucket_bytes || i == 0) {
      buckets[gs->n_buckets++] =
          (Bucket){.offset = e->offset, .count = end - e->offset, .trainable = trainable};
      end = e->offset;
      trainable = 0;
    }
  }
  if (gs->n_buckets == 0) buckets[gs->n_buckets++] = (Bucket){.count = ps->count};
  return gs;
}

static int bucket_complete(const Bucket *k) { return k->reported == k->trainable; }

// Scales the next bucket to this replica's share and starts its sum.
static void start_next(GradSync *gs) {
  const Bucket *k = &gs->buckets[gs->n_started++];
  // (count) this bucket's gradients
  float *grad = gs->ps->grad + k->offset;
  for (size_t i = 0; i < k->count; i++) grad[i] = (float)(grad[i] * gs->share);
  comm_iallreduce_sum(gs->comm, grad, k->count);
}

static void start_completed(GradSync *gs) {
  if (!comm_has_async(gs->comm)) return;
  while (gs->n_started < gs->n_buckets && bucket_complete(&gs->buckets[gs->n_started]))
    start_next(gs);
}

// The bucket holding grad float `at`: the first with offset <= at (offsets decrease).
static int bucket_holding(const GradSync *gs, size_t at) {
  int lo = 0, hi = gs->n_buckets - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (gs->buckets[mid].offset > at)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void on_grad_ready(void *user, size_t offset, size_t count) {
  GradSync *gs = user;
  size_t end = offset + count;
  // A reported slice is one entry, so it lies in one bucket; a longer one is split over the
  // buckets it spans, which lie above `offset` and so have lower indices.
  for (int b = bucket_holding(gs, offset); b >= 0 && gs->buckets[b].offset < end; b--) {
    Bucket *k = &gs->buckets[b];
    size_t lo = offset > k->offset ? offset : k->offset;
    size_t hi = end < k->offset + k->count ? end : k->offset + k->count;
    k->reported += hi - lo;
    // Its sum may already be running on the values: a late write would be lost or half-sent.
    if (k->reported > k->trainable)
      TL_DIE(
          "grad_sync: gradient floats [%zu, %zu) reported twice in one step, or they belong "
          "to a buffer",
          offset, end);
  }
  start_completed(gs);
  if (gs->n_started > 0) comm_test_all(gs->comm);
}

static void detach(GradSync *gs) {
  gs->ps->grad_ready = NULL;
  gs->ps->grad_ready_user = NULL;
  gs->active = 0;
}

void grad_sync_begin(GradSync *gs, double local_weight, double total_weight) {
  if (gs->active) TL_DIE("grad_sync_begin: the previous step was not finished");
  // A weight is a sample count: anything else would silently skew every replica's step. After
  // the abort the collectives do nothing, so the step still runs to its end.
  if (!(local_weight >= 0 && local_weight <= total_weight && total_weight > 0) ||
      isinf(total_weight)) {
    char why[160];
    snprintf(why, sizeof why,
             "grad_sync: weights %g of %g are not sample counts of a nonempty global batch",
             local_weight, total_weight);
    comm_abort(gs->comm, why);
  }
  for (int b = 0; b < gs->n_buckets; b++) gs->buckets[b].reported = 0;
  gs->n_started = 0;
  gs->local_weight = local_weight;
  gs->share = local_weight / total_weight;
  gs->active = 1;
  gs->ps->grad_ready = on_grad_ready;
  gs->ps->grad_ready_user = gs;
  // Buckets of buffers only have nothing to wait for.
  start_completed(gs);
}

void grad_sync_finish(GradSync *gs) {
  TL_ASSERT(gs->active);
  if (comm_has_async(gs->comm)) {
    while (gs->n_started < gs->n_buckets) start_next(gs);
    comm_wait_all(gs->comm);
  } else {
    comm_allreduce_weighted(gs->comm, gs->ps->grad, gs->ps->count, gs->local_weight);
  }
  detach(gs);
}

void grad_sync_destroy(GradSync *gs) {
  if (!gs) return;
  if (gs->active) {
    comm_wait_all(gs->comm);
    detach(gs);
  }
  free(gs->buckets);
  free(gs);
}

int grad_sync_bucket_count(const GradSync *gs) { return gs->n_buckets; }

void grad_sync_bucket_range(const GradSync *gs, int b, size_t *offset, size_t *count) {
  TL_ASSERT(b >= 0 && b < gs->n_buckets);
  *offset = gs->buckets[b].offset;
  *count = gs->buckets[b].count;
}

int grad_sync_bucket_complete(const GradSync *gs, int b) {
  TL_ASSERT(b >= 0 && b < gs->n_buckets);
  return bucket_complete(&gs->buckets[b]);
}

int grad_sync_buckets_started(const GradSync *gs) { return gs->n_started; }
