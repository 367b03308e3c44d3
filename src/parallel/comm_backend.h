// What a collectives backend implements (private to src/parallel). comm.c dispatches every public
// call through these ops and does what all backends share: the short-circuit after a failure,
// argument checks every rank makes identically, and the bytes/time accounting.
#pragma once
#include "parallel/comm.h"

typedef struct {
  const char *name;
  // Each collective returns 0, or -1 when the group has failed (buffers then hold unspecified
  // values). Arguments arrive already checked by comm.c where a rank can check them alone.
  int (*allreduce_weighted)(Comm *c, float *buf, size_t n, double local_weight);
  int (*allreduce_sum_f64)(Comm *c, double *buf, size_t n);
  // *total_count receives the number of floats gathered over all ranks.
  int (*allgather)(Comm *c, const float *local, size_t n_local, float *out, size_t out_cap,
                   size_t *offset, size_t *total_count);
  int (*broadcast)(Comm *c, void *buf, size_t bytes, int root);
  int (*barrier)(Comm *c);
  void (*abort)(Comm *c, const char *why);
  // NULL while the group is healthy, else why it failed.
  const char *(*failure)(const Comm *c);
  void (*destroy)(Comm *c);
  // Non-blocking collectives, NULL when the backend has none (then comm_has_async is 0).
  // iallreduce_sum_f32 starts buf <- sum_r buf_r in place; test_all advances every started one
  // without blocking; wait_all completes them all. Same return convention as above.
  int (*iallreduce_sum_f32)(Comm *c, float *buf, size_t n);
  int (*test_all)(Comm *c);
  int (*wait_all)(Comm *c);
  // How long a rank may wait inside one collective for the others; NULL: the backend's ranks
  // cannot be lost (threads of one process).
  void (*set_timeout)(Comm *c, double seconds);
  // comm_solo_begin / comm_solo_end; NULL: the others simply wait at the next collective.
  void (*solo_begin)(Comm *c, int root, const char *phase);
  int (*solo_end)(Comm *c, int root);
} CommBackend;

// Every backend's handle embeds this as its first member, so a Comm * is also a pointer to the
// backend's own handle.
struct Comm {
  const CommBackend *backend;
  int rank, world;
  CommStats stats;
  // Payload of the non-blocking sums started and not yet waited for: their bytes and call are
  // counted as one allreduce of the total, so they equal the blocking allreduce's bit for bit
  // (the plan predicts that one).
  size_t started_payload_bytes;
  // A plan: collectives count what they would send and agree on sizes, but move no data.
  int dry_run;
};

// Length of a failure message, reason included.
enum { COMM_FAILURE_CHARS = 512 };
