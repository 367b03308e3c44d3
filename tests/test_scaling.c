// Throughput at N machines from a measured run and the step's traffic: the arithmetic of a ring
// and a binomial allreduce and an allgather over a link, of gradient buckets overlapping
// backward, of the latency every collective waits per round of its algorithm and of the wait for
// the slower replica, checked by hand on round numbers; link rates in bits and bytes, latencies
// and algorithms by name.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>

#include "config.h"
#include "core/error.h"
#include "ledger/scaling.h"
#include "plan/plan.h"
#include "objectives/objective.h"

// A replica of 64 samples: 10 ms loading, 100 forward, 200 backward, 5 optimizer, no collectives.
static const MeasuredRun run = {.replicas = 1,
                                .local_batch = 64,
                                .global_batch = 64,
                                .data_ms = 10,
                                .forward_ms = 100,
                                .backward_ms = 200,
                                .optimizer_ms = 5,
                                .comm_ms = 0,
                                .step_ms = 315};
// 100 MB of gradients averaged in one piece as backward ends; 1000 bytes gathered per sample.
static const StepTraffic traffic = {.allreduce_payload_bytes = 100e6,
                                    .gather_bytes_per_sample = 1000};
// The same 100 MB in 4 buckets of 25 MB, written at a uniform rate over backward.
static const double quarters[4] = {25e6, 25e6, 25e6, 25e6}, uniform[4] = {0.25, 0.5, 0.75, 1};

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

static void test_one_node_is_the_measured_run(void **state) {
  (void)state;
  ScalePrediction p;
  scaling_predict(&run, &traffic, &(ScaleQuestion){.nodes = 1, .link_bytes_per_s = 1.25e9}, &p);
  assert_true(near(p.compute_ms, 315));
  assert_true(p.comm_ms == 0 && p.link_ms == 0 && p.wait_ms == 0);
  assert_true(near(p.step_ms, 315));
  assert_true(fabs(p.images_per_s - 64 / 0.315) < 1e-6);
}

// 4 nodes on 10 Gbit/s (1.25e9 bytes/s), the global batch of 64 split: 16 samples each, ring.
// Compute scales by 16/64: (315 - 5) / 4 + 5 = 82.5 ms; backward 50. The ring moves
// 2 * 3/4 * 100 MB = 150 MB through each link: 120 ms. One bucket is ready only as backward
// ends, so all 120 ms are exposed. The gather brings 3 blocks of 16 samples of 1000 bytes:
// 48 kB, 0.0384 ms. Step: 82.5 + 120 + 0.0384.
static void test_split_batch_over_four_nodes(void **state) {
  (void)state;
  ScalePrediction p;
  const ScaleQuestion q = {
      .nodes = 4, .link_bytes_per_s = 1.25e9, .allreduce = SCALE_ALLREDUCE_RING};
  scaling_predict(&run, &traffic, &q, &p);
  assert_int_equal(p.local_batch, 16);
  assert_int_equal(p.global_batch, 64);
  assert_int_equal(p.allreduce, SCALE_ALLREDUCE_RING);
  assert_true(near(p.compute_ms, 82.5));
  assert_true(near(p.gradient_ms, 120));
  assert_true(near(p.gradient_exposed_ms, 120));
  assert_true(near(p.allgather_ms, 0.0384));
  assert_true(near(p.link_ms, 120.0384));
  assert_true(near(p.comm_ms, 120.0384));
  assert_true(near(p.step_ms, 202.5384));
  assert_true(near(p.step_ms_no_overlap, 202.5384));
  assert_true(fabs(p.images_per_s - 64 / (p.step_ms / 1e3)) < 1e-6);
}

// The 4 buckets, each 30 ms on the ring, written at a uniform rate over the 50 ms of backward:
// ready at 12.5, 25, 37.5 and 50 ms. The link takes them in turn: done at 42.5, 72.5, 102.5,
// 132.5, so 82.5 ms outlast backward. On 100 Gbit/s (3 ms a bucket) each is done before the next
// is ready and only the last is exposed: 53 - 50 = 3 ms. Written later, at 40, 60, 80 and 100%
// of backward (20, 30, 40, 50 ms), they are done at 50, 80, 110, 140: 90 ms exposed.
static void test_buckets_overlap_backward(void **state) {
  (void)state;
  StepTraffic four = {.allreduce_payload_bytes = 100e6,
                      .gradient_buckets = 4,
                      .bucket_bytes = quarters,
                      .bucket_ready = uniform,
                      .gather_bytes_per_sample = 1000};
  ScalePrediction p;
  ScaleQuestion q = {.nodes = 4, .link_bytes_per_s = 1.25e9, .allreduce = SCALE_ALLREDUCE_RING};
  scaling_predict(&run, &four, &q, &p);
  assert_true(near(p.gradient_ms, 120));
  assert_true(near(p.gradient_exposed_ms, 82.5));
  assert_true(near(p.step_ms, 82.5 + 82.5 + 0.0384));
  assert_true(near(p.step_ms_no_overlap, 82.5 + 120.0384));
  q.link_bytes_per_s = 12.5e9;
  scaling_predict(&run, &four, &q, &p);
  assert_true(near(p.gradient_ms, 12));
  assert_true(near(p.gradient_exposed_ms, 3));
  const double later[4] = {0.4, 0.6, 0.8, 1};
  four.bucket_ready = later;
  q.link_bytes_per_s = 1.25e9;
  scaling_predict(&run, &four, &q, &p);
  assert_true(near(p.gradient_exposed_ms, 90));
}

// Open MPI's own choice for Tally's in-place buckets is binomial: a reduce up the tree and a
// broadcast down it, each log2 4 = 2 whole-bucket transfers in turn, 4 * 25 MB = 100 MB, 80 ms a
// bucket. Ready at 12.5, 25, 37.5, 50: done at 92.5, 172.5, 252.5, 332.5; exposed 282.5 of 320.
// 3 nodes round log2 up: the same 4 transfers a bucket.
static void test_binomial_is_the_default(void **state) {
  (void)state;
  const StepTraffic four = {.allreduce_payload_bytes = 100e6,
                            .gradient_buckets = 4,
                            .bucket_bytes = quarters,
                            .bucket_ready = uniform};
  ScalePrediction p;
  ScaleQuestion q = {.nodes = 4, .link_bytes_per_s = 1.25e9};
  scaling_predict(&run, &four, &q, &p);
  assert_int_equal(p.allreduce, SCALE_ALLREDUCE_BINOMIAL);
  assert_true(near(p.gradient_ms, 320));
  assert_true(near(p.gradient_exposed_ms, 282.5));
  q.allreduce = SCALE_ALLREDUCE_BINOMIAL;
  scaling_predict(&run, &four, &q, &p);
  assert_true(near(p.gradient_exposed_ms, 282.5));
  q.nodes = 3;
  q.keep_replica_batch = 1;  // backward stays 200 ms: each 80 ms bucket ready at 50, 100, ...
  scaling_predict(&run, &four, &q, &p);
  // done at 130, 210, 290, 370: 170 ms outlast backward.
  assert_true(near(p.gradient_ms, 320));
  assert_true(near(p.gradient_exposed_ms, 170));
}

// Keeping the per-replica batch: the global batch grows with N, compute stays, and the gather
// grows with N - 1 blocks: 7 * 64 * 1000 bytes.
static void test_kept_replica_batch(void **state) {
  (void)state;
  ScalePrediction p;
  const ScaleQuestion q = {.nodes = 8, .link_bytes_per_s = 1.25e9, .keep_replica_batch = 1};
  scaling_predict(&run, &traffic, &q, &p);
  assert_int_equal(p.local_batch, 64);
  assert_int_equal(p.global_batch, 512);
  assert_true(near(p.compute_ms, 315));
  assert_true(near(p.allgather_ms, 0.3584));
}

// The 4 nodes of the ring with 50 us per message round and 5 allreduces and 2 gathers a step. The
// gradients' ring: 2 * 3 = 6 rounds, 0.3 ms, exposed with its 120 ms (one bucket). The 4 other
// sums: recursive doubling, log2 4 = 2 rounds each, 0.4 ms. Each gather exchanges its counts
// (2 rounds) then its blocks (a ring of 3): 5 rounds, 0.5 ms for both. Latency in all: 1.2 ms.
// Comm: 120.3 + 0.4 + (0.0384 + 0.5) = 121.2384; step 82.5 more.
static void test_latency_per_round(void **state) {
  (void)state;
  StepTraffic calls = traffic;
  calls.allreduce_calls = 5;
  calls.allgather_calls = 2;
  ScalePrediction p;
  const ScaleQuestion q = {.nodes = 4,
                           .link_bytes_per_s = 1.25e9,
                           .latency_s = 50e-6,
                           .allreduce = SCALE_ALLREDUCE_RING};
  scaling_predict(&run, &calls, &q, &p);
  assert_true(near(p.latency_ms, 1.2));
  assert_true(near(p.gradient_ms, 120.3));
  assert_true(near(p.sums_ms, 0.4));
  assert_true(near(p.allgather_ms, 0.5384));
  assert_true(near(p.comm_ms, 121.2384));
  assert_true(near(p.step_ms, 203.7384));
}

// A reference of two replicas of 32 (global 64) that spent 6 ms of its 131 ms step in its
// in-memory collectives, i.e. waiting for the slower replica: compute (131 - 6 - 5) + 5 = 125.
// On 2 nodes of 100 Mbit/s (12.5e6 bytes/s), ring: 1 MB of gradients, one bucket, 2 * 1/2 * 1 MB
// in 80 ms; 2000 bytes of other sums, 2 * 1/2 * 2000 bytes in 0.16 ms. Comm: the wait (6) + 80 +
// 0.16 = 86.16; step 211.16. Split over 4 nodes (16 samples each), compute and wait halve:
// (120 / 2 + 5) and 3 ms. One node waits for nobody.
static void test_wait_for_the_slower_replica(void **state) {
  (void)state;
  const MeasuredRun two = {.replicas = 2,
                           .local_batch = 32,
                           .global_batch = 64,
                           .forward_ms = 40,
                           .backward_ms = 80,
                           .optimizer_ms = 5,
                           .comm_ms = 6,
                           .step_ms = 131};
  const StepTraffic small = {
      .allreduce_payload_bytes = 1e6, .other_allreduce_bytes = 2000, .allreduce_calls = 2};
  ScalePrediction p;
  ScaleQuestion q = {.nodes = 2, .link_bytes_per_s = 12.5e6, .allreduce = SCALE_ALLREDUCE_RING};
  scaling_predict(&two, &small, &q, &p);
  assert_true(near(p.compute_ms, 125));
  assert_true(near(p.wait_ms, 6));
  assert_true(near(p.gradient_exposed_ms, 80));
  assert_true(near(p.sums_ms, 0.16));
  assert_true(near(p.comm_ms, 86.16));
  assert_true(near(p.step_ms, 211.16));
  q.nodes = 4;
  scaling_predict(&two, &small, &q, &p);
  assert_true(near(p.compute_ms, 65));
  assert_true(near(p.wait_ms, 3));
  q.nodes = 1;
  scaling_predict(&two, &small, &q, &p);
  assert_true(p.wait_ms == 0 && p.comm_ms == 0);
}

// Small collectives are not free at scale: a model of 8 kB of gradients and 40 more sums, 512
// nodes keeping their 64 samples, Open MPI's binomial for the gradient: 2 * 9 rounds and 18 times
// its 8000 bytes, 0.9 + 0.1152 ms, exposed (one bucket). The 40 sums: 9 rounds * 50 us each,
// 18 ms. Step: 315 + 1.0152 + 18. One node waits for none of it.
static void test_small_sums_at_512_nodes(void **state) {
  (void)state;
  const StepTraffic tiny = {.allreduce_payload_bytes = 8000, .allreduce_calls = 41};
  ScalePrediction p;
  ScaleQuestion q = {
      .nodes = 512, .link_bytes_per_s = 1.25e9, .keep_replica_batch = 1, .latency_s = 50e-6};
  scaling_predict(&run, &tiny, &q, &p);
  assert_true(near(p.latency_ms, 18.9));
  assert_true(near(p.gradient_exposed_ms, 1.0152));
  assert_true(near(p.comm_ms, 19.0152));
  assert_true(near(p.step_ms, 334.0152));
  q.nodes = 1;
  scaling_predict(&run, &tiny, &q, &p);
  assert_true(p.latency_ms == 0 && p.comm_ms == 0);
}

// Sums that grow with the global batch: 1000 fixed bytes and 512 a sample (inbatch's column
// gradients at d = 64). 8 nodes keeping the measured 64 samples each: a global batch of 512,
// 1000 + 512 * 512 = 263144 bytes, 2 * 7/8 of them on a ring at 1.25 GB/s, no latency:
// 0.368402 ms. Splitting the measured global batch of 64 instead: 1000 + 512 * 64 = 33768
// bytes, 0.047275 ms.
static void test_sums_grow_with_the_global_batch(void **state) {
  (void)state;
  const MeasuredRun r = {
      .replicas = 1, .local_batch = 64, .global_batch = 64, .backward_ms = 10, .step_ms = 20};
  const StepTraffic t = {.allreduce_payload_bytes = 8000,
                         .other_allreduce_bytes = 1000,
                         .other_allreduce_bytes_per_sample = 512,
                         .allreduce_calls = 2};
  ScalePrediction p;
  ScaleQuestion q = {.nodes = 8, .link_bytes_per_s = 1.25e9, .keep_replica_batch = 1};
  q.allreduce = SCALE_ALLREDUCE_RING;
  scaling_predict(&r, &t, &q, &p);
  assert_int_equal(p.global_batch, 512);
  assert_true(near(p.sums_ms, 2.0 * 7 / 8 * 263144 / 1.25e6));
  q.keep_replica_batch = 0;
  scaling_predict(&r, &t, &q, &p);
  assert_int_equal(p.global_batch, 64);
  assert_true(near(p.sums_ms, 2.0 * 7 / 8 * 33768 / 1.25e6));
}

// A node count that is not a power of two rounds log2 up: 3 nodes, 2 rounds for each of 2 small
// sums and 2 * 2 for the binomial gradient: 8 rounds of 1 ms.
static void test_rounds_up_for_three_nodes(void **state) {
  (void)state;
  const StepTraffic tiny = {.allreduce_payload_bytes = 8000, .allreduce_calls = 3};
  ScalePrediction p;
  const ScaleQuestion q = {
      .nodes = 3, .link_bytes_per_s = 1.25e9, .keep_replica_batch = 1, .latency_s = 1e-3};
  scaling_predict(&run, &tiny, &q, &p);
  assert_true(near(p.latency_ms, 8));
}

static void test_allreduce_names(void **state) {
  (void)state;
  ScaleAllreduce a;
  assert_int_equal(scaling_parse_allreduce("ring", &a), 0);
  assert_int_equal(a, SCALE_ALLREDUCE_RING);
  assert_int_equal(scaling_parse_allreduce("Binomial", &a), 0);
  assert_int_equal(a, SCALE_ALLREDUCE_BINOMIAL);
  assert_int_equal(scaling_parse_allreduce("auto", &a), 0);
  assert_int_equal(a, SCALE_ALLREDUCE_AUTO);
  assert_int_equal(scaling_parse_allreduce("tree", &a), -1);
  assert_string_equal(scaling_allreduce_name(SCALE_ALLREDUCE_BINOMIAL), "binomial");
}

// What the plan tells the prediction about the buckets, on inbatch's ResNet with 2 replicas of
// 16: they cover the gradient block (the parameter count) in the order they start, every one but
// the last at least bucket_kib, none ready before the one before it, the first well before
// backward ends (what can overlap), the last (the first layer's) as it ends: past 95% of its
// FLOPs (99.7% here). Buckets of
// 1 kB on a ViT of 12 blocks are about one per tensor, more than the plan keeps: merged, they
// still cover the block.
static void test_plan_buckets(void **state) {
  (void)state;
  static Config c;
  config_defaults(&c);
  if (config_load_model(&c, "models/resnet-small.ini") != 0) fail_msg("%s", tl_last_error());
  const char *sets[] = {"data.limit=256", "train.batch_size=32", "train.steps=3",
                        "parallel.replicas=2", "parallel.bucket_kib=256"};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    if (config_set(&c, sets[i]) != 0) fail_msg("%s", tl_last_error());
  const PlanOptions no_knn = {.no_knn = 1};
  static PlanTotals t;
  LedgerRecord r;
  if (plan_build(&c, "inbatch", 0, &no_knn, &r, &t) != 0) fail_msg("%s", tl_last_error());
  assert_true(t.grad_buckets >= 2);
  size_t floats = 0;
  for (int b = 0; b < t.grad_buckets; b++) {
    floats += t.grad_bucket_floats[b];
    if (b < t.grad_buckets - 1) assert_true(t.grad_bucket_floats[b] >= 256 * 1024 / 4);
    if (b > 0) assert_true(t.grad_bucket_ready[b] >= t.grad_bucket_ready[b - 1]);
  }
  assert_int_equal(floats, t.param_count);
  assert_true(t.grad_bucket_ready[0] > 0 && t.grad_bucket_ready[0] < 1);
  assert_true(t.grad_bucket_ready[t.grad_buckets - 1] > 0.95);

  if (config_load_model(&c, "models/vit-tiny.ini") != 0 ||
      config_set(&c, "parallel.bucket_kib=1") != 0)
    fail_msg("%s", tl_last_error());
  c.model.spec.depth = 12;  // a dozen tensors a block: past PLAN_MAX_BUCKETS
  if (plan_build(&c, "inbatch", 0, &no_knn, &r, &t) != 0) fail_msg("%s", tl_last_error());
  // Merged at least once: a pair of each of the first PLAN_MAX_BUCKETS, then the rest.
  assert_true(t.grad_buckets > PLAN_MAX_BUCKETS / 2 && t.grad_buckets <= PLAN_MAX_BUCKETS);
  floats = 0;
  for (int b = 0; b < t.grad_buckets; b++) floats += t.grad_bucket_floats[b];
  assert_int_equal(floats, t.param_count);
}

static void test_latencies(void **state) {
  (void)state;
  double s;
  assert_int_equal(scaling_parse_latency("50us", &s), 0);
  assert_true(fabs(s - 50e-6) < 1e-18);
  assert_int_equal(scaling_parse_latency("0.2ms", &s), 0);
  assert_true(fabs(s - 2e-4) < 1e-18);
  assert_int_equal(scaling_parse_latency("0", &s), 0);
  assert_true(s == 0);
  assert_int_equal(scaling_parse_latency("50", &s), -1);
  assert_int_equal(scaling_parse_latency("-5us", &s), -1);
  assert_int_equal(scaling_parse_latency("5 fortnights", &s), -1);
}

static void test_link_rates(void **state) {
  (void)state;
  double r;
  assert_int_equal(scaling_parse_rate("10Gbit", &r), 0);
  assert_true(r == 1.25e9);
  assert_int_equal(scaling_parse_rate("100Mbit/s", &r), 0);
  assert_true(r == 12.5e6);
  assert_int_equal(scaling_parse_rate("125MB/s", &r), 0);
  assert_true(r == 125e6);
  assert_int_equal(scaling_parse_rate("1.25 GB/s", &r), 0);
  assert_true(r == 1.25e9);
  assert_int_equal(scaling_parse_rate("10 parsecs", &r), -1);
  assert_int_equal(scaling_parse_rate("-1Gbit", &r), -1);
}

// The payload of a line: a 1500-byte frame takes 1538 bytes of the wire and carries 1448 of TCP
// payload; a 9000-byte one 9038 and 8948; MTU 0 passes the rate through.
static void test_payload_rate(void **state) {
  (void)state;
  double p;
  assert_int_equal(scaling_payload_rate(12.5e6, 1500, &p), 0);
  assert_true(fabs(p - 12.5e6 * 1448 / 1538) < 1e-6);
  assert_true(p > 11.76e6 && p < 11.77e6);
  assert_int_equal(scaling_payload_rate(1.25e9, 9000, &p), 0);
  assert_true(fabs(p - 1.25e9 * 8948 / 9038) < 1e-3);
  assert_int_equal(scaling_payload_rate(1.25e9, 0, &p), 0);
  assert_true(p == 1.25e9);
  assert_int_equal(scaling_payload_rate(1.25e9, 100, &p), -1);
  assert_int_equal(scaling_payload_rate(1.25e9, 70000, &p), -1);
  assert_int_equal(scaling_payload_rate(1.25e9, -1500, &p), -1);
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_node_is_the_measured_run),
      cmocka_unit_test(test_split_batch_over_four_nodes),
      cmocka_unit_test(test_buckets_overlap_backward),
      cmocka_unit_test(test_binomial_is_the_default),
      cmocka_unit_test(test_kept_replica_batch),
      cmocka_unit_test(test_latency_per_round),
      cmocka_unit_test(test_wait_for_the_slower_replica),
      cmocka_unit_test(test_small_sums_at_512_nodes),
      cmocka_unit_test(test_rounds_up_for_three_nodes),
      cmocka_unit_test(test_sums_grow_with_the_global_batch),
      cmocka_unit_test(test_allreduce_names),
      cmocka_unit_test(test_plan_buckets),
      cmocka_unit_test(test_latencies),
      cmocka_unit_test(test_link_rates),
      cmocka_unit_test(test_payload_rate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
