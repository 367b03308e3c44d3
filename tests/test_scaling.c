// Throughput at N machines from a measured run and the step's traffic: the arithmetic of a ring
// allreduce and an allgather over a link, checked by hand on round numbers, and link rates in
// bits and bytes.
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
static const StepTraffic traffic = {100e6, 1000};

static void test_one_node_is_the_measured_run(void **state) {
  (void)state;
  ScalePrediction p;
  scaling_predict(&run, &traffic, &(ScaleQuestion){1, 1.25e9, 0}, &p);
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
  scaling_predict(&run, &traffic, &(ScaleQuestion){4, 1.25e9, 0}, &p);
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
  scaling_predict(&run, &traffic, &(ScaleQuestion){8, 1.25e9, 1}, &p);
  assert_int_equal(p.local_batch, 64);
  assert_int_equal(p.global_batch, 512);
  assert_true(fabs(p.compute_ms - 315) < 1e-9);
  assert_true(fabs(p.allgather_ms - 7 * 64 * 1000 / 1.25e9 * 1e3) < 1e-9);
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
      cmocka_unit_test(test_link_rates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
