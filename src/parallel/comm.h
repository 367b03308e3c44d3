// Collectives between replicas. A replica is a rank: replica code calls these and never knows
// which backend serves them.
//   local: N replicas as threads of one process (the default; N = 1 is a plain run)
//   mpi:   one replica per process under mpirun (Open MPI), possibly on several machines
// Every collective is called by all ranks in the same order. Bytes moved and time spent are
// counted per collective kind for the ledger.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { COLL_ALLREDUCE, COLL_ALLGATHER, COLL_BROADCAST, COLL_NKINDS } CollectiveKind;

typedef struct Comm Comm;

typedef struct {
  double bytes[COLL_NKINDS];  // bytes this rank sent + received, per kind, since the last reset
  double ms[COLL_NKINDS];     // wall time inside the collective, per kind; for non-blocking
                              // ones, inside the start, test and wait calls (see below)
  // Collectives completed, per kind: calls, not the messages a backend splits them into, because
  // the messages depend on the world size and the algorithm, and a prediction at N nodes needs
  // what does not: how many collectives a step makes, each paying the link's latency once per
  // round of its algorithm at N.
  long calls[COLL_NKINDS];
} CommStats;

// Local backend: creates the shared state for `world` thread replicas; each thread then calls
// comm_local_rank() with its rank to get its own handle.
typedef struct LocalGroup LocalGroup;
LocalGroup *comm_local_group_create(int world);
Comm *comm_local_rank(LocalGroup *g, int rank);
void comm_local_group_destroy(LocalGroup *g);

// MPI backend: MPI_Init (if not yet) and a handle for this process's rank. Returns NULL with
// tl_last_error() set if MPI is unavailable.
Comm *comm_mpi_create(int *argc, char ***argv);

int comm_rank(const Comm *c);
int comm_size(const Comm *c);
const char *comm_backend(const Comm *c);

// buf <- sum_r w_r * buf_r / sum_r w_r, with w_r = local_weight of rank r (its sample count).
// In place; every rank ends with bit-identical values (ranks reduce in the same order). One
// exchange on every backend: the weights travel with the values, so a call costs one message
// round, as a prediction of its latency counts it.
void comm_allreduce_weighted(Comm *c, float *buf, size_t n, double local_weight);
// buf <- sum_r buf_r (doubles, e.g. loss sums and counts).
void comm_allreduce_sum_f64(Comm *c, double *buf, size_t n);
// out <- concatenation over ranks of each rank's `n_local` floats; counts may differ by rank.
// out holds `out_cap` floats: a total beyond it stops every rank before anything is written;
// *offset receives this rank's offset in it (may be NULL).
void comm_allgather(Comm *c, const float *local, size_t n_local, float *out, size_t out_cap,
                    size_t *offset);
// buf on every rank <- buf on rank `root`.
void comm_broadcast(Comm *c, void *buf, size_t bytes, int root);
void comm_barrier(Comm *c);

// Non-blocking sums, so gradient averaging can overlap backward (parallel/grad_sync.h). Only
// backends that have them (mpi) say so here; on the others (local) callers use the blocking
// collectives. Like every collective, each rank starts the same sums in the same order.
// Accounting, under COLL_ALLREDUCE: bytes and one call as for one blocking allreduce of all the
// sums' payloads together, counted when comm_wait_all completes them (so a bucketed gradient
// average counts as the plan's single one; the buckets' latencies but the last hide behind
// backward with their bytes); time is what this rank spends inside comm_iallreduce_sum,
// comm_test_all and comm_wait_all, i.e. the communication that computation did not hide.
int comm_has_async(const Comm *c);
// Starts buf <- sum_r buf_r in place. buf must stay untouched until comm_wait_all returns.
void comm_iallreduce_sum(Comm *c, float *buf, size_t n);
// Lets the started sums advance without waiting: MPI moves data only inside MPI calls when it
// runs no progress thread, so call this between pieces of computation.
void comm_test_all(Comm *c);
// Returns when every started sum is complete.
void comm_wait_all(Comm *c);

// No rank waits forever for a peer that will never come (stopped, partitioned, its host gone):
// a rank inside one collective for longer than `seconds` says so and ends its process, which
// mpirun then ends every rank's. Backends whose ranks cannot be lost ignore it.
void comm_set_timeout(Comm *c, double seconds);

// A phase rank `root` does alone while the others wait for it (rank 0's checkpoint and
// evaluation): every rank calls both, in the same order, and the others return from
// comm_solo_end when the root has called it. In between the root tells the others, a few times
// within the timeout, that it is still at work, so a phase longer than the timeout is not taken
// for a lost rank; a root that stops answering is named with `phase` ("rank 0's kNN
// evaluation after step 40").
void comm_solo_begin(Comm *c, int root, const char *phase);
void comm_solo_end(Comm *c, int root);

// Stops every rank: any rank may call it; the others return from their next collective with
// a nonzero comm_failed(). Used so that one replica's error never leaves the others hanging.
void comm_abort(Comm *c, const char *why);
int comm_failed(const Comm *c);
const char *comm_failure(const Comm *c);

// Planning: from now on collectives count their bytes (and agree on gathered sizes) without
// reading or writing the buffers, which a plan only reserves.
void comm_set_dry_run(Comm *c, int dry_run);
int comm_dry_run(const Comm *c);
void comm_stats_reset(Comm *c);
CommStats comm_stats(const Comm *c);
void comm_destroy(Comm *c);

// The traffic model behind CommStats.bytes, the same for every backend (MPI does not report the
// bytes its algorithms move), so `tally plan` can predict it exactly: bytes one rank sends plus
// receives, payload only; 0 when world is 1. Not counted: a gather's exchange of counts, and the
// weight a weighted sum sends as one more float of its message (the bucketed gradient average
// sends none, and both must count alike: a plan of local replicas predicts an mpi run's bytes).
// allreduce: a ring (reduce-scatter then allgather), 2 (world-1)/world of the payload each way.
double comm_allreduce_bytes(int world, size_t payload_bytes);
// allgather: this rank's block goes to every other rank, every other block comes to this rank.
double comm_allgather_bytes(int world, size_t local_bytes, size_t total_bytes);
// broadcast: the root sends the buffer to each other rank; every other rank receives it once.
double comm_broadcast_bytes(int world, int is_root, size_t bytes);
