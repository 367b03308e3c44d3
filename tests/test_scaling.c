// Throughput at N machines from a measured run and the step's traffic: the arithmetic of a ring
// allreduce and an allgather over a link, and of the latency every collective waits per round of
// its algorithm, checked by hand on round numbers; link rates in bits and bytes, latencies in
// time units.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>

#include "ledger/scaling.h"

// A replica of 64 samples: 10 ms loading, 100 forward, 200 backward, 5 optimizer.
static const MeasuredRun run = {.replicas = 1,
                                .local_batch = 64,
                                .global_batch = 64,
                                .data_ms = 10,
                                .forward_ms = 100,
                                .backward_ms = 200,
                                .optimizer_ms = 5,
                                .comm_ms = 0,
                                .step_ms = 315};
// 100 MB of gradients; 1000 bytes gathered per sample.
static const StepTraffic traffic = {100e6, 1000, 0, 0};

static void test_one_node_is_the_measured_run(void **state) {
  (void)state;
  ScalePrediction p;
  scaling_predict(&run, &traffic, &(ScaleQuestion){1, 1.25e9, 0, 0}, &p);
  assert_true(fabs(p.compute_ms - 315) < 1e-9);
  assert_true(p.comm_ms == 0);
  assert_true(fabs(p.images_per_s - 64 / 0.315) < 1e-6);
}

// 4 nodes on 10 Gbit/s (1.25e9 bytes/s), the global batch of 64 split: 16 samples each.
// Compute scales by 16/64: 2.5 + 25 + 50 ms, the optimizer stays 5. The ring allreduce moves
// 2 * 3/4 * 100 MB = 150 MB through each link: 120 ms. The gather brings 3 blocks of 16 samples
// of 1000 bytes: 48 kB, 0.0384 ms. Backward (50 ms) hides 50 of the allreduce's 120.
static void test_split_batch_over_four_nodes(void **state) {
  (void)state;
  ScalePrediction p;
  scaling_predict(&run, &traffic, &(ScaleQuestion){4, 1.25e9, 0, 0}, &p);
  assert_int_equal(p.local_batch, 16);
  assert_int_equal(p.global_batch, 64);
  assert_true(fabs(p.compute_ms - 82.5) < 1e-9);
  assert_true(fabs(p.allreduce_ms - 120) < 1e-9);
  assert_true(fabs(p.allgather_ms - 0.0384) < 1e-9);
  assert_true(fabs(p.step_ms_no_overlap - (82.5 + 120.0384)) < 1e-9);
  assert_true(fabs(p.step_ms - (2.5 + 25 + 120 + 5 + 0.0384)) < 1e-9);
  assert_true(fabs(p.images_per_s - 64 / (p.step_ms / 1e3)) < 1e-6);
}

// Keeping the per-replica batch: the global batch grows with N, compute stays, and the gather
// grows with N - 1 blocks.
static void test_kept_replica_batch(void **state) {
  (void)state;
  ScalePrediction p;
  scaling_predict(&run, &traffic, &(ScaleQuestion){8, 1.25e9, 1, 0}, &p);
  assert_int_equal(p.local_batch, 64);
  assert_int_equal(p.global_batch, 512);
  assert_true(fabs(p.compute_ms - 315) < 1e-9);
  assert_true(fabs(p.allgather_ms - 7 * 64 * 1000 / 1.25e9 * 1e3) < 1e-9);
}

// The same 4 nodes with 50 us per message round and 5 allreduces and 2 gathers a step. The
// gradients (100 MB) go round a ring: 2 * 3 = 6 rounds, 0.3 ms, hidden with its 120 ms of bytes
// only as far as backward (50 ms) reaches. The 4 other sums are small: recursive doubling,
// log2 4 = 2 rounds each, 0.4 ms. Each gather's ring: 3 rounds, 0.3 ms for both. Latency in all:
// 1 ms. Step: 2.5 + 25 + 120.3 + 5 + 0.4 + (0.0384 + 0.3) = 153.5384 ms.
static void test_latency_per_round(void **state) {
  (void)state;
  const StepTraffic calls = {100e6, 1000, 5, 2};
  ScalePrediction p;
  scaling_predict(&run, &calls, &(ScaleQuestion){4, 1.25e9, 0, 50e-6}, &p);
  assert_true(fabs(p.latency_ms - 1.0) < 1e-9);
  assert_true(fabs(p.allreduce_ms - 120.7) < 1e-9);
  assert_true(fabs(p.allgather_ms - 0.3384) < 1e-9);
  assert_true(fabs(p.comm_ms - 121.0384) < 1e-9);
  assert_true(fabs(p.step_ms - 153.5384) < 1e-9);
  assert_true(fabs(p.step_ms_no_overlap - (82.5 + 121.0384)) < 1e-9);
}

// Small collectives are not free at scale: a model of 8 kB of gradients (under Open MPI's 10 kB,
// so recursive doubling too) and 40 more sums, 512 nodes keeping their 64 samples. The bytes:
// 2 * 511/512 * 8000 B in 12.775 us. The rounds: 41 sums * log2 512 = 9 rounds * 50 us = 18.45
// ms, of which the gradients' 0.45 hide behind backward and the other 18 do not:
// 10 + 100 + 200 + 5 + 18 = 333 ms. One node waits for none of it.
static void test_small_sums_at_512_nodes(void **state) {
  (void)state;
  const StepTraffic tiny = {8000, 0, 41, 0};
  ScalePrediction p;
  scaling_predict(&run, &tiny, &(ScaleQuestion){512, 1.25e9, 1, 50e-6}, &p);
  assert_true(fabs(p.latency_ms - 18.45) < 1e-9);
  assert_true(fabs(p.comm_ms - (18.45 + 0.012775)) < 1e-9);
  assert_true(fabs(p.step_ms - 333) < 1e-9);
  scaling_predict(&run, &tiny, &(ScaleQuestion){1, 1.25e9, 1, 50e-6}, &p);
  assert_true(p.latency_ms == 0 && p.comm_ms == 0);
}

// A node count that is not a power of two rounds recursive doubling up: 3 nodes, log2 3 -> 2
// rounds for each of 2 small sums, 4 * 1 ms; the 8 kB gradients take 2 rounds too.
static void test_rounds_up_for_three_nodes(void **state) {
  (void)state;
  const StepTraffic tiny = {8000, 0, 3, 0};
  ScalePrediction p;
  scaling_predict(&run, &tiny, &(ScaleQuestion){3, 1.25e9, 1, 1e-3}, &p);
  assert_true(fabs(p.latency_ms - 6) < 1e-9);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_node_is_the_measured_run),
      cmocka_unit_test(test_split_batch_over_four_nodes),
      cmocka_unit_test(test_kept_replica_batch),
      cmocka_unit_test(test_latency_per_round),
      cmocka_unit_test(test_small_sums_at_512_nodes),
      cmocka_unit_test(test_rounds_up_for_three_nodes),
      cmocka_unit_test(test_latencies),
      cmocka_unit_test(test_link_rates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
