// MoCo's pieces on their own: the InfoNCE loss against PyTorch fixtures and finite differences,
// and the key queue's FIFO order, ages and staleness limit after wrap-around.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/infonce_reference.h"
#include "gradcheck.h"
#include "objectives/infonce.h"
#include "objectives/key_queue.h"
#include "objectives/ntxent.h"

enum { N = INFONCE_REF_N, D = INFONCE_REF_DIM, K = INFONCE_REF_K };

typedef struct {
  DnnlCtx ctx;
  InfoNce loss;
  float zq[N * D], q[N * D], norms[N], dq[N * D], dzq[N * D];
} Case;

static double case_run(Case *c) {
  l2norm_forward(c->zq, c->q, c->norms, N, D);
  double sum = infonce_forward_backward(&c->loss, &c->ctx, c->q, infonce_ref_k, infonce_ref_bank,
                                        infonce_ref_usable, N, c->dq);
  l2norm_backward(c->q, c->norms, c->dq, c->dzq, N, D);
  return sum / N;
}
static double case_loss(void *arg) { return case_run(arg); }

static void test_infonce_reference_and_fd(void **state) {
  (void)state;
  Case *c = calloc(1, sizeof *c);
  dnnl_ctx_init(&c->ctx);
  infonce_init(&c->loss, &c->ctx, N, K, D, INFONCE_REF_TEMPERATURE);
  memcpy(c->zq, infonce_ref_zq, sizeof c->zq);
  double loss = case_run(c);
  assert_float_equal(loss, INFONCE_REF_LOSS, 1e-5);
  for (int i = 0; i < N * D; i++) assert_float_equal(c->dzq[i], infonce_ref_dzq[i], 1e-5);
  float analytic[N * D];
  memcpy(analytic, c->dzq, sizeof analytic);
  assert_true(gradcheck(case_loss, c, c->zq, analytic, N * D, N * D, 1e-3f, 1e-4, "infonce dzq") <
              1e-2);
  infonce_destroy(&c->loss);
  dnnl_ctx_destroy(&c->ctx);
  free(c);
}

// Excluding a negative must equal leaving it out of the bank altogether.
static void test_infonce_unusable_is_absent(void **state) {
  (void)state;
  DnnlCtx ctx;
  dnnl_ctx_init(&ctx);
  InfoNce all, fewer;
  float q[N * D], norms[N], dq_a[N * D], dq_b[N * D], bank_b[K * D];
  l2norm_forward(infonce_ref_zq, q, norms, N, D);
  int kb = 0;
  for (int j = 0; j < K; j++)
    if (infonce_ref_usable[j])
      memcpy(bank_b + D * kb++, infonce_ref_bank + D * j, sizeof(float) * D);
  infonce_init(&all, &ctx, N, K, D, 0.2f);
  infonce_init(&fewer, &ctx, N, kb, D, 0.2f);
  double la = infonce_forward_backward(&all, &ctx, q, infonce_ref_k, infonce_ref_bank,
                                       infonce_ref_usable, N, dq_a);
  double lb = infonce_forward_backward(&fewer, &ctx, q, infonce_ref_k, bank_b, NULL, N, dq_b);
  assert_float_equal(la, lb, 1e-5);
  for (int i = 0; i < N * D; i++) assert_float_equal(dq_a[i], dq_b[i], 1e-6);
  infonce_destroy(&all);
  infonce_destroy(&fewer);
  dnnl_ctx_destroy(&ctx);
}

static void test_queue_fifo_and_ages(void **state) {
  (void)state;
  KeyQueue q;
  key_queue_init(&q, 5, 2, 1);
  // Initial entries are random unit vectors, all marked random.
  KeyQueueStats st = key_queue_stats(&q, 0, 0);
  assert_int_equal(st.random, 5);
  assert_int_equal(st.real, 0);
  for (int i = 0; i < 5; i++)
    assert_float_equal(hypotf(q.keys[2 * i], q.keys[2 * i + 1]), 1.0f, 1e-5);
  // Steps 0..3 push two keys each: (step, 0) and (step, 1). 8 keys through 5 slots.
  for (long s = 0; s < 4; s++) {
    float keys[4] = {(float)s, 0, (float)s, 1};
    key_queue_push(&q, keys, 2, s);
  }
  // Slots in write order: s0k0 s0k1 s1k0 s1k1 s2k0 | s2k1->0 s3k0->1 s3k1->2
  const float expect[5][2] = {{2, 1}, {3, 0}, {3, 1}, {1, 1}, {2, 0}};
  const long expect_step[5] = {2, 3, 3, 1, 2};
  for (int i = 0; i < 5; i++) {
    assert_float_equal(q.keys[2 * i], expect[i][0], 0);
    assert_float_equal(q.keys[2 * i + 1], expect[i][1], 0);
    assert_int_equal(q.step_of[i], expect_step[i]);
  }
  assert_int_equal(q.next, 3);  // the oldest (step 1) is overwritten next
  // Measured at step 4: ages 2, 1, 1, 3, 2.
  st = key_queue_stats(&q, 4, 0);
  assert_int_equal(st.real, 5);
  assert_int_equal(st.random, 0);
  assert_int_equal(st.usable, 5);
  assert_float_equal(st.oldest_age_steps, 3, 0);
  assert_float_equal(st.mean_age_steps, 9.0 / 5.0, 1e-12);
  // A staleness limit of 2 steps drops the step-1 key only.
  st = key_queue_stats(&q, 4, 2);
  assert_int_equal(st.usable, 4);
  assert_false(key_queue_usable(&q, 3, 4, 2));
  assert_true(key_queue_usable(&q, 0, 4, 2));
  key_queue_destroy(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_infonce_reference_and_fd),
      cmocka_unit_test(test_infonce_unusable_is_absent),
      cmocka_unit_test(test_queue_fifo_and_ages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
