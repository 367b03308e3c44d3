// Local replicas for the tests that split one batch over several: each replica on a thread of its
// own, all of them started before any is joined, since a collective returns only once every
// member of the group has entered it.
#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec_ctx.h"
#include "parallel/comm.h"

enum { REPLICA_THREADS_MAX = 8 };

// replica(&args[r]) for every r < world at once, args an array of `arg_bytes`-byte elements;
// returns when every replica has.
static inline void run_on_threads(int world, void *(*replica)(void *), void *args,
                                  size_t arg_bytes) {
  pthread_t ids[REPLICA_THREADS_MAX];
  assert_true(world >= 1 && world <= REPLICA_THREADS_MAX);
  for (int r = 0; r < world; r++)
    assert_int_equal(pthread_create(&ids[r], NULL, replica, (char *)args + (size_t)r * arg_bytes),
                     0);
  for (int r = 0; r < world; r++) pthread_join(ids[r], NULL);
}

// ---- a loss over the global batch, split over replicas ----
// A fixture of `views` views of n samples (rows of d floats), a loss over all of them, and
// replicas that each hold samples [first, first + b) of every view, its rows view-major. The
// loss is the test's (init, run, destroy: callbacks on a LossReplica); which rows go where, the
// threads, and what is kept for the assertions are the harness's.
typedef struct LossReplica LossReplica;

typedef struct {
  int n, d, views;                // samples of the fixture, row width, views of each sample
  const float *const *view;       // view[v]: (n, d) the fixture's rows of view v
  size_t loss_bytes;              // the loss's state, r->loss
  size_t terms_bytes;             // what run reports beside its value, r->terms (0: nothing)
  void (*init)(LossReplica *r);   // builds r->loss for r->b of the n samples
  double (*run)(LossReplica *r);  // forward and backward: r->z -> value, r->dz, r->terms
  void (*destroy)(LossReplica *r);
} LossHarness;

struct LossReplica {
  const LossHarness *h;
  LocalGroup *group;
  int rank, first, b;
  ExecCtx ctx;
  Comm *comm;
  void *loss, *terms;
  float *z, *dz;  // (views b, d): this replica's rows of view 0, then of view 1, ...
  double value;
};

static inline void loss_replica_open(LossReplica *r) {
  const LossHarness *h = r->h;
  const size_t rows = (size_t)h->views * r->b;
  r->comm = comm_local_rank(r->group, r->rank);
  exec_ctx_init(&r->ctx);
  r->loss = calloc(1, h->loss_bytes);
  r->terms = h->terms_bytes ? calloc(1, h->terms_bytes) : NULL;
  r->z = calloc(rows * h->d, sizeof(float));
  r->dz = calloc(rows * h->d, sizeof(float));
  for (int v = 0; v < h->views; v++)
    memcpy(r->z + (size_t)v * r->b * h->d, h->view[v] + (size_t)r->first * h->d,
           sizeof(float) * r->b * h->d);
  h->init(r);
}

// The loss on r->z as it stands (gradcheck's callback).
static inline double loss_replica_run(void *arg) {
  LossReplica *r = arg;
  r->value = r->h->run(r);
  return r->value;
}

// Releases the loss, keeping z, dz, terms and value for the assertions.
static inline void loss_replica_close(LossReplica *r) {
  r->h->destroy(r);
  free(r->loss);
  exec_ctx_destroy(&r->ctx);
  comm_destroy(r->comm);
}

static inline void loss_replica_free(LossReplica *r) {
  free(r->terms);
  free(r->z);
  free(r->dz);
}

static inline void *loss_replica_thread(void *arg) {
  loss_replica_open(arg);
  loss_replica_run(arg);
  loss_replica_close(arg);
  return NULL;
}

// The loss over the fixture's n samples split into `world` consecutive shards of `sizes`, each on
// its own thread replica; reps (world) keep what each computed (loss_replica_free each after).
static inline void loss_replicas_run(const LossHarness *h, int world, const int *sizes,
                                     LossReplica *reps) {
  LocalGroup *g = comm_local_group_create(world);
  for (int r = 0, first = 0; r < world; first += sizes[r++])
    reps[r] = (LossReplica){.h = h, .group = g, .rank = r, .first = first, .b = sizes[r]};
  run_on_threads(world, loss_replica_thread, reps, sizeof reps[0]);
  comm_local_group_destroy(g);
}
