// Local backend: `world` replicas as threads of one process, exchanging data through shared
// memory. Every collective has the same shape:
//   1. each rank publishes its arguments (buffer pointers, count, weight) in its slot;
//   2. barrier (abortable): from here on every rank sees every slot;
//   3. each rank checks the slots (all ranks reach the same verdict, so they fail together) and
//      does its share of the work, touching only memory no other rank touches in this phase;
//   4. barrier (not abortable, see group_barrier): no rank returns, and so frees or reuses its
//      buffer, while another may still read or write it.
// Reductions are split into `world` disjoint chunks of the vector; rank r reduces chunk r over
// all ranks in rank order and writes the result into every rank's buffer, so each element is
// computed exactly once and every rank ends with bit-identical values, independent of timing.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/comm_backend.h"

// One rank's arguments to the collective in progress.
typedef struct {
  const void *src;  // what the rank contributes
  void *dst;        // where its result goes (the same buffer for in-place collectives)
  size_t count;     // elements (bytes for broadcast)
  double weight;    // allreduce_weighted only
  int root;         // broadcast only
  size_t capacity;  // allgather only: the floats dst holds
} LocalSlot;

struct LocalGroup {
  int world;
  pthread_mutex_t mutex;
  pthread_cond_t arrived_cv;
  int arrived;          // ranks waiting in the current barrier
  uint64_t generation;  // barriers completed; a waiter leaves when it changes
  int failed;
  char failure[COMM_FAILURE_CHARS];
  LocalSlot *slots;  // [world]
};

typedef struct {
  Comm base;
  LocalGroup *group;
} LocalComm;

static LocalGroup *group_of(const Comm *c) { return ((const LocalComm *)c)->group; }

// Records the first failure only: later ones are usually consequences of it.
static void group_fail(LocalGroup *g, int rank, const char *why) {
  pthread_mutex_lock(&g->mutex);
  if (!g->failed) {
    g->failed = 1;
    snprintf(g->failure, sizeof g->failure, "rank %d: %s", rank, why);
  }
  pthread_cond_broadcast(&g->arrived_cv);
  pthread_mutex_unlock(&g->mutex);
}

// Waits until all ranks have arrived; returns 0 then. An abortable barrier also returns -1 as soon
// as the group fails, which is what unblocks ranks waiting for a rank that will never come. The
// barrier that closes a collective must not be abortable: the ranks it waits for have all passed
// the opening barrier and run straight-line code from there, so they are sure to arrive, and
// leaving early would let a rank free a buffer another rank is still writing.
static int group_barrier(LocalGroup *g, int abortable) {
  pthread_mutex_lock(&g->mutex);
  if (abortable && g->failed) {
    pthread_mutex_unlock(&g->mutex);
    return -1;
  }
  uint64_t generation = g->generation;
  if (++g->arrived == g->world) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->arrived_cv);
  } else {
    while (generation == g->generation && !(abortable && g->failed))
      pthread_cond_wait(&g->arrived_cv, &g->mutex);
  }
  // Completion wins over a failure that raced with it, so all ranks agree on the outcome.
  int completed = generation != g->generation;
  pthread_mutex_unlock(&g->mutex);
  return completed ? 0 : -1;
}

// Steps 1 and 2 of every collective.
static int publish(Comm *c, LocalSlot mine) {
  LocalGroup *g = group_of(c);
  g->slots[c->rank] = mine;
  return group_barrier(g, 1);
}

// Step 3's check for the reductions: every rank must pass the same length.
static int counts_agree(Comm *c, const char *collective) {
  LocalGroup *g = group_of(c);
  for (int r = 1; r < g->world; r++) {
    if (g->slots[r].count != g->slots[0].count) {
      char why[160];
      snprintf(why, sizeof why, "%s: rank 0 passed %zu elements but rank %d passed %zu", collective,
               g->slots[0].count, r, g->slots[r].count);
      group_fail(g, c->rank, why);
      return 0;
    }
  }
  return 1;
}

// This rank's chunk [*lo, *hi) of n elements split as evenly as possible over the ranks.
static void my_chunk(const Comm *c, size_t n, size_t *lo, size_t *hi) {
  size_t base = n / c->world, extra = n % c->world, r = (size_t)c->rank;
  *lo = r * base + (r < extra ? r : extra);
  *hi = *lo + base + (r < extra ? 1 : 0);
}

static int local_allreduce_weighted(Comm *c, float *buf, size_t n, double local_weight) {
  LocalGroup *g = group_of(c);
  if (publish(c, (LocalSlot){.src = buf, .dst = buf, .count = n, .weight = local_weight}))
    return -1;
  if (!counts_agree(c, "allreduce_weighted")) return -1;
  double total_weight = 0;
  for (int r = 0; r < g->world; r++) total_weight += g->slots[r].weight;
  if (!(total_weight > 0)) {
    group_fail(g, c->rank, "allreduce_weighted: the weights of all ranks sum to 0");
    return -1;
  }
  // Blocks of the chunk are accumulated in double over the ranks in rank order.
  enum { BLOCK = 512 };
  double acc[BLOCK];
  size_t lo, hi;
  my_chunk(c, n, &lo, &hi);
  for (size_t start = lo; start < hi; start += BLOCK) {
    size_t len = hi - start < BLOCK ? hi - start : BLOCK;
    for (size_t i = 0; i < len; i++) acc[i] = 0;
    for (int r = 0; r < g->world; r++) {
      const float *x = (const float *)g->slots[r].src + start;
      double w = g->slots[r].weight;
      for (size_t i = 0; i < len; i++) acc[i] += w * x[i];
    }
    for (size_t i = 0; i < len; i++) acc[i] /= total_weight;
    for (int r = 0; r < g->world; r++) {
      float *y = (float *)g->slots[r].dst + start;
      for (size_t i = 0; i < len; i++) y[i] = (float)acc[i];
    }
  }
  return group_barrier(g, 0);
}

static int local_allreduce_sum_f64(Comm *c, double *buf, size_t n) {
  LocalGroup *g = group_of(c);
  if (publish(c, (LocalSlot){.src = buf, .dst = buf, .count = n})) return -1;
  if (!counts_agree(c, "allreduce_sum_f64")) return -1;
  size_t lo, hi;
  my_chunk(c, n, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    double sum = 0;
    for (int r = 0; r < g->world; r++) sum += ((const double *)g->slots[r].src)[i];
    for (int r = 0; r < g->world; r++) ((double *)g->slots[r].dst)[i] = sum;
  }
  return group_barrier(g, 0);
}

static int local_allgather(Comm *c, const float *local, size_t n_local, float *out, size_t out_cap,
                           size_t *offset, size_t *total_count) {
  LocalGroup *g = group_of(c);
  if (publish(c, (LocalSlot){.src = local, .dst = out, .count = n_local, .capacity = out_cap}))
    return -1;
  // Every rank checks every rank's capacity, so all of them stop before the closing barrier.
  size_t total = 0;
  for (int r = 0; r < g->world; r++) total += g->slots[r].count;
  for (int r = 0; r < g->world; r++)
    if (total > g->slots[r].capacity) {
      char why[160];
      snprintf(why, sizeof why, "allgather: the ranks send %zu floats, rank %d holds %zu", total, r,
               g->slots[r].capacity);
      group_fail(g, c->rank, why);
      return -1;
    }
  // Each rank copies every block into its own output: no two ranks write the same memory.
  size_t at = 0;
  for (int r = 0; r < g->world; r++) {
    if (r == c->rank) *offset = at;
    if (g->slots[r].count) memcpy(out + at, g->slots[r].src, g->slots[r].count * sizeof *out);
    at += g->slots[r].count;
  }
  *total_count = at;
  return group_barrier(g, 0);
}

static int local_broadcast(Comm *c, void *buf, size_t bytes, int root) {
  LocalGroup *g = group_of(c);
  if (publish(c, (LocalSlot){.src = buf, .dst = buf, .count = bytes, .root = root})) return -1;
  for (int r = 0; r < g->world; r++) {
    if (g->slots[r].root != root || g->slots[r].count != bytes) {
      char why[160];
      snprintf(why, sizeof why,
               "broadcast: rank %d passed root %d and %zu bytes, rank %d root %d and %zu bytes",
               c->rank, root, bytes, r, g->slots[r].root, g->slots[r].count);
      group_fail(g, c->rank, why);
      return -1;
    }
  }
  if (c->rank != root && bytes) memcpy(buf, g->slots[root].src, bytes);
  return group_barrier(g, 0);
}

static int local_barrier(Comm *c) { return group_barrier(group_of(c), 1); }

static void local_abort(Comm *c, const char *why) { group_fail(group_of(c), c->rank, why); }

static const char *local_failure(const Comm *c) {
  LocalGroup *g = group_of(c);
  pthread_mutex_lock(&g->mutex);
  // The message is written once, before `failed` is set, so it is safe to hand out.
  const char *why = g->failed ? g->failure : NULL;
  pthread_mutex_unlock(&g->mutex);
  return why;
}

static void local_destroy(Comm *c) { free(c); }

static const CommBackend local_backend = {
    .name = "local",
    .allreduce_weighted = local_allreduce_weighted,
    .allreduce_sum_f64 = local_allreduce_sum_f64,
    .allgather = local_allgather,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .abort = local_abort,
    .failure = local_failure,
    .destroy = local_destroy,
};

LocalGroup *comm_local_group_create(int world) {
  if (world < 1) {
    tl_fail("comm local: world must be at least 1 replica, got %d", world);
    return NULL;
  }
  LocalGroup *g = calloc(1, sizeof *g);
  LocalSlot *slots = calloc((size_t)world, sizeof *slots);
  if (!g || !slots) TL_DIE("out of memory for a local group of %d replicas", world);
  g->world = world;
  g->slots = slots;
  pthread_mutex_init(&g->mutex, NULL);
  pthread_cond_init(&g->arrived_cv, NULL);
  return g;
}

Comm *comm_local_rank(LocalGroup *g, int rank) {
  if (rank < 0 || rank >= g->world) {
    tl_fail("comm local: rank %d is not in a world of %d replicas", rank, g->world);
    return NULL;
  }
  LocalComm *lc = calloc(1, sizeof *lc);
  if (!lc) TL_DIE("out of memory for a local comm handle");
  lc->base = (Comm){.backend = &local_backend, .rank = rank, .world = g->world};
  lc->group = g;
  return &lc->base;
}

void comm_local_group_destroy(LocalGroup *g) {
  if (!g) return;
  pthread_cond_destroy(&g->arrived_cv);
  pthread_mutex_destroy(&g->mutex);
  free(g->slots);
  free(g);
}
