// The bucketed, non-blocking gradient average on the MPI backend must equal the blocking
// comm_allreduce_weighted and the weighted mean computed here from every rank's gradients, with
// uneven weights and whatever order backward reports its tensors in. Meant for `mpirun -np 2`;
// alone it is a world of one. As in test_comm_mpi, every rank runs every test and assertions
// come after a test's collectives, so a failing rank does not leave the other waiting.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/params.h"
#include "parallel/grad_sync.h"

// A model of uneven tensors, one of them a buffer, with 1 KiB buckets: several buckets, some
// tensors larger than a bucket.
enum { N_TENSORS = 9, BUCKET_BYTES = 1024 };
static const size_t tensor_count[N_TENSORS] = {300, 40, 700, 8, 8, 513, 64, 1000, 17};
static const int buffer_tensor = 4;

static Comm *comm;

typedef struct {
  ParamSet ps;
  float *grad[N_TENSORS];  // NULL for the buffer
} Model;

// Rank r's gradient of float i: different on every rank and every float.
static float grad_of(int rank, size_t i) { return sinf(0.37f * (float)i + 1.3f * (float)rank); }

// Rank r holds 2 + 4r samples: uneven shares of the global batch.
static double weight_of(int rank) { return 2.0 + 4.0 * rank; }

static void model_init(Model *m) {
  size_t total = 0;
  for (int t = 0; t < N_TENSORS; t++) total += tensor_count[t];
  paramset_alloc(&m->ps, total, 1);
  for (int t = 0; t < N_TENSORS; t++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", t);
    if (t == buffer_tensor) {
      paramset_take_buffer(&m->ps, name, tensor_count[t]);
      m->grad[t] = NULL;
    } else {
      paramset_take(&m->ps, name, tensor_count[t], 0, &m->grad[t]);
    }
  }
}

// This rank's gradients, buffers' slices zero as an op leaves them.
static void fill_grads(Model *m) {
  int rank = comm_rank(comm);
  for (size_t i = 0; i < m->ps.count; i++) m->ps.grad[i] = grad_of(rank, i);
  const ParamEntry *buffer = &m->ps.entries[buffer_tensor];
  memset(m->ps.grad + buffer->offset, 0, buffer->count * sizeof(float));
}

// sum_r w_r g_r / sum_r w_r in double, from the formula for every rank's gradients.
static double expected_mean(const Model *m, size_t i) {
  const ParamEntry *buffer = &m->ps.entries[buffer_tensor];
  if (i >= buffer->offset && i < buffer->offset + buffer->count) return 0;
  double sum = 0, total_weight = 0;
  for (int r = 0; r < comm_size(comm); r++) {
    sum += weight_of(r) * grad_of(r, i);
    total_weight += weight_of(r);
  }
  return sum / total_weight;
}

static double global_batch(void) {
  double total = 0;
  for (int r = 0; r < comm_size(comm); r++) total += weight_of(r);
  return total;
}

// The blocking path: what the trainer does without overlap.
static void blocking_mean(Model *m, float *out, double *bytes) {
  fill_grads(m);
  comm_stats_reset(comm);
  comm_allreduce_weighted(comm, m->ps.grad, m->ps.count, weight_of(comm_rank(comm)));
  *bytes = comm_stats(comm).bytes[COLL_ALLREDUCE];
  memcpy(out, m->ps.grad, m->ps.count * sizeof(float));
}

// The bucketed path, reporting the tensors in `order` (n_reported of them; the rest are
// "unused this step"). *started_before_finish receives the buckets started during "backward".
static void bucketed_mean(Model *m, const int *order, int n_reported, float *out, double *bytes,
                          int *started_before_finish) {
  fill_grads(m);
  GradSync *gs = grad_sync_create(comm, &m->ps, BUCKET_BYTES);
  comm_stats_reset(comm);
  grad_sync_begin(gs, weight_of(comm_rank(comm)), global_batch());
  for (int k = 0; k < n_reported; k++) {
    int t = order[k];
    paramset_grad_ready(&m->ps, m->grad[t], tensor_count[t]);
  }
  *started_before_finish = grad_sync_buckets_started(gs);
  grad_sync_finish(gs);
  *bytes = comm_stats(comm).bytes[COLL_ALLREDUCE];
  memcpy(out, m->ps.grad, m->ps.count * sizeof(float));
  grad_sync_destroy(gs);
}

// Float rounding only: the scaled terms are rounded to float before the sum.
static void expect_close(const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++) assert_float_equal(got[i], want[i], 1e-6 * (1 + fabsf(want[i])));
}

static void expect_weighted_mean(const Model *m, const float *got) {
  for (size_t i = 0; i < m->ps.count; i++) assert_float_equal(got[i], expected_mean(m, i), 1e-6);
}

// Orders of the trainable tensors: backward's (last first), and a shuffle that differs by rank
// (buckets must still start in the same sequence everywhere, or MPI would pair the wrong sums).
static int reverse_order(int *order) {
  int n = 0;
  for (int t = N_TENSORS - 1; t >= 0; t--)
    if (t != buffer_tensor) order[n++] = t;
  return n;
}

static int shuffled_order(int *order, unsigned seed) {
  int n = reverse_order(order);
  for (int k = n - 1; k > 0; k--) {
    seed = seed * 1103515245u + 12345u;
    int j = (int)((seed >> 16) % (unsigned)(k + 1));
    int tmp = order[k];
    order[k] = order[j];
    order[j] = tmp;
  }
  return n;
}

typedef struct {
  Model m;
  float *blocking, *bucketed;
  double blocking_bytes, bucketed_bytes;
  int started_before_finish, n_buckets;
} Case;

static void run_case(Case *c, const int *order, int n_reported) {
  model_init(&c->m);
  c->blocking = tl_alloc(c->m.ps.count * sizeof(float), MEM_WORKSPACE, COMP_OTHER);
  c->bucketed = tl_alloc(c->m.ps.count * sizeof(float), MEM_WORKSPACE, COMP_OTHER);
  blocking_mean(&c->m, c->blocking, &c->blocking_bytes);
  bucketed_mean(&c->m, order, n_reported, c->bucketed, &c->bucketed_bytes,
                &c->started_before_finish);
  GradSync *layout = grad_sync_create(comm, &c->m.ps, BUCKET_BYTES);
  c->n_buckets = grad_sync_bucket_count(layout);
  grad_sync_destroy(layout);
}

static void expect_case(const Case *c) {
  expect_close(c->bucketed, c->blocking, c->m.ps.count);
  expect_weighted_mean(&c->m, c->blocking);
  expect_weighted_mean(&c->m, c->bucketed);
  assert_true(c->bucketed_bytes == c->blocking_bytes);
  assert_true(c->n_buckets >= 4);
}

static void case_destroy(Case *c) {
  tl_free(c->blocking);
  tl_free(c->bucketed);
  paramset_free(&c->m.ps);
}

static void test_backward_order(void **state) {
  (void)state;
  int order[N_TENSORS];
  int n = reverse_order(order);
  Case c;
  run_case(&c, order, n);
  expect_case(&c);
  assert_true(comm_has_async(comm));
  // Every tensor was reported, so every bucket started during "backward".
  assert_int_equal(c.started_before_finish, c.n_buckets);
  case_destroy(&c);
}

static void test_random_order_per_rank(void **state) {
  (void)state;
  int order[N_TENSORS];
  int n = shuffled_order(order, 7u + 101u * (unsigned)comm_rank(comm));
  Case c;
  run_case(&c, order, n);
  expect_case(&c);
  assert_int_equal(c.started_before_finish, c.n_buckets);
  case_destroy(&c);
}

// The first tensor (the last bucket) and a middle one are unused this step: finish reduces
// their buckets, still in order and still once.
static void test_unreported_tensors(void **state) {
  (void)state;
  int order[N_TENSORS];
  int n = reverse_order(order);
  int kept = 0;
  for (int k = 0; k < n; k++)
    if (order[k] != 0 && order[k] != 5) order[kept++] = order[k];
  Case c;
  run_case(&c, order, kept);
  expect_case(&c);
  assert_true(c.started_before_finish < c.n_buckets);
  case_destroy(&c);
}

int main(int argc, char **argv) {
  comm = comm_mpi_create(&argc, &argv);
  if (!comm) {
    fprintf(stderr, "test_grad_sync_mpi: %s\n", tl_last_error());
    return 1;
  }
  printf("world of %d\n", comm_size(comm));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backward_order),
      cmocka_unit_test(test_random_order_per_rank),
      cmocka_unit_test(test_unreported_tensors),
  };
  int failures = cmocka_run_group_tests(tests, NULL, NULL);
  comm_destroy(comm);
  return failures;
}
