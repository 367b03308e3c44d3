// train.budget end to end: a FLOP budget runs exactly the steps the plan's per-step count allows;
// an epoch budget the steps of that many epochs; a time budget runs past a provisional length
// shorter than the steps it must time, stops on its own count, and a checkpoint taken before
// that count was known resumes into a run that times its steps again. Local replicas and MPI
// ranks all stop after the same step (timeout(1) turns a hang into exit code 124).
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "objective_test_util.h"

static const char *mpiexec;

// 256 images at batch 32: 8 steps an epoch.
static const char *run_args =
    "--objective=inbatch --set train.batch_size=32 --set data.limit=256 --no-knn";

static int train(const char *extra, const char *dir) {
  int rc = sh("timeout 300 %s train %s %s --out %s/%s > %s/%s.log 2>&1", bin, run_args, extra,
              tmpdir, dir, tmpdir, dir);
  if (rc != 0) sh("cat %s/%s.log", tmpdir, dir);
  return rc;
}

// The step count the run announced for its budget ("budget B: N steps (...)"), or -1.
static int announced_steps(const char *dir) {
  char path[512], line[1024];
  snprintf(path, sizeof path, "%s/%s.log", tmpdir, dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int n = -1;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, ": ");
    if (strncmp(line, "budget ", 7) == 0 && p) n = atoi(p + 2);
  }
  fclose(f);
  return n;
}

static double summary_value(const char *dir, const char *key) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/summary.json", tmpdir, dir);
  char *text = run_ok("tr -d '\\n ' < %s", path);
  double v = -1;
  assert_int_equal(json_get(text, key, &v), 1);
  free(text);
  return v;
}

// One step's FLOPs as the plan counts them: forward plus backward of step 0.
static double planned_step_flops(void) {
  char *plan = run_ok("%s plan %s --step 0 --json", bin, run_args);
  double f = 0, b = 0;
  assert_int_equal(json_get(plan, "flops_forward", &f), 1);
  assert_int_equal(json_get(plan, "flops_backward", &b), 1);
  free(plan);
  assert_true(f > 0 && b > 0);
  return f + b;
}

// 3.5 steps' worth of FLOPs is three steps, whatever the provisional length (1 epoch = 8 steps),
// on one replica, on two local ones and on two MPI ranks; stopped after 2 and resumed, still 3.
static void test_flop_budget(void **state) {
  (void)state;
  const double per_step = planned_step_flops();
  char extra[256];
  snprintf(extra, sizeof extra, "--budget %.9eflop", 3.5 * per_step);
  assert_int_equal(train(extra, "flops"), 0);
  assert_int_equal(ledger_lines("flops"), 3);
  assert_int_equal(announced_steps("flops"), 3);
  double total = summary_value("flops", "flops_total");
  if (fabs(total - 3 * per_step) > 1e-5 * total)  // summary.json keeps 6 digits
    fail_msg("summary flops_total %.9g, three planned steps make %.9g", total, 3 * per_step);

  char local[300];
  snprintf(local, sizeof local, "%s --set parallel.replicas=2", extra);
  assert_int_equal(train(local, "flops2"), 0);
  assert_int_equal(ledger_lines("flops2"), 3);

  char stop[300];
  snprintf(stop, sizeof stop, "%s --stop-at 2", extra);
  assert_int_equal(train(stop, "flops_resumed"), 0);
  assert_int_equal(ledger_lines("flops_resumed"), 2);
  assert_int_equal(sh("%s train --resume %s/flops_resumed --no-knn >> %s/flops_resumed.log 2>&1",
                      bin, tmpdir, tmpdir),
                   0);
  assert_int_equal(ledger_lines("flops_resumed"), 3);

  if (!mpiexec || !mpiexec[0]) {
    // ctest passes MPIEXEC; only a hand-run binary lacks it, and CI must not pass by skipping.
    if (getenv("CI")) fail_msg("MPIEXEC is not set: the two-rank run cannot start");
    print_message("MPIEXEC is not set: skipping the two-rank runs\n");
    return;
  }
  int rc =
      sh("ASAN_OPTIONS=detect_leaks=0 timeout 300 %s --allow-run-as-root --oversubscribe -np 2 "
         "%s train %s %s --set parallel.backend=mpi --out %s/flops_mpi > %s/flops_mpi.log 2>&1",
         mpiexec, bin, run_args, extra, tmpdir, tmpdir);
  if (rc != 0) sh("cat %s/flops_mpi.log", tmpdir);
  assert_int_equal(rc, 0);
  assert_int_equal(ledger_lines("flops_mpi"), 3);
}

// 1.5 epochs of 8 steps.
static void test_epoch_budget(void **state) {
  (void)state;
  assert_int_equal(train("--budget 1.5epochs", "epochs"), 0);
  assert_int_equal(ledger_lines("epochs"), 12);
}

// A time budget's run of what it announced: longer than the steps it timed, and the ledger
// holds every one of them. The training seconds are checked only against gross error (a run
// that ignored the budget or stopped at its provisional length), with room for a noisy machine.
static void expect_time_budget_kept(const char *dir, double budget_s) {
  int n = announced_steps(dir);
  print_message("%s: %d steps announced, %d in the ledger, %.2f s of training\n", dir, n,
                ledger_lines(dir), summary_value(dir, "train_seconds"));
  assert_true(n >= 6);  // the first step and the five timed after it
  assert_int_equal(ledger_lines(dir), n);
  double seconds = summary_value(dir, "train_seconds");
  assert_true(seconds >= 0.25 * budget_s);
  assert_true(seconds <= 4 * budget_s);
}

// A time budget of about `steps` of this build's steps on this machine, at least 4 s: a fixed
// 4 s held only 5 steps on a machine busy enough to take 0.9 s a step, fewer than the probe's own
// 6 (the first step and five timed after it). `dir` names the pace run (8 steps).
static int paced_budget(const char *dir, int steps) {
  assert_int_equal(train("--steps 8 --set data.limit=64", dir), 0);
  const double pace = summary_value(dir, "train_seconds") / 8;
  const int budget = (int)ceil(steps * pace);
  return budget > 4 ? budget : 4;
}

// 64 images at batch 32: the provisional length (one epoch) is 2 steps, fewer than the probe
// needs; the run goes on to the count it measured, and says "?" for the count until then.
static void test_time_budget_outlasts_provisional_length(void **state) {
  (void)state;
  const int budget = paced_budget("time_pace", 20);
  char args[128];
  snprintf(args, sizeof args, "--budget %ds --set data.limit=64 --set train.log_every=1", budget);
  assert_int_equal(train(args, "time"), 0);
  expect_time_budget_kept("time", budget);
  assert_int_equal(sh("grep -q '^step 1/?' %s/time.log", tmpdir), 0);

  int rc =
      sh("timeout 300 %s train %s --budget %ds --set data.limit=64 --set parallel.replicas=2 "
         "--out %s/time2 > %s/time2.log 2>&1",
         bin, run_args, budget, tmpdir, tmpdir);
  assert_int_equal(rc, 0);
  expect_time_budget_kept("time2", budget);
  if (!mpiexec || !mpiexec[0]) return;  // test_flop_budget fails in CI without it
  rc = sh(
      "ASAN_OPTIONS=detect_leaks=0 timeout 300 %s --allow-run-as-root --oversubscribe -np 2 "
      "%s train %s --budget %ds --set data.limit=64 --set parallel.backend=mpi --out %s/time_mpi "
      "> %s/time_mpi.log 2>&1",
      mpiexec, bin, run_args, budget, tmpdir, tmpdir);
  if (rc != 0) sh("cat %s/time_mpi.log", tmpdir);
  assert_int_equal(rc, 0);
  expect_time_budget_kept("time_mpi", budget);
}

// Stopped after 2 steps, before the probe fixed the length: the checkpoint (taken at the epoch's
// end) holds no length, and the resumed run times its own steps and stops on its count.
static void test_time_budget_resumed_before_its_length(void **state) {
  (void)state;
  const int budget = paced_budget("early_pace", 20);
  char args[128];
  snprintf(args, sizeof args, "--budget %ds --set data.limit=64 --stop-at 2", budget);
  assert_int_equal(train(args, "early"), 0);
  assert_int_equal(ledger_lines("early"), 2);
  assert_int_equal(announced_steps("early"), -1);
  assert_int_equal(
      sh("%s train --resume %s/early --no-knn > %s/early.log 2>&1", bin, tmpdir, tmpdir), 0);
  expect_time_budget_kept("early", budget);
}

// Steps that slow down after the length was frozen (from step 10 each takes four times its pace
// more): the length is checked again as the run goes, so the run lands near its budget instead
// of keeping the count timed at the fast start (which would train about 3 times the budget: 50
// slow steps after 10 fast of a budget frozen near 60 steps). The budget and the delay are set
// from this build's pace on this machine (a sanitizer build steps several times slower), so the
// frozen count is near 60 steps, far past the slow-down and the first check, on any machine.
static void test_time_budget_follows_a_slower_machine(void **state) {
  (void)state;
  assert_int_equal(train("--steps 8", "pace"), 0);
  const double pace = summary_value("pace", "train_seconds") / 8;
  const int budget = (int)ceil(60 * pace) > 4 ? (int)ceil(60 * pace) : 4;
  const int delay_ms = (int)ceil(4000 * pace);
  assert_int_equal(sh("TALLY_INJECT_SLOW_STEPS=10:%d timeout 300 %s train %s --budget %ds --out "
                      "%s/slow > %s/slow.log 2>&1",
                      delay_ms, bin, run_args, budget, tmpdir, tmpdir),
                   0);
  char *frozen = run_ok("sed -n 's/^budget %ds: \\([0-9]*\\) steps (time.*/\\1/p' %s/slow.log",
                        budget, tmpdir);
  const int first = atoi(frozen);
  free(frozen);
  const int last = announced_steps("slow");
  const double seconds = summary_value("slow", "train_seconds");
  const double used = summary_value("slow", "budget_used");
  print_message(
      "%.3f s a step, %d ms more from step 10: frozen at %d steps, ended at %d, %.2f s "
      "of %d (%.3f)\n",
      pace, delay_ms, first, last, seconds, budget, used);
  assert_true(first > 20);    // the slow-down and the first check come well before the end
  assert_true(last < first);  // the count came down with the pace
  assert_int_equal(ledger_lines("slow"), last);
  assert_true(fabs(used - seconds / budget) < 1e-3);
  assert_true(seconds < 1.6 * budget);
}

int main(int argc, char **argv) {
  mpiexec = getenv("MPIEXEC");
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  if (cli_test_init("budget") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flop_budget),
      cmocka_unit_test(test_epoch_budget),
      cmocka_unit_test(test_time_budget_outlasts_provisional_length),
      cmocka_unit_test(test_time_budget_resumed_before_its_length),
      cmocka_unit_test(test_time_budget_follows_a_slower_machine),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
