// MoCo's pieces on their own: the InfoNCE loss against PyTorch fixtures and finite differences,
// the key queue's FIFO order, ages and staleness limit after wrap-around, and ShuffleBN across
// local replicas (every key comes back to its own query, whatever slice encoded it).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fixtures/infonce_reference.h"
#include "gradcheck.h"
#include "model_test_util.h"
#include "objectives/infonce.h"
#include "objectives/key_queue.h"
#include "objectives/moco.h"
#include "objectives/objective.h"
#include "ops/l2norm.h"
#include "replica_test_util.h"

enum { N = INFONCE_REF_N, D = INFONCE_REF_DIM, K = INFONCE_REF_K };

typedef struct {
  ExecCtx ctx;
  InfoNce loss;
  L2Norm unit;  // the queries normalized
  float zq[N * D], dq[N * D], dzq[N * D];
} Case;

static double case_run(Case *c) {
  l2norm_forward(&c->unit, &c->ctx, c->zq);
  double sum = infonce_forward_backward(&c->loss, &c->ctx, c->unit.out, infonce_ref_k,
                                        infonce_ref_bank, infonce_ref_usable, N, c->dq);
  l2norm_backward(&c->unit, &c->ctx, c->dq);
  memcpy(c->dzq, c->unit.din, sizeof c->dzq);
  return sum / N;
}

// Rows of z divided by their lengths, in double: the tests' own queries.
static void unit_rows(const float *z, float *u, int rows, int d) {
  for (int i = 0; i < rows; i++) {
    double ss = 0;
    for (int k = 0; k < d; k++) ss += (double)z[i * d + k] * z[i * d + k];
    for (int k = 0; k < d; k++) u[i * d + k] = (float)(z[i * d + k] / sqrt(ss));
  }
}
static double case_loss(void *arg) { return case_run(arg); }

static void test_infonce_reference_and_fd(void **state) {
  (void)state;
  Case *c = calloc(1, sizeof *c);
  exec_ctx_init(&c->ctx);
  infonce_init(&c->loss, &c->ctx, N, K, D, INFONCE_REF_TEMPERATURE);
  const Builder b = {.ctx = &c->ctx, .mode = OP_TRAIN, .component = COMP_LOSS};
  l2norm_init(&c->unit, &b, N, D, 1);
  memcpy(c->zq, infonce_ref_zq, sizeof c->zq);
  double loss = case_run(c);
  assert_float_equal(loss, INFONCE_REF_LOSS, 1e-5);
  for (int i = 0; i < N * D; i++) assert_float_equal(c->dzq[i], infonce_ref_dzq[i], 1e-5);
  float analytic[N * D];
  memcpy(analytic, c->dzq, sizeof analytic);
  assert_true(gradcheck(case_loss, c, c->zq, analytic, N * D, N * D, 1e-2f, 1e-4, "infonce dzq") <
              1e-2);
  infonce_destroy(&c->loss);
  l2norm_destroy(&c->unit);
  exec_ctx_destroy(&c->ctx);
  free(c);
}

// Excluding a negative must equal leaving it out of the bank altogether.
static void test_infonce_unusable_is_absent(void **state) {
  (void)state;
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  InfoNce all, fewer;
  float q[N * D], dq_a[N * D], dq_b[N * D], bank_b[K * D];
  unit_rows(infonce_ref_zq, q, N, D);
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
  exec_ctx_destroy(&ctx);
}

// A temperature far below the logits' spread leaves the positive a probability no float holds
// (exp(-2 / 0.005) is 1e-174): the loss must still be the exact cross entropy, here summed in
// double by the test from the definition, and the gradient still finite.
static void test_infonce_cold_temperature(void **state) {
  (void)state;
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  const float t = 0.005f;
  float q[N * D], dq[N * D];
  unit_rows(infonce_ref_zq, q, N, D);
  InfoNce l;
  infonce_init(&l, &ctx, N, K, D, t);
  double got = infonce_forward_backward(&l, &ctx, q, infonce_ref_k, infonce_ref_bank, NULL, N, dq);
  double want = 0;
  int tiny = 0;
  for (int i = 0; i < N; i++) {
    double logits[K + 1], mx = -INFINITY, z = 0;
    for (int j = 0; j <= K; j++) {
      const float *x = j < K ? infonce_ref_bank + (size_t)j * D : infonce_ref_k + (size_t)i * D;
      double dot = 0;
      for (int e = 0; e < D; e++) dot += (double)q[i * D + e] * x[e];
      logits[j] = dot / t;
      mx = fmax(mx, logits[j]);
    }
    for (int j = 0; j <= K; j++) z += exp(logits[j] - mx);
    double li = mx + log(z) - logits[K];
    tiny += li > 69;  // the positive's probability is below 1e-30
    want += li;
  }
  assert_true(tiny > 0);  // the case this test is for
  assert_true(fabs(got - want) <= 1e-4 * fabs(want));
  for (int i = 0; i < N * D; i++) assert_true(isfinite(dq[i]));
  infonce_destroy(&l);
  exec_ctx_destroy(&ctx);
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

// ---- ShuffleBN across replicas, through the objective ----
//
// With several replicas the keys' images are gathered, permuted over the global batch, encoded
// by slices (one per replica, of that replica's shard size), gathered again and un-permuted, so
// each replica ends with the keys of its own samples in order. The permutation is internal to
// moco.c, so it is observed through what BatchNorm does with it. The key encoder here is a ViT
// (no BatchNorm: each image's features are its own) under the projection head, whose BatchNorm
// uses the statistics of the slice it runs on. Every sample of the batch shows one image A,
// except sample s which shows image X. Per hidden channel, a slice holding X and n - 1 copies of
// A standardizes X to +-sqrt(n - 1) and the A's to -+1/sqrt(n - 1), with the signs of
// (X - A): after the fused ReLU and the bias-free-at-start fc2, X's key points one way and its
// slice-mates' another, the same for every slice size n. A slice of A's only has no variance
// and gives no such key. So, against one replica (no shuffle, one slice): sample s's key must be
// X's key and no other sample's may be, which holds for every s only if the permutation visits
// every sample once and the un-permutation returns each key to its own sample; and the samples
// that got the slice-mate key show which samples shared X's slice: one replica's shard size of
// them, drawn from other replicas' samples too, or nothing was shuffled.

enum { SB_N = 8, SB_S = 8, SB_DIM = 16 };

typedef struct {
  LocalGroup *group;
  const Config *cfg;
  int rank, first, b;
  float keys[SB_N][SB_N * SB_DIM];  // [step s] (b, SB_DIM): this replica's keys at step s
  int failed;                       // an error inside the thread, reported by the main thread
} ShuffleReplica;

// Image A everywhere but at global sample `odd`, which gets image X, in both views.
static void fill_views(float *views, const ShuffleReplica *r, int odd) {
  const int f = SB_S * SB_S;
  Rng ra = rng_stream(5, RNG_TEST, 1, 0), rx = rng_stream(5, RNG_TEST, 2, 0);
  float a[SB_S * SB_S], x[SB_S * SB_S];
  for (int i = 0; i < f; i++) a[i] = rng_normal(&ra);
  for (int i = 0; i < f; i++) x[i] = rng_normal(&rx);
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < r->b; i++)
      memcpy(views + ((size_t)v * r->b + i) * f, r->first + i == odd ? x : a, sizeof a);
}

static void *shuffle_replica_thread(void *arg) {
  ShuffleReplica *r = arg;
  const ObjectiveDef *def = objective_find("moco");
  Comm *comm = comm_local_rank(r->group, r->rank);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  ParamSet ps;
  paramset_alloc(&ps, objective_param_count(def, r->cfg), 3);
  ObjectiveEnv env = {r->cfg, &ctx, comm, &ps,  r->b, SB_N, (double)SB_N / r->b,
                      SB_N,   NULL, NULL, NULL, NULL, NULL};
  Objective *o = objective_create(def, &env);
  float *views = calloc((size_t)2 * r->b * SB_S * SB_S, sizeof(float));
  int indices[SB_N] = {0}, labels[SB_N] = {0};
  r->failed = !o || !views;
  for (int s = 0; s < SB_N && !r->failed; s++) {
    fill_views(views, r, s);
    Batch batch = {.global_step = s,
                   .n = r->b,
                   .n_views = 2,
                   .views = views,
                   .indices = indices,
                   .labels = labels};
    LedgerRecord rec = {0};
    paramset_zero_grad(&ps, 0);
    objective_step(o, &batch, &rec);
    memcpy(r->keys[s], moco_last_keys(o), sizeof(float) * r->b * SB_DIM);
    def->after_update(o, &batch, &rec);
    r->failed = comm_failed(comm);
  }
  free(views);
  if (o) def->destroy(o);
  paramset_free(&ps);
  exec_ctx_destroy(&ctx);
  comm_destroy(comm);
  return NULL;
}

static void shuffle_config(Config *cfg) {
  config_defaults(cfg);
  cfg->data.image_size = SB_S;
  cfg->data.channels = 1;
  cfg->model.spec = tiny_model_spec("vit");
  cfg->model.spec.dim = 16;
  cfg->model.head_hidden_dim = 32;
  cfg->model.head_out_dim = SB_DIM;
  cfg->train.batch_size = SB_N;
  if (config_set(cfg, "moco.queue_size=16")) fail_msg("%s", tl_last_error());
}

// keys[s][i]: sample i's key at step s, over the whole batch sharded as `sizes`.
static void run_shuffled(int world, const int *sizes, float (*keys)[SB_N][SB_DIM]) {
  Config cfg;
  shuffle_config(&cfg);
  ShuffleReplica *reps = calloc((size_t)world, sizeof *reps);
  LocalGroup *g = comm_local_group_create(world);
  for (int r = 0, first = 0; r < world; first += sizes[r++])
    reps[r] = (ShuffleReplica){.group = g, .cfg = &cfg, .rank = r, .first = first, .b = sizes[r]};
  run_on_threads(world, shuffle_replica_thread, reps, sizeof reps[0]);
  comm_local_group_destroy(g);
  for (int r = 0; r < world; r++) {
    if (reps[r].failed) fail_msg("replica %d of %d failed: %s", r, world, tl_last_error());
    for (int s = 0; s < SB_N; s++)
      memcpy(&keys[s][reps[r].first], reps[r].keys[s], sizeof(float) * reps[r].b * SB_DIM);
  }
  free(reps);
}

static double distance(const float *a, const float *b) {
  double ss = 0;
  for (int k = 0; k < SB_DIM; k++) ss += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
  return sqrt(ss);
}

// The replica whose shard holds `sample`.
static int owner(int world, const int *sizes, int sample) {
  for (int r = 0, first = 0; r < world; first += sizes[r++])
    if (sample < first + sizes[r]) return r;
  return world;
}

static void expect_keys_return_home(int world, const int *sizes) {
  static float one[SB_N][SB_N][SB_DIM], split[SB_N][SB_N][SB_DIM];
  run_shuffled(1, (const int[]){SB_N}, one);
  run_shuffled(world, sizes, split);
  int mates_elsewhere = 0;
  for (int s = 0; s < SB_N; s++) {
    const float *x_key = one[s][s], *mate_key = one[s][(s + 1) % SB_N];
    // The picture the test relies on: X's key and its slice-mates' are unit vectors far apart.
    assert_true(distance(x_key, mate_key) > 0.5);
    // BatchNorm's epsilon shrinks each channel by a factor that depends on the slice's variance,
    // so keys from slices of other sizes differ by ~1e-3; keys of different kinds by ~1.
    double own = distance(split[s][s], x_key);
    if (own > 2e-2) fail_msg("step %d: sample %d's key is %.3g from its own", s, s, own);
    int mates = 0;
    for (int i = 0; i < SB_N; i++) {
      if (i == s) continue;
      if (distance(split[s][i], x_key) < 0.25)
        fail_msg("step %d: sample %d got the key of sample %d", s, i, s);
      if (distance(split[s][i], mate_key) < 2e-2) {
        mates++;
        mates_elsewhere += owner(world, sizes, i) != owner(world, sizes, s);
      }
    }
    int slice_is_a_shard = 0;
    for (int r = 0; r < world; r++) slice_is_a_shard |= mates + 1 == sizes[r];
    if (!slice_is_a_shard) fail_msg("step %d: sample %d's slice held %d samples", s, s, mates + 1);
  }
  print_message("%d replicas: over %d steps, %d slice-mates came from another replica\n", world,
                SB_N, mates_elsewhere);
  assert_true(mates_elsewhere > 0);
}

static void test_shufflebn_two_replicas(void **state) {
  (void)state;
  expect_keys_return_home(2, (const int[]){5, 3});
}

static void test_shufflebn_three_replicas(void **state) {
  (void)state;
  expect_keys_return_home(3, (const int[]){3, 3, 2});
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_infonce_reference_and_fd),
      cmocka_unit_test(test_infonce_unusable_is_absent),
      cmocka_unit_test(test_infonce_cold_temperature),
      cmocka_unit_test(test_queue_fifo_and_ages),
      cmocka_unit_test(test_shufflebn_two_replicas),
      cmocka_unit_test(test_shufflebn_three_replicas),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
