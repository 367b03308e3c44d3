// The gradient bucketer on one replica: its bucket layout, which reports complete which bucket,
// and what grad_sync_finish leaves in the block. Two backends: the local one (no non-blocking
// collectives: finish falls back to the blocking weighted allreduce), and a fake one with
// non-blocking sums that records every sum it is asked to start, so the order of the starts,
// the scaling by w / W and "every float reduced exactly once" can be checked directly.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/params.h"
#include "parallel/comm_backend.h"
#include "parallel/grad_sync.h"

// The fake model, in take order (offsets in floats), with buckets of 16 floats:
//   a 6 @0 | b 12 @6 | bn.running_mean 4 @18 (buffer) | c 20 @22 | d 3 @42 | e 5 @45 | 2 spare @50
// From the end: e, d, c reach 52 - 22 = 30 >= 16 floats -> bucket 0 = [22, 52), 28 trainable;
// the buffer and b reach 22 - 6 = 16 -> bucket 1 = [6, 22), 12 trainable; a -> bucket 2 = [0, 6).
enum { BLOCK = 52, BUCKET_FLOATS = 16, N_TENSORS = 5, N_BUCKETS = 3 };
static const size_t want_offset[N_BUCKETS] = {22, 6, 0}, want_count[N_BUCKETS] = {30, 16, 6};

typedef struct {
  ParamSet ps;
  float *grad[N_TENSORS];  // a, b, c, d, e
  size_t count[N_TENSORS];
} FakeModel;

static void fake_model_init(FakeModel *m) {
  static const char *names[N_TENSORS] = {"a", "b", "c", "d", "e"};
  static const size_t counts[N_TENSORS] = {6, 12, 20, 3, 5};
  paramset_alloc(&m->ps, BLOCK, 1);
  for (int t = 0; t < N_TENSORS; t++) {
    m->count[t] = counts[t];
    paramset_take(&m->ps, names[t], counts[t], 0, &m->grad[t]);
    if (t == 1) paramset_take_buffer(&m->ps, "bn.running_mean", 4);
  }
  // Gradients 1, 2, 3, ...: exact in float, and so are their quarters.
  for (int i = 0; i < BLOCK; i++) m->ps.grad[i] = (float)(i + 1);
}

// What an op does after writing tensor t's gradient.
static void report(FakeModel *m, int t) { paramset_grad_ready(&m->ps, m->grad[t], m->count[t]); }

static void expect_layout(const GradSync *gs) {
  assert_int_equal(grad_sync_bucket_count(gs), N_BUCKETS);
  for (int b = 0; b < N_BUCKETS; b++) {
    size_t offset, count;
    grad_sync_bucket_range(gs, b, &offset, &count);
    assert_int_equal(offset, want_offset[b]);
    assert_int_equal(count, want_count[b]);
  }
}

static void expect_complete(const GradSync *gs, int b0, int b1, int b2) {
  assert_int_equal(grad_sync_bucket_complete(gs, 0), b0);
  assert_int_equal(grad_sync_bucket_complete(gs, 1), b1);
  assert_int_equal(grad_sync_bucket_complete(gs, 2), b2);
}

// ---- local backend, world 1 ----

static void test_local_layout_and_completion(void **state) {
  (void)state;
  LocalGroup *g = comm_local_group_create(1);
  Comm *c = comm_local_rank(g, 0);
  FakeModel m;
  fake_model_init(&m);
  GradSync *gs = grad_sync_create(c, &m.ps, BUCKET_FLOATS * sizeof(float));
  expect_layout(gs);
  assert_false(comm_has_async(c));

  for (int pass = 0; pass < 2; pass++) {  // a second step starts from zero counts
    grad_sync_begin(gs, 3, 3);
    assert_ptr_equal(m.ps.grad_ready_user, gs);
    expect_complete(gs, 0, 0, 0);
    // Backward order: the last tensors first. Bucket 0 needs all of c, d and e.
    report(&m, 4);
    report(&m, 3);
    expect_complete(gs, 0, 0, 0);
    report(&m, 2);
    expect_complete(gs, 1, 0, 0);
    report(&m, 1);  // the buffer in bucket 1 is never reported
    expect_complete(gs, 1, 1, 0);
    report(&m, 0);
    expect_complete(gs, 1, 1, 1);
    assert_int_equal(grad_sync_buckets_started(gs), 0);  // nothing to start on this backend
    grad_sync_finish(gs);
    assert_null(m.ps.grad_ready);
  }
  // World 1: the blocking weighted mean of one replica is that replica.
  for (int i = 0; i < BLOCK; i++) assert_true(m.ps.grad[i] == (float)(i + 1));

  // Out of order: a bucket completes on its own reports, whatever the others do.
  grad_sync_begin(gs, 1, 1);
  report(&m, 0);
  expect_complete(gs, 0, 0, 1);
  report(&m, 1);
  expect_complete(gs, 0, 1, 1);
  grad_sync_finish(gs);

  grad_sync_destroy(gs);
  paramset_free(&m.ps);
  comm_destroy(c);
  comm_local_group_destroy(g);
}

// ---- a backend with non-blocking sums, rank 0 of a pretended world of 2 ----
// Its "sum" adds nothing (as if the other rank contributed zeros), so the block's final values
// are exactly this rank's scaled gradients, and it counts how often each float was summed.

typedef struct {
  Comm base;
  const float *block;
  int times_summed[BLOCK];
  size_t started_offset[8], started_count[8];
  int n_started, in_flight, waits;
  char failure[COMM_FAILURE_CHARS];
} FakeComm;

static int fake_isum(Comm *c, float *buf, size_t n) {
  FakeComm *f = (FakeComm *)c;
  size_t offset = (size_t)(buf - f->block);
  for (size_t i = 0; i < n; i++) f->times_summed[offset + i]++;
  f->started_offset[f->n_started] = offset;
  f->started_count[f->n_started++] = n;
  f->in_flight++;
  return 0;
}

static int fake_test_all(Comm *c) {
  (void)c;
  return 0;
}

static int fake_wait_all(Comm *c) {
  FakeComm *f = (FakeComm *)c;
  f->in_flight = 0;
  f->waits++;
  return 0;
}

static void fake_abort(Comm *c, const char *why) {
  FakeComm *f = (FakeComm *)c;
  snprintf(f->failure, sizeof f->failure, "%s", why);
}

static const char *fake_failure(const Comm *c) {
  const FakeComm *f = (const FakeComm *)c;
  return f->failure[0] ? f->failure : NULL;
}

static const CommBackend fake_backend = {
    .name = "fake-async",
    .abort = fake_abort,
    .failure = fake_failure,
    .iallreduce_sum_f32 = fake_isum,
    .test_all = fake_test_all,
    .wait_all = fake_wait_all,
};

static void fake_comm_init(FakeComm *f, const float *block) {
  memset(f, 0, sizeof *f);
  f->base = (Comm){.backend = &fake_backend, .rank = 0, .world = 2};
  f->block = block;
}

static void expect_started(const FakeComm *f, int n) {
  assert_int_equal(f->n_started, n);
  for (int k = 0; k < n; k++) {
    assert_int_equal(f->started_offset[k], want_offset[k]);
    assert_int_equal(f->started_count[k], want_count[k]);
  }
}

// Every float summed once, and scaled by w / W = 1/4 on the way.
static void expect_reduced_once_and_quartered(const FakeComm *f, const FakeModel *m) {
  for (int i = 0; i < BLOCK; i++) {
    assert_int_equal(f->times_summed[i], 1);
    assert_true(m->ps.grad[i] == (float)(i + 1) / 4);
  }
}

// The fake model on the fake backend, with a step begun at w = local_weight of W = 4.
typedef struct {
  FakeModel m;
  FakeComm f;
  GradSync *gs;
} AsyncCase;

static void async_case_begin(AsyncCase *c, double local_weight) {
  fake_model_init(&c->m);
  fake_comm_init(&c->f, c->m.ps.grad);
  c->gs = grad_sync_create(&c->f.base, &c->m.ps, BUCKET_FLOATS * sizeof(float));
  expect_layout(c->gs);
  grad_sync_begin(c->gs, local_weight, 4);
}

static void async_case_destroy(AsyncCase *c) {
  grad_sync_destroy(c->gs);
  paramset_free(&c->m.ps);
}

// c, d and e: all of bucket 0.
static void report_last_three(FakeModel *m) {
  for (int t = 4; t >= 2; t--) report(m, t);
}

static void test_async_starts_in_order(void **state) {
  (void)state;
  AsyncCase c;
  async_case_begin(&c, 1);
  // a completes bucket 2 first, but buckets start in index order, on every rank alike.
  report(&c.m, 0);
  expect_complete(c.gs, 0, 0, 1);
  expect_started(&c.f, 0);
  report(&c.m, 4);
  report(&c.m, 3);
  expect_started(&c.f, 0);
  report(&c.m, 2);
  expect_started(&c.f, 1);
  assert_int_equal(grad_sync_buckets_started(c.gs), 1);
  report(&c.m, 1);  // completes bucket 1, which releases bucket 2 behind it
  expect_started(&c.f, 3);
  assert_int_equal(c.f.in_flight, 3);
  grad_sync_finish(c.gs);
  assert_int_equal(c.f.waits, 1);
  assert_int_equal(c.f.in_flight, 0);
  expect_started(&c.f, 3);
  expect_reduced_once_and_quartered(&c.f, &c.m);
  assert_null(c.m.ps.grad_ready);
  // Bytes as one blocking allreduce of the block: a ring moves 2 (world-1)/world of the 208
  // payload bytes each way, so 208 sent and 208 received for a world of 2.
  assert_true(comm_stats(&c.f.base).bytes[COLL_ALLREDUCE] == 416.0);
  async_case_destroy(&c);
}

// Parameters unused this step (b here) are never reported: finish starts their buckets.
static void test_async_unreported_buckets(void **state) {
  (void)state;
  AsyncCase c;
  async_case_begin(&c, 1);
  report_last_three(&c.m);
  report(&c.m, 0);
  expect_started(&c.f, 1);
  grad_sync_finish(c.gs);
  expect_started(&c.f, 3);
  expect_reduced_once_and_quartered(&c.f, &c.m);
  async_case_destroy(&c);
}

// A step abandoned halfway (the trainer stops on a NaN loss) is waited for, not leaked.
static void test_destroy_waits_for_started_sums(void **state) {
  (void)state;
  AsyncCase c;
  async_case_begin(&c, 1);
  report_last_three(&c.m);
  assert_int_equal(c.f.in_flight, 1);
  grad_sync_destroy(c.gs);
  c.gs = NULL;
  assert_int_equal(c.f.in_flight, 0);
  assert_null(c.m.ps.grad_ready);
  async_case_destroy(&c);
}

static void test_bad_weights_stop_the_group(void **state) {
  (void)state;
  AsyncCase c;
  async_case_begin(&c, 5);  // more samples here than in the whole batch
  assert_true(comm_failed(&c.f.base));
  report_last_three(&c.m);
  grad_sync_finish(c.gs);
  assert_int_equal(c.f.n_started, 0);  // a failed group communicates no more
  async_case_destroy(&c);
}

// One tensor larger than a bucket gets a bucket of its own; a set without entries is one bucket.
static void test_layout_edges(void **state) {
  (void)state;
  LocalGroup *g = comm_local_group_create(1);
  Comm *c = comm_local_rank(g, 0);
  ParamSet ps;
  paramset_alloc(&ps, 100, 1);
  GradSync *gs = grad_sync_create(c, &ps, 64);
  assert_int_equal(grad_sync_bucket_count(gs), 1);
  size_t offset, count;
  grad_sync_bucket_range(gs, 0, &offset, &count);
  assert_true(offset == 0 && count == 100);
  grad_sync_destroy(gs);

  paramset_take(&ps, "small", 4, 0, NULL);
  paramset_take(&ps, "huge", 90, 0, NULL);
  paramset_take(&ps, "tail", 6, 0, NULL);
  gs = grad_sync_create(c, &ps, 64);  // 16 floats
  // From the end: tail 6 < 16, + huge = 96 >= 16 -> [4, 100); small -> [0, 4).
  assert_int_equal(grad_sync_bucket_count(gs), 2);
  grad_sync_bucket_range(gs, 0, &offset, &count);
  assert_true(offset == 4 && count == 96);
  grad_sync_bucket_range(gs, 1, &offset, &count);
  assert_true(offset == 0 && count == 4);
  grad_sync_destroy(gs);
  paramset_free(&ps);
  comm_destroy(c);
  comm_local_group_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_layout_and_completion),
      cmocka_unit_test(test_async_starts_in_order),
      cmocka_unit_test(test_async_unreported_buckets),
      cmocka_unit_test(test_destroy_waits_for_started_sums),
      cmocka_unit_test(test_bad_weights_stop_the_group),
      cmocka_unit_test(test_layout_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
