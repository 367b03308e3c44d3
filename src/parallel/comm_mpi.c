// MPI backend: one replica per process under mpirun. Collectives run on a duplicate of
// MPI_COMM_WORLD whose error handler returns error codes, so an MPI error becomes a comm_abort
// with a message saying which collective failed and why. OpenMP threads compute, they never
// communicate.
//
// Open MPI's TCP transport moves a message only while some thread of the process is inside an MPI
// call: a gradient bucket started during backward would otherwise advance only at the next
// gradient report (comm_test_all), and a binomial sum's turn from reduce to broadcast, or a
// receiver draining its socket, would wait for it. So while non-blocking sums are outstanding a
// progress thread calls MPI_Testall every PROGRESS_PERIOD_NS and sleeps in between (a few
// microseconds of CPU a call); with nothing outstanding it waits on a condition variable and
// costs nothing. Every MPI call of the backend holds `lock` (MPI_THREAD_SERIALIZED: never two
// threads in MPI at once). A library that offers only MPI_THREAD_FUNNELED gets no thread, and
// comm_test_all drives the sums as before.
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "parallel/comm_backend.h"

typedef struct {
  Comm base;
  MPI_Comm comm;
  unsigned long long *gathered_counts;  // [world] allgather: floats contributed by each rank
  int *recv_counts, *displs;            // [world] the same, and offsets, as MPI wants them
  MPI_Request *started;                 // [cap_started] non-blocking sums not yet waited for
  int n_started, cap_started;
  // A weighted sum's values and weight, sent together: grown to the largest sum so far. Open
  // MPI's own buffers are not in the ledger either; Tally's large sum (the gradient) goes
  // through the non-blocking buckets; this holds BatchNorm statistics and inbatch's columns.
  float *packed;
  size_t cap_packed;
  char failure[COMM_FAILURE_CHARS];
  // The progress thread (has_progress): it polls while n_started > 0 and it has seen no error
  // (an error is left to MPI_Waitall, whose caller reports it); `stop` ends it.
  int has_progress, stop, poll_failed;
  pthread_t progress;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  // The watchdog (comm_set_timeout): which blocking call this rank is in and since when (0: none),
  // read by a thread of its own once a second.
  _Atomic long long waiting_since_ns;
  const char *_Atomic waiting_in;
  double timeout_s;
  int has_watchdog, watchdog_stop;  // watchdog_stop under watchdog_lock
  pthread_t watchdog;
  pthread_mutex_t watchdog_lock;
  pthread_cond_t watchdog_wake;
  // A phase one rank computes alone (comm_solo_begin): the rank the wait is for (-1: all) and
  // what it is doing, for the watchdog's message; on that rank a thread that tells the others
  // it is alive (has_beats; beats_stop under watchdog_lock), on a communicator of its own.
  _Atomic int waiting_for;
  char solo_phase[160];
  MPI_Comm beats;
  int has_beats, beats_stop;
  pthread_t beater;
} MpiComm;

enum { TAG_BEAT = 1, TAG_SOLO_END = 2 };

// 1 ms: a 100 Mbit/s link moves 12.5 kB in it, a 10 Gbit/s one 1.25 MB, both within what the
// kernel's socket buffers hold, so the link does not idle between polls.
#define PROGRESS_PERIOD_NS 1000000L

// MPI is finalized with the last handle, and only if this module initialized it.
static int live_handles;
static int initialized_here;

static void release_mpi(void) {
  if (live_handles == 0 && initialized_here) {
    MPI_Finalize();
    initialized_here = 0;
  }
}

static MpiComm *mpi_of(Comm *c) { return (MpiComm *)c; }

static long long monotonic_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

// Around every call that waits for the other ranks.
static void waiting(MpiComm *m, const char *what) {
  atomic_store(&m->waiting_in, what);
  atomic_store(&m->waiting_since_ns, monotonic_ns());
}
static void done_waiting(MpiComm *m) { atomic_store(&m->waiting_since_ns, 0); }

// Once a second: a wait longer than the timeout ends the process (MPI_Abort could itself wait
// for the lost peer); mpirun then stops the job. _exit, because the main thread is inside MPI.
static void *watchdog_main(void *arg) {
  MpiComm *m = arg;
  pthread_mutex_lock(&m->watchdog_lock);
  while (!m->watchdog_stop) {
    struct timespec next;
    clock_gettime(CLOCK_REALTIME, &next);
    next.tv_sec += 1;
    pthread_cond_timedwait(&m->watchdog_wake, &m->watchdog_lock, &next);
    const long long since = atomic_load(&m->waiting_since_ns);
    if (m->watchdog_stop || since == 0) continue;
    const double waited_s = (monotonic_ns() - since) / 1e9;
    if (waited_s <= m->timeout_s) continue;
    const int peer = atomic_load(&m->waiting_for);
    if (peer >= 0)
      fprintf(stderr,
              "tally: rank %d: no word from rank %d for %.0f s while it was in %s, which it "
              "does alone (parallel.timeout = %g s); stopping\n",
              m->base.rank, peer, waited_s, m->solo_phase, m->timeout_s);
    else
      fprintf(stderr,
              "tally: rank %d: no answer from the other ranks for %.0f s in %s (parallel.timeout "
              "= %g s); stopping\n",
              m->base.rank, waited_s, atomic_load(&m->waiting_in), m->timeout_s);
    fflush(stderr);
    _exit(1);
  }
  pthread_mutex_unlock(&m->watchdog_lock);
  return NULL;
}

static void mpi_set_timeout(Comm *c, double seconds) {
  MpiComm *m = mpi_of(c);
  m->timeout_s = seconds;
  if (!m->has_watchdog && seconds > 0)
    m->has_watchdog = pthread_create(&m->watchdog, NULL, watchdog_main, m) == 0;
}

static void lock(MpiComm *m) { pthread_mutex_lock(&m->lock); }
static void unlock(MpiComm *m) { pthread_mutex_unlock(&m->lock); }

// One look at the started sums, which lets MPI move their data; forgets them once all are done.
static int poll_started(MpiComm *m) {
  int all_done = 0;
  int rc = MPI_Testall(m->n_started, m->started, &all_done, MPI_STATUSES_IGNORE);
  if (rc == MPI_SUCCESS && all_done) m->n_started = 0;
  return rc;
}

static void *progress_main(void *arg) {
  MpiComm *m = arg;
  const struct timespec period = {.tv_sec = 0, .tv_nsec = PROGRESS_PERIOD_NS};
  lock(m);
  while (!m->stop) {
    if (m->n_started == 0 || m->poll_failed) {
      pthread_cond_wait(&m->wake, &m->lock);
      continue;
    }
    if (poll_started(m) != MPI_SUCCESS) m->poll_failed = 1;
    unlock(m);
    struct timespec left = period;
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    lock(m);
  }
  unlock(m);
  return NULL;
}

static void mpi_abort(Comm *c, const char *why) {
  MpiComm *m = mpi_of(c);
  snprintf(m->failure, sizeof m->failure, "rank %d: %s", c->rank, why);
  fprintf(stderr, "tally: rank %d of %d stops every rank: %s\n", c->rank, c->world, why);
  fflush(stderr);
  lock(m);
  MPI_Abort(MPI_COMM_WORLD, 1);
  unlock(m);
}

// 0 on success; otherwise aborts every rank with the collective's name and MPI's reason.
static int check(Comm *c, int rc, const char *what) {
  if (rc == MPI_SUCCESS) return 0;
  char reason[MPI_MAX_ERROR_STRING], why[MPI_MAX_ERROR_STRING + 64];
  int len = 0;
  MPI_Error_string(rc, reason, &len);
  snprintf(why, sizeof why, "%s: %s", what, reason);
  mpi_abort(c, why);
  return -1;
}

// MPI counts are ints; larger buffers would need splitting, which no Tally buffer needs.
static int fits_int(Comm *c, size_t count, const char *what) {
  if (count <= INT_MAX) return 1;
  char why[160];
  snprintf(why, sizeof why, "%s: %zu elements exceed MPI's int count", what, count);
  mpi_abort(c, why);
  return 0;
}

// One exchange: each rank sends w * buf and, as one more float, w; the sums divided by the summed
// weight are the weighted mean. A sum of the weights first and then of the scaled values cost
// two exchanges per call, and over TCP every exchange waits a round trip (on a busy host also
// the peer's wake-up), for each BatchNorm average and loss term of a step. The weight as a float
// is exact for sample counts below 2^24. MPI hands every rank the same sums, and every rank
// divides them by the same total, which keeps replicas identical.
static int mpi_allreduce_weighted(Comm *c, float *buf, size_t n, double local_weight) {
  MpiComm *m = mpi_of(c);
  if (!fits_int(c, n + 1, "allreduce_weighted")) return -1;
  if (n + 1 > m->cap_packed) {
    free(m->packed);
    m->cap_packed = n + 1;
    m->packed = malloc(sizeof *m->packed * m->cap_packed);
    if (!m->packed) TL_DIE("out of memory for a weighted sum of %zu floats", n);
  }
  // The float weight scales the values too, so numerator and denominator agree exactly.
  const float weight = (float)local_weight;
  float *packed = m->packed;
  for (size_t i = 0; i < n; i++) packed[i] = buf[i] * weight;
  packed[n] = weight;
  lock(m);
  waiting(m, "allreduce_weighted");
  int rc = MPI_Allreduce(MPI_IN_PLACE, packed, (int)(n + 1), MPI_FLOAT, MPI_SUM, m->comm);
  done_waiting(m);
  unlock(m);
  if (check(c, rc, "allreduce_weighted: MPI_Allreduce")) return -1;
  const double total_weight = packed[n];
  if (!(total_weight > 0)) {
    mpi_abort(c, "allreduce_weighted: the weights of all ranks sum to 0");
    return -1;
  }
  for (size_t i = 0; i < n; i++) buf[i] = (float)(packed[i] / total_weight);
  return 0;
}

static int mpi_allreduce_sum_f64(Comm *c, double *buf, size_t n) {
  MpiComm *m = mpi_of(c);
  if (!fits_int(c, n, "allreduce_sum_f64")) return -1;
  lock(m);
  waiting(m, "allreduce_sum_f64");
  int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, m->comm);
  done_waiting(m);
  unlock(m);
  return check(c, rc, "allreduce_sum_f64: MPI_Allreduce");
}

static int mpi_iallreduce_sum_f32(Comm *c, float *buf, size_t n) {
  MpiComm *m = mpi_of(c);
  if (!fits_int(c, n, "iallreduce_sum")) return -1;
  lock(m);
  if (m->n_started == m->cap_started) {
    m->cap_started = m->cap_started ? 2 * m->cap_started : 16;
    m->started = realloc(m->started, sizeof *m->started * (size_t)m->cap_started);
    if (!m->started) TL_DIE("out of memory for %d MPI requests", m->cap_started);
  }
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, m->comm,
                          &m->started[m->n_started]);
  if (rc == MPI_SUCCESS) {
    m->n_started++;
    pthread_cond_signal(&m->wake);
  }
  unlock(m);
  return check(c, rc, "iallreduce_sum: MPI_Iallreduce");
}

// With the progress thread this is its job; calling MPI here too would only take the lock from
// it, or make backward wait for it.
static int mpi_test_all(Comm *c) {
  MpiComm *m = mpi_of(c);
  if (m->has_progress) return 0;
  return check(c, poll_started(m), "iallreduce_sum: MPI_Testall");
}

static int mpi_wait_all(Comm *c) {
  MpiComm *m = mpi_of(c);
  lock(m);
  waiting(m, "the gradient sums (MPI_Waitall)");
  int rc = MPI_Waitall(m->n_started, m->started, MPI_STATUSES_IGNORE);
  done_waiting(m);
  m->n_started = 0;
  m->poll_failed = 0;
  unlock(m);
  return check(c, rc, "iallreduce_sum: MPI_Waitall");
}

static int mpi_allgather(Comm *c, const float *local, size_t n_local, float *out, size_t out_cap,
                         size_t *offset, size_t *total_count) {
  MpiComm *m = mpi_of(c);
  unsigned long long mine = n_local;
  lock(m);
  waiting(m, "allgather");
  int rc = MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, m->gathered_counts, 1,
                         MPI_UNSIGNED_LONG_LONG, m->comm);
  done_waiting(m);
  unlock(m);
  if (check(c, rc, "allgather: MPI_Allgather of the counts")) return -1;
  size_t at = 0;
  for (int r = 0; r < c->world; r++) {
    if (r == c->rank) *offset = at;
    m->recv_counts[r] = (int)m->gathered_counts[r];
    m->displs[r] = (int)at;
    at += m->gathered_counts[r];
    // Every rank sees the same counts, so every rank reaches the same verdict here.
    if (!fits_int(c, at, "allgather")) return -1;
  }
  *total_count = at;
  // A rank that sized its output for other counts (another batch size) would be written past.
  if (at > out_cap) {
    char why[160];
    snprintf(why, sizeof why, "allgather: the ranks send %zu floats, this rank holds %zu", at,
             out_cap);
    mpi_abort(c, why);
    return -1;
  }
  lock(m);
  waiting(m, "allgather");
  rc = MPI_Allgatherv(local, (int)n_local, MPI_FLOAT, out, m->recv_counts, m->displs, MPI_FLOAT,
                      m->comm);
  done_waiting(m);
  unlock(m);
  return check(c, rc, "allgather: MPI_Allgatherv");
}

static int mpi_broadcast(Comm *c, void *buf, size_t bytes, int root) {
  MpiComm *m = mpi_of(c);
  if (!fits_int(c, bytes, "broadcast")) return -1;
  lock(m);
  waiting(m, "broadcast");
  int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, m->comm);
  done_waiting(m);
  unlock(m);
  return check(c, rc, "broadcast: MPI_Bcast");
}

static int mpi_barrier(Comm *c) {
  MpiComm *m = mpi_of(c);
  lock(m);
  waiting(m, "barrier");
  int rc = MPI_Barrier(m->comm);
  done_waiting(m);
  unlock(m);
  return check(c, rc, "barrier: MPI_Barrier");
}

static const char *mpi_failure(const Comm *c) {
  const MpiComm *m = (const MpiComm *)c;
  return m->failure[0] ? m->failure : NULL;
}

// ---- a phase one rank computes alone ----

// The rank computing alone: a message to every other rank, a few times within the timeout, so
// that their watchdogs hear from it for as long as it works (its evaluation of a large labeled
// folder can outlast parallel.timeout).
static void send_all(MpiComm *m, int tag) {
  const int one = 1;
  lock(m);
  for (int r = 0; r < m->base.world; r++)
    if (r != m->base.rank) MPI_Send(&one, 1, MPI_INT, r, tag, m->beats);
  unlock(m);
}

static void *beater_main(void *arg) {
  MpiComm *m = arg;
  double period_s = m->timeout_s / 4;
  if (period_s > 5) period_s = 5;
  if (period_s < 0.05) period_s = 0.05;
  pthread_mutex_lock(&m->watchdog_lock);
  while (!m->beats_stop) {
    pthread_mutex_unlock(&m->watchdog_lock);
    send_all(m, TAG_BEAT);
    pthread_mutex_lock(&m->watchdog_lock);
    struct timespec next;
    clock_gettime(CLOCK_REALTIME, &next);
    long long ns = next.tv_nsec + (long long)(period_s * 1e9);
    next.tv_sec += ns / 1000000000LL;
    next.tv_nsec = ns % 1000000000LL;
    while (!m->beats_stop &&
           pthread_cond_timedwait(&m->watchdog_wake, &m->watchdog_lock, &next) == 0) {
    }
  }
  pthread_mutex_unlock(&m->watchdog_lock);
  return NULL;
}

static void mpi_solo_begin(Comm *c, int root, const char *phase) {
  MpiComm *m = mpi_of(c);
  snprintf(m->solo_phase, sizeof m->solo_phase, "%s", phase);
  // Heartbeats need a second thread in MPI: MPI_THREAD_SERIALIZED (has_progress says so).
  if (c->rank != root || !m->has_progress || m->timeout_s <= 0) return;
  m->beats_stop = 0;
  m->has_beats = pthread_create(&m->beater, NULL, beater_main, m) == 0;
}

// The others wait here for the end of the phase, each heartbeat restarting their watchdog's
// count; messages between two ranks on one communicator arrive in order, so none is left after
// the end.
static int mpi_solo_end(Comm *c, int root) {
  MpiComm *m = mpi_of(c);
  if (c->rank == root) {
    if (m->has_beats) {
      pthread_mutex_lock(&m->watchdog_lock);
      m->beats_stop = 1;
      pthread_cond_broadcast(&m->watchdog_wake);
      pthread_mutex_unlock(&m->watchdog_lock);
      pthread_join(m->beater, NULL);
      m->has_beats = 0;
    }
    send_all(m, TAG_SOLO_END);
    return 0;
  }
  atomic_store(&m->waiting_for, root);
  int rc = MPI_SUCCESS;
  for (MPI_Status st = {.MPI_TAG = TAG_BEAT}; rc == MPI_SUCCESS && st.MPI_TAG == TAG_BEAT;) {
    int beat;
    waiting(m, m->solo_phase);
    lock(m);
    rc = MPI_Recv(&beat, 1, MPI_INT, root, MPI_ANY_TAG, m->beats, &st);
    unlock(m);
    done_waiting(m);
  }
  atomic_store(&m->waiting_for, -1);
  return check(c, rc, "the end of a phase one rank does alone: MPI_Recv");
}

static void mpi_destroy(Comm *c) {
  MpiComm *m = mpi_of(c);
  // MPI_Finalize must not find a request still pending (waiting for none returns at once; the
  // count is read under the lock, which the progress thread may be holding).
  mpi_wait_all(c);
  if (m->has_progress) {
    lock(m);
    m->stop = 1;
    pthread_cond_signal(&m->wake);
    unlock(m);
    pthread_join(m->progress, NULL);
  }
  if (m->has_watchdog) {
    pthread_mutex_lock(&m->watchdog_lock);
    m->watchdog_stop = 1;
    pthread_cond_signal(&m->watchdog_wake);
    pthread_mutex_unlock(&m->watchdog_lock);
    pthread_join(m->watchdog, NULL);
  }
  pthread_cond_destroy(&m->watchdog_wake);
  pthread_mutex_destroy(&m->watchdog_lock);
  pthread_cond_destroy(&m->wake);
  pthread_mutex_destroy(&m->lock);
  MPI_Comm_free(&m->comm);
  MPI_Comm_free(&m->beats);
  free(m->gathered_counts);
  free(m->recv_counts);
  free(m->displs);
  free(m->started);
  free(m->packed);
  free(m);
  live_handles--;
  release_mpi();
}

static const CommBackend mpi_backend = {
    .name = "mpi",
    .allreduce_weighted = mpi_allreduce_weighted,
    .allreduce_sum_f64 = mpi_allreduce_sum_f64,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .failure = mpi_failure,
    .destroy = mpi_destroy,
    .iallreduce_sum_f32 = mpi_iallreduce_sum_f32,
    .test_all = mpi_test_all,
    .wait_all = mpi_wait_all,
    .set_timeout = mpi_set_timeout,
    .solo_begin = mpi_solo_begin,
    .solo_end = mpi_solo_end,
};

Comm *comm_mpi_create(int *argc, char ***argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    tl_fail("comm mpi: MPI was already finalized in this process");
    return NULL;
  }
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      tl_fail("comm mpi: MPI_Init_thread failed (is this process started by mpirun?)");
      return NULL;
    }
    initialized_here = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    release_mpi();
    tl_fail("comm mpi: the MPI library does not support MPI_THREAD_FUNNELED");
    return NULL;
  }
  MPI_Comm comm, beats;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &beats) != MPI_SUCCESS) {
    release_mpi();
    tl_fail("comm mpi: MPI_Comm_dup of MPI_COMM_WORLD failed");
    return NULL;
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(beats, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);

  MpiComm *m = calloc(1, sizeof *m);
  unsigned long long *gathered_counts = calloc((size_t)world, sizeof *gathered_counts);
  int *recv_counts = calloc((size_t)world, sizeof *recv_counts);
  int *displs = calloc((size_t)world, sizeof *displs);
  if (!m || !gathered_counts || !recv_counts || !displs)
    TL_DIE("out of memory for an MPI comm handle of %d ranks", world);
  m->base = (Comm){.backend = &mpi_backend, .rank = rank, .world = world};
  m->comm = comm;
  m->beats = beats;
  m->waiting_for = -1;
  m->gathered_counts = gathered_counts;
  m->recv_counts = recv_counts;
  m->displs = displs;
  pthread_mutex_init(&m->lock, NULL);
  pthread_cond_init(&m->wake, NULL);
  pthread_mutex_init(&m->watchdog_lock, NULL);
  pthread_cond_init(&m->watchdog_wake, NULL);
  // Without the thread, comm_test_all at each gradient report drives the sums.
  m->has_progress = provided >= MPI_THREAD_SERIALIZED &&
                    pthread_create(&m->progress, NULL, progress_main, m) == 0;
  live_handles++;
  return &m->base;
}
