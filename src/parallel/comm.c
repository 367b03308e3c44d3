// The backend-independent layer of the collectives: checks, failure short-circuit, accounting.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "parallel/comm_backend.h"

double comm_allreduce_bytes(int world, size_t payload_bytes) {
  return 4.0 * (world - 1) / world * (double)payload_bytes;
}

double comm_allgather_bytes(int world, size_t local_bytes, size_t total_bytes) {
  return (double)(world - 1) * (double)local_bytes + (double)(total_bytes - local_bytes);
}

double comm_broadcast_bytes(int world, int is_root, size_t bytes) {
  return is_root ? (double)(world - 1) * (double)bytes : world > 1 ? (double)bytes : 0.0;
}

// `completed`: 1 when this call finished a collective, 0 for the start and progress calls of the
// non-blocking sums (they count once, in comm_wait_all).
static void account(Comm *c, CollectiveKind kind, int completed, double bytes, double start_ms) {
  c->stats.calls[kind] += completed;
  c->stats.bytes[kind] += bytes;
  c->stats.ms[kind] += now_ms() - start_ms;
}

int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->world; }
const char *comm_backend(const Comm *c) { return c->backend->name; }

void comm_allreduce_weighted(Comm *c, float *buf, size_t n, double local_weight) {
  if (comm_failed(c)) return;
  // A weight is a sample count: anything else would silently skew every replica's step.
  if (!(local_weight >= 0) || isinf(local_weight)) {
    char why[128];
    snprintf(why, sizeof why, "allreduce_weighted: weight %g is not a finite count >= 0",
             local_weight);
    comm_abort(c, why);
    return;
  }
  double start_ms = now_ms();
  if (c->dry_run || c->backend->allreduce_weighted(c, buf, n, local_weight) == 0)
    account(c, COLL_ALLREDUCE, 1, comm_allreduce_bytes(c->world, n * sizeof *buf), start_ms);
}

void comm_allreduce_sum_f64(Comm *c, double *buf, size_t n) {
  if (comm_failed(c)) return;
  double start_ms = now_ms();
  if (c->backend->allreduce_sum_f64(c, buf, n) == 0)
    account(c, COLL_ALLREDUCE, 1, comm_allreduce_bytes(c->world, n * sizeof *buf), start_ms);
}

// A planned gather's offset and total: every rank's count, summed into its own slot.
static int dry_gather_counts(Comm *c, size_t n_local, size_t *offset, size_t *total) {
  double *counts = calloc((size_t)c->world, sizeof *counts);
  if (!counts) TL_DIE("out of memory");
  counts[c->rank] = (double)n_local;
  int rc = c->backend->allreduce_sum_f64(c, counts, (size_t)c->world);
  *offset = *total = 0;
  for (int r = 0; r < c->world && rc == 0; r++) {
    if (r < c->rank) *offset += (size_t)counts[r];
    *total += (size_t)counts[r];
  }
  free(counts);
  return rc;
}

void comm_allgather(Comm *c, const float *local, size_t n_local, float *out, size_t out_cap,
                    size_t *offset) {
  if (comm_failed(c)) return;
  double start_ms = now_ms();
  size_t total_count = 0, my_offset = 0;
  if (c->dry_run) {
    if (dry_gather_counts(c, n_local, &my_offset, &total_count) != 0) return;
    if (total_count > out_cap) {
      char why[160];
      snprintf(why, sizeof why, "allgather: the ranks send %zu floats, rank %d holds %zu",
               total_count, c->rank, out_cap);
      comm_abort(c, why);
      return;
    }
  } else if (c->backend->allgather(c, local, n_local, out, out_cap, &my_offset, &total_count) !=
             0) {
    return;
  }
  if (offset) *offset = my_offset;
  account(c, COLL_ALLGATHER, 1,
          comm_allgather_bytes(c->world, n_local * sizeof *local, total_count * sizeof *local),
          start_ms);
}

void comm_broadcast(Comm *c, void *buf, size_t bytes, int root) {
  if (comm_failed(c)) return;
  if (root < 0 || root >= c->world) {
    char why[128];
    snprintf(why, sizeof why, "broadcast: root %d is not a rank of a world of %d", root, c->world);
    comm_abort(c, why);
    return;
  }
  double start_ms = now_ms();
  if (c->dry_run || c->backend->broadcast(c, buf, bytes, root) == 0)
    account(c, COLL_BROADCAST, 1, comm_broadcast_bytes(c->world, c->rank == root, bytes), start_ms);
}

void comm_barrier(Comm *c) {
  if (comm_failed(c)) return;
  c->backend->barrier(c);
}

int comm_has_async(const Comm *c) { return c->backend->iallreduce_sum_f32 != NULL; }

void comm_iallreduce_sum(Comm *c, float *buf, size_t n) {
  if (!comm_has_async(c))
    TL_DIE("comm_iallreduce_sum: the %s backend has no non-blocking collectives", c->backend->name);
  if (comm_failed(c)) return;
  double start_ms = now_ms();
  if (c->dry_run || c->backend->iallreduce_sum_f32(c, buf, n) == 0) {
    c->started_payload_bytes += n * sizeof *buf;
    account(c, COLL_ALLREDUCE, 0, 0, start_ms);
  }
}

void comm_test_all(Comm *c) {
  if (!c->backend->test_all || comm_failed(c)) return;
  double start_ms = now_ms();
  if (c->backend->test_all(c) == 0) account(c, COLL_ALLREDUCE, 0, 0, start_ms);
}

void comm_wait_all(Comm *c) {
  if (!c->backend->wait_all || comm_failed(c)) return;
  double start_ms = now_ms();
  if (c->backend->wait_all(c) == 0)
    account(c, COLL_ALLREDUCE, c->started_payload_bytes > 0,
            comm_allreduce_bytes(c->world, c->started_payload_bytes), start_ms);
  c->started_payload_bytes = 0;
}

void comm_abort(Comm *c, const char *why) { c->backend->abort(c, why); }

void comm_set_timeout(Comm *c, double seconds) {
  if (c->backend->set_timeout) c->backend->set_timeout(c, seconds);
}

void comm_solo_begin(Comm *c, int root, const char *phase) {
  if (!comm_failed(c) && c->backend->solo_begin) c->backend->solo_begin(c, root, phase);
}

void comm_solo_end(Comm *c, int root) {
  if (!comm_failed(c) && c->backend->solo_end) c->backend->solo_end(c, root);
}

int comm_failed(const Comm *c) { return c->backend->failure(c) != NULL; }

const char *comm_failure(const Comm *c) {
  const char *why = c->backend->failure(c);
  return why ? why : "";
}

void comm_set_dry_run(Comm *c, int dry_run) { c->dry_run = dry_run; }
int comm_dry_run(const Comm *c) { return c->dry_run; }

void comm_stats_reset(Comm *c) { memset(&c->stats, 0, sizeof c->stats); }

CommStats comm_stats(const Comm *c) { return c->stats; }

void comm_destroy(Comm *c) {
  if (c) c->backend->destroy(c);
}
