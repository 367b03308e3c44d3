// Collectives of the local backend: replicas are threads here, each with its own Comm handle.
// Threads only record what they see; every assertion runs on the main thread after they join.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "parallel/comm.h"

enum { MAX_WORLD = 4, JOIN_TIMEOUT_S = 20 };

typedef void (*rank_fn)(Comm *c, void *ctx);

typedef struct {
  LocalGroup *group;
  int rank;
  rank_fn fn;
  void *ctx;
} RankThread;

static void *rank_main(void *arg) {
  RankThread *t = arg;
  Comm *c = comm_local_rank(t->group, t->rank);
  t->fn(c, t->ctx);
  comm_destroy(c);
  return NULL;
}

// Runs fn on `world` thread replicas. A hang is a failure, not a stuck test: after the timeout
// the group is aborted from here (any handle may abort), which must release every rank.
static void run_ranks(int world, rank_fn fn, void *ctx) {
  LocalGroup *g = comm_local_group_create(world);
  assert_non_null(g);
  RankThread threads[MAX_WORLD];
  pthread_t ids[MAX_WORLD];
  for (int r = 0; r < world; r++) {
    threads[r] = (RankThread){g, r, fn, ctx};
    assert_int_equal(pthread_create(&ids[r], NULL, rank_main, &threads[r]), 0);
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += JOIN_TIMEOUT_S;
  int hung = 0;
  for (int r = 0; r < world; r++) {
    if (pthread_timedjoin_np(ids[r], NULL, &deadline) != ETIMEDOUT) continue;
    hung = 1;
    Comm *rescue = comm_local_rank(g, 0);
    comm_abort(rescue, "test timeout");
    comm_destroy(rescue);
    pthread_join(ids[r], NULL);
  }
  comm_local_group_destroy(g);
  if (hung) fail_msg("a rank did not finish within %d s", JOIN_TIMEOUT_S);
}

// ---- the worked example of DESIGN.md ----

typedef struct {
  double weight[2];    // each replica's sample count
  float grad[2][2];    // in: each replica's mean gradient; out: the averaged one
  float params[2][2];  // each replica's parameters after one SGD step
} WorkedExample;

static void worked_example_rank(Comm *c, void *ctx) {
  WorkedExample *ex = ctx;
  int r = comm_rank(c);
  float *p = ex->params[r], *g = ex->grad[r];
  p[0] = 1, p[1] = 2;
  comm_allreduce_weighted(c, g, 2, ex->weight[r]);
  for (int i = 0; i < 2; i++) p[i] -= 0.1f * g[i];
}

static void check_worked_example(double w0, double w1, const float want_grad[2],
                                 const float want_params[2]) {
  WorkedExample ex = {.weight = {w0, w1}, .grad = {{2, 4}, {6, 0}}};
  run_ranks(2, worked_example_rank, &ex);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 2; i++) {
      // Small integers and their exact weighted means: nothing is left to rounding.
      assert_true(ex.grad[r][i] == want_grad[i]);
      assert_float_equal(ex.params[r][i], want_params[i], 1e-6);
    }
  }
  assert_memory_equal(ex.params[0], ex.params[1], sizeof ex.params[0]);
}

static void test_worked_example_equal_shards(void **state) {
  (void)state;
  check_worked_example(1, 1, (float[]){4, 2}, (float[]){0.6f, 1.8f});
}

static void test_worked_example_uneven_shards(void **state) {
  (void)state;
  // (2*(2,4) + 6*(6,0)) / 8 = (5, 1); (1,2) - 0.1*(5,1) = (0.5, 1.9).
  check_worked_example(2, 6, (float[]){5, 1}, (float[]){0.5f, 1.9f});
}

// ---- allgather with uneven counts ----

enum { GATHER_WORLD = 3 };
static const size_t gather_counts[GATHER_WORLD] = {2, 0, 3};  // rank 1 has nothing to give

typedef struct {
  float out[GATHER_WORLD][8];
  size_t offset[GATHER_WORLD];
} GatherResult;

static void allgather_rank(Comm *c, void *ctx) {
  GatherResult *res = ctx;
  int r = comm_rank(c);
  float local[3];
  for (size_t i = 0; i < gather_counts[r]; i++) local[i] = 10.0f * r + (float)i;
  comm_allgather(c, local, gather_counts[r], res->out[r], 8, &res->offset[r]);
}

// A rank whose output holds less than the ranks send (another batch size on one rank) stops every
// rank, naming both sizes, and nothing is written past its capacity.
typedef struct {
  float out[GATHER_WORLD][8];
  int failed[GATHER_WORLD];
  char why[GATHER_WORLD][256];
} OverflowResult;

static void allgather_small_rank(Comm *c, void *ctx) {
  OverflowResult *res = ctx;
  int r = comm_rank(c);
  float local[3] = {1, 2, 3};
  for (int i = 0; i < 8; i++) res->out[r][i] = -7;
  // Rank 2 sized its output for 4 floats; the ranks send 2 + 0 + 3.
  comm_allgather(c, local, gather_counts[r], res->out[r], r == 2 ? 4 : 8, NULL);
  res->failed[r] = comm_failed(c);
  snprintf(res->why[r], sizeof res->why[r], "%s", comm_failure(c));
}

static void test_allgather_refuses_past_capacity(void **state) {
  (void)state;
  OverflowResult res;
  memset(&res, 0, sizeof res);
  run_ranks(GATHER_WORLD, allgather_small_rank, &res);
  for (int r = 0; r < GATHER_WORLD; r++) {
    assert_true(res.failed[r]);
    assert_non_null(strstr(res.why[r], "send 5 floats, rank 2 holds 4"));
  }
  for (int i = 0; i < 8; i++) assert_true(res.out[2][i] == -7);
}

static void test_allgather_uneven(void **state) {
  (void)state;
  GatherResult res;
  memset(&res, 0, sizeof res);
  run_ranks(GATHER_WORLD, allgather_rank, &res);
  const float want[5] = {0, 1, 20, 21, 22};
  const size_t want_offset[GATHER_WORLD] = {0, 2, 2};
  for (int r = 0; r < GATHER_WORLD; r++) {
    assert_int_equal(res.offset[r], want_offset[r]);
    for (int i = 0; i < 5; i++) assert_true(res.out[r][i] == want[i]);
    assert_true(res.out[r][5] == 0);  // nothing written past the total
  }
}

// ---- broadcast and allreduce_sum_f64 ----

typedef struct {
  unsigned char bytes[3][37];
  double sums[3][3];
} SmallResults;

static void broadcast_and_sum_rank(Comm *c, void *ctx) {
  SmallResults *res = ctx;
  int r = comm_rank(c);
  if (r == 2)
    for (int i = 0; i < 37; i++) res->bytes[r][i] = (unsigned char)(7 * i + 3);
  comm_broadcast(c, res->bytes[r], 37, 2);
  double *s = res->sums[r];
  s[0] = r + 1, s[1] = 0.5 * r, s[2] = -r;
  comm_allreduce_sum_f64(c, s, 3);
}

static void test_broadcast_and_sum_f64(void **state) {
  (void)state;
  SmallResults res;
  memset(&res, 0, sizeof res);
  run_ranks(3, broadcast_and_sum_rank, &res);
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 37; i++) assert_int_equal(res.bytes[r][i], (unsigned char)(7 * i + 3));
    // (1+2+3, 0+0.5+1, 0-1-2)
    assert_true(res.sums[r][0] == 6 && res.sums[r][1] == 1.5 && res.sums[r][2] == -3);
  }
}

// ---- determinism on a long vector ----

enum { LONG_N = 100001, LONG_WORLD = 3 };
static const double long_weights[LONG_WORLD] = {3, 5, 11};

typedef struct {
  float *input[LONG_WORLD];      // (LONG_N) each rank's contribution, kept for the reference
  float *result[2][LONG_WORLD];  // (LONG_N) two runs of the same reduction
  int run;
} LongVectors;

static void long_rank(Comm *c, void *ctx) {
  LongVectors *v = ctx;
  int r = comm_rank(c);
  float *buf = v->result[v->run][r];
  memcpy(buf, v->input[r], LONG_N * sizeof *buf);
  comm_allreduce_weighted(c, buf, LONG_N, long_weights[r]);
}

static void test_allreduce_deterministic(void **state) {
  (void)state;
  LongVectors v = {0};
  for (int r = 0; r < LONG_WORLD; r++) {
    v.input[r] = tl_alloc(LONG_N * sizeof(float), MEM_DATA, COMP_OTHER);
    for (int run = 0; run < 2; run++)
      v.result[run][r] = tl_alloc(LONG_N * sizeof(float), MEM_DATA, COMP_OTHER);
    Rng rng = rng_stream(42, RNG_TEST, 7, (uint64_t)r);
    for (size_t i = 0; i < LONG_N; i++) v.input[r][i] = rng_normal(&rng) * (float)(r + 1);
  }
  for (v.run = 0; v.run < 2; v.run++) run_ranks(LONG_WORLD, long_rank, &v);

  for (int r = 1; r < LONG_WORLD; r++)
    assert_memory_equal(v.result[0][0], v.result[0][r], LONG_N * sizeof(float));
  assert_memory_equal(v.result[0][0], v.result[1][0], LONG_N * sizeof(float));
  double total_weight = long_weights[0] + long_weights[1] + long_weights[2];
  double worst_rel = 0;
  for (size_t i = 0; i < LONG_N; i++) {
    double want = 0;
    for (int r = 0; r < LONG_WORLD; r++) want += long_weights[r] * v.input[r][i];
    want /= total_weight;
    double rel = fabs(v.result[0][0][i] - want) / fmax(fabs(want), 1e-30);
    if (rel > worst_rel) worst_rel = rel;
  }
  assert_true(worst_rel <= 1e-6);
  for (int r = 0; r < LONG_WORLD; r++) {
    tl_free(v.input[r]);
    for (int run = 0; run < 2; run++) tl_free(v.result[run][r]);
  }
}

// ---- abort ----

// What a rank sees of the group's failure once its collectives have returned.
typedef struct {
  int failed;
  char why[256];
} FailureSeen;

static void record_failure(Comm *c, FailureSeen *seen) {
  seen->failed = comm_failed(c);
  snprintf(seen->why, sizeof seen->why, "%s", comm_failure(c));
}

static void assert_all_failed(const FailureSeen *seen, int world, const char *reason) {
  for (int r = 0; r < world; r++) {
    assert_true(seen[r].failed);
    assert_non_null(strstr(seen[r].why, reason));
  }
}

typedef struct {
  FailureSeen seen[3];
  float after[3][2];  // a buffer passed to collectives after the failure: must stay untouched
} AbortResult;

static void abort_rank(Comm *c, void *ctx) {
  AbortResult *res = ctx;
  int r = comm_rank(c);
  float grad[2] = {1, 2};
  if (r == 0) {
    // Let the others block first: an abort must wake ranks already waiting.
    usleep(50 * 1000);
    comm_abort(c, "loader failed on image 17");
  } else {
    comm_allreduce_weighted(c, grad, 2, 1);
  }
  res->after[r][0] = 5, res->after[r][1] = 6;
  comm_allreduce_weighted(c, res->after[r], 2, 1);
  comm_barrier(c);
  record_failure(c, &res->seen[r]);
}

static void test_abort_unblocks_others(void **state) {
  (void)state;
  AbortResult res;
  memset(&res, 0, sizeof res);
  run_ranks(3, abort_rank, &res);
  assert_all_failed(res.seen, 3, "loader failed on image 17");
  for (int r = 0; r < 3; r++) assert_true(res.after[r][0] == 5 && res.after[r][1] == 6);
}

static void zero_weight_rank(Comm *c, void *ctx) {
  FailureSeen *seen = ctx;
  float grad[3] = {1, 2, 3};
  comm_allreduce_weighted(c, grad, 3, 0);
  record_failure(c, &seen[comm_rank(c)]);
}

static void test_zero_total_weight_fails_everywhere(void **state) {
  (void)state;
  FailureSeen seen[2];
  memset(seen, 0, sizeof seen);
  run_ranks(2, zero_weight_rank, seen);
  assert_all_failed(seen, 2, "sum to 0");
}

static void test_bad_arguments(void **state) {
  (void)state;
  assert_null(comm_local_group_create(0));
  assert_non_null(strstr(tl_last_error(), "world"));
  LocalGroup *g = comm_local_group_create(2);
  assert_null(comm_local_rank(g, 2));
  assert_non_null(strstr(tl_last_error(), "rank 2"));
  comm_local_group_destroy(g);
}

// ---- stats ----

enum { STATS_WORLD = 3 };

typedef struct {
  CommStats before_reset[STATS_WORLD], after_reset[STATS_WORLD];
  int rank[STATS_WORLD], size[STATS_WORLD];
  const char *backend[STATS_WORLD];
} StatsResult;

static void stats_rank(Comm *c, void *ctx) {
  StatsResult *res = ctx;
  int r = comm_rank(c);
  res->rank[r] = r;
  res->size[r] = comm_size(c);
  res->backend[r] = comm_backend(c);
  float grad[300] = {0}, gathered[6], local[3] = {0};
  double sums[4] = {0};
  unsigned char bytes[40] = {0};
  comm_allreduce_weighted(c, grad, 300, 1);
  comm_allreduce_sum_f64(c, sums, 4);
  comm_allgather(c, local, (size_t)r + 1, gathered, 6, NULL);
  comm_broadcast(c, bytes, 40, 1);
  comm_barrier(c);
  res->before_reset[r] = comm_stats(c);
  comm_stats_reset(c);
  res->after_reset[r] = comm_stats(c);
}

static void test_stats(void **state) {
  (void)state;
  StatsResult res;
  memset(&res, 0, sizeof res);
  run_ranks(STATS_WORLD, stats_rank, &res);
  // Ring allreduce of N bytes: each rank sends 2*(W-1)/W*N and receives as much.
  // W = 3: 4*(2/3)*(300*4) + 4*(2/3)*(4*8) = 3200 + 85.33.
  double want_allreduce = 3200.0 + 4.0 * 2.0 / 3.0 * 32.0;
  // Rank r gives r+1 floats to 2 others and receives the 6 - (r+1) floats of the others.
  // Broadcast of 40 bytes from rank 1: the root sends 2 copies, the others receive one.
  for (int r = 0; r < STATS_WORLD; r++) {
    assert_int_equal(res.rank[r], r);
    assert_int_equal(res.size[r], STATS_WORLD);
    assert_string_equal(res.backend[r], "local");
    const CommStats *s = &res.before_reset[r];
    assert_float_equal(s->bytes[COLL_ALLREDUCE], want_allreduce, 1e-9);
    assert_float_equal(s->bytes[COLL_ALLGATHER], 4.0 * (2 * (r + 1) + (6 - (r + 1))), 1e-9);
    assert_float_equal(s->bytes[COLL_BROADCAST], r == 1 ? 80 : 40, 1e-9);
    for (int k = 0; k < COLL_NKINDS; k++) {
      assert_true(s->ms[k] >= 0);
      assert_true(res.after_reset[r].bytes[k] == 0 && res.after_reset[r].ms[k] == 0);
    }
  }
}

// A single replica: every collective is the identity and moves nothing.
static void single_rank(Comm *c, void *ctx) {
  float *grad = ctx;
  comm_allreduce_weighted(c, grad, 3, 7);
  comm_broadcast(c, grad, 3 * sizeof *grad, 0);
  CommStats s = comm_stats(c);
  for (int k = 0; k < COLL_NKINDS; k++) grad[3 + k] = (float)s.bytes[k];
}

static void test_world_one(void **state) {
  (void)state;
  float grad[3 + COLL_NKINDS] = {0.1f, -2.5f, 3e-7f};
  run_ranks(1, single_rank, grad);
  assert_true(grad[0] == 0.1f && grad[1] == -2.5f && grad[2] == 3e-7f);
  for (int k = 0; k < COLL_NKINDS; k++) assert_true(grad[3 + k] == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worked_example_equal_shards),
      cmocka_unit_test(test_worked_example_uneven_shards),
      cmocka_unit_test(test_allgather_uneven),
      cmocka_unit_test(test_allgather_refuses_past_capacity),
      cmocka_unit_test(test_broadcast_and_sum_f64),
      cmocka_unit_test(test_allreduce_deterministic),
      cmocka_unit_test(test_abort_unblocks_others),
      cmocka_unit_test(test_zero_total_weight_fails_everywhere),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_stats),
      cmocka_unit_test(test_world_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
