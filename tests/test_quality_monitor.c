// The label-free quality during training, through the binary as a user runs it: every evaluation
// of a run, labeled or not, records rankme and embedding_std in eval.jsonl, measured on a sample
// of the training images fixed by the seed; summary.json has the last of them; an encoder whose
// embeddings collapse gets one warning naming the step, a healthy one none.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_test_util.h"
#include "eval/quality.h"
#include "objective_test_util.h"

// 64 Fashion-MNIST images in batches of 16: 4 steps an epoch, evaluated at each epoch's end.
static const char *small =
    "--set data.limit=64 --set data.test_limit=32 --set train.batch_size=16 "
    "--set eval.batch_size=32 --set eval.knn_every_epochs=1 --set eval.knn_k=4";

// resnet-small's 128 features: embedding_std_reference is 1/sqrt(128).
enum { FEATURES = 128 };

static char *read_text(const char *dir, const char *file) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("%s: cannot open", path);
  char *text = calloc(1, 1 << 16);
  size_t n = fread(text, 1, (1 << 16) - 1, f);
  text[n] = 0;
  fclose(f);
  return text;
}

// eval.jsonl's lines (at most 8) into lines[], their count returned.
static int eval_lines(const char *dir, char lines[8][1024]) {
  char *text = read_text(dir, "eval.jsonl");
  int n = 0;
  for (char *line = strtok(text, "\n"); line && n < 8; line = strtok(NULL, "\n"))
    snprintf(lines[n++], sizeof lines[0], "%s", line);
  free(text);
  return n;
}

// An encoder record's quality: finite, rankme within [1, min(n, d)], embedding_std in (0, 1],
// the reference 1/sqrt(d), and the record says whether it collapsed.
static void expect_quality(const char *line, int n_images, int collapsed) {
  double rankme = NAN, std = NAN, reference = NAN;
  assert_int_equal(json_get(line, "rankme", &rankme), 1);
  assert_int_equal(json_get(line, "embedding_std", &std), 1);
  assert_int_equal(json_get(line, "embedding_std_reference", &reference), 1);
  assert_true(rankme >= 1 && rankme <= (n_images < FEATURES ? n_images : FEATURES));
  assert_true(std > 0 && std <= 1);
  assert_float_equal(reference, 1 / sqrt(FEATURES), 1e-6);
  assert_non_null(strstr(line, collapsed ? "\"collapsed\":true" : "\"collapsed\":false"));
}

// Unlabeled: no test set, no kNN (null), no raw-pixel baseline; an evaluation before step 0, at
// the first epoch's end and at the last step, each with the quality, the summary the last's.
static void test_unlabeled_run(void **state) {
  (void)state;
  char dir[400];
  snprintf(dir, sizeof dir, "%s/unlabeled", tmpdir);
  char *out = run_ok(
      "%s train --objective=inbatch --steps 6 %s --set data.labels=none "
      "--set data.test= --knn-at-start --out %s 2>&1",
      bin, small, dir);
  assert_non_null(strstr(out, "label-free quality after step 4:"));
  assert_non_null(strstr(out, "label-free quality after step 6:"));
  assert_null(strstr(out, "collapsed"));
  free(out);
  char lines[8][1024];
  assert_int_equal(eval_lines(dir, lines), 3);
  static const int steps[3] = {0, 4, 6};
  double v = NAN;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(json_get(lines[i], "step", &v), 1);
    assert_int_equal((int)v, steps[i]);
    assert_non_null(strstr(lines[i], "\"what\":\"encoder\""));
    assert_int_equal(json_get(lines[i], "knn_top1", &v), 0);  // null
    expect_quality(lines[i], 64, 0);
  }
  double last, summarized;
  char *summary = read_text(dir, "summary.json");
  assert_int_equal(json_get(lines[2], "rankme", &last), 1);
  assert_int_equal(json_get(summary, "rankme", &summarized), 1);
  assert_float_equal(summarized, last, 1e-6);
  assert_int_equal(json_get(summary, "embedding_std", &summarized), 1);
  assert_true(summarized > 0);
  assert_non_null(strstr(summary, "\"collapsed\": false"));
  assert_non_null(strstr(summary, "\"knn_top1\": null"));
  free(summary);

  // The sample is the seed's: a run of another length measures the untrained encoder (the same
  // weights) on the same images, to the last digit.
  snprintf(dir, sizeof dir, "%s/unlabeled-short", tmpdir);
  free(
      run_ok("%s train --objective=inbatch --steps 2 %s --set data.labels=none "
             "--set data.test= --knn-at-start --quiet --out %s 2>&1",
             bin, small, dir));
  char again[8][1024];
  assert_int_equal(eval_lines(dir, again), 2);
  const char *a = strstr(lines[0], "\"rankme\""), *b = strstr(again[0], "\"rankme\"");
  const char *a_end = strstr(lines[0], "\"seconds\""), *b_end = strstr(again[0], "\"seconds\"");
  assert_true(a && b && a_end && b_end && a_end - a == b_end - b);
  assert_memory_equal(a, b, (size_t)(a_end - a));
}

// Labeled: kNN and the quality in the same record; the raw-pixel baseline has no quality.
static void test_labeled_run(void **state) {
  (void)state;
  char dir[400];
  snprintf(dir, sizeof dir, "%s/labeled", tmpdir);
  free(run_ok("%s train --objective=inbatch --steps 4 %s --quiet --out %s 2>&1", bin, small, dir));
  char lines[8][1024];
  assert_int_equal(eval_lines(dir, lines), 2);
  double v = NAN;
  assert_non_null(strstr(lines[0], "\"what\":\"raw_pixels\""));
  assert_int_equal(json_get(lines[0], "rankme", &v), -1);
  assert_non_null(strstr(lines[1], "\"what\":\"encoder\""));
  assert_int_equal(json_get(lines[1], "knn_top1", &v), 1);
  expect_quality(lines[1], 64, 0);
}

// An encoder whose every image has one embedding (its backbone zeroed after the last step's
// update, TALLY_INJECT_COLLAPSE_AT_STEP) is collapsed at the run's last evaluation: one warning
// naming that step, the record and the summary say so, and the evaluation before it is healthy;
// the same run without the fault warns nowhere.
static void test_collapse_warning(void **state) {
  (void)state;
  char dir[400], err[500];
  snprintf(err, sizeof err, "%s/collapse.err", tmpdir);
  for (int collapse = 0; collapse < 2; collapse++) {
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, collapse ? "collapsed" : "healthy");
    free(
        run_ok("%s %s train --objective=inbatch --steps 6 %s --set data.labels=none --quiet "
               "--out %s 2> %s",
               collapse ? "TALLY_INJECT_COLLAPSE_AT_STEP=5" : "", bin, small, dir, err));
    char *warnings = read_text(tmpdir, "collapse.err");
    char lines[8][1024];
    assert_int_equal(eval_lines(dir, lines), 2);  // after steps 4 and 6
    assert_non_null(strstr(lines[0], "\"collapsed\":false"));
    char *summary = read_text(dir, "summary.json");
    if (collapse) {
      assert_non_null(strstr(warnings, "warning: step 6: the embeddings have collapsed"));
      assert_null(strstr(strstr(warnings, "collapsed") + 1, "collapsed"));  // one line
      assert_non_null(strstr(lines[1], "\"collapsed\":true"));
      double rankme, std;
      assert_int_equal(json_get(lines[1], "rankme", &rankme), 1);
      assert_int_equal(json_get(lines[1], "embedding_std", &std), 1);
      assert_float_equal(rankme, 1, 1e-3);
      assert_true(std < QUALITY_COLLAPSED_FRACTION / sqrt(FEATURES));
      assert_non_null(strstr(summary, "\"collapsed\": true"));
    } else {
      assert_null(strstr(warnings, "collapsed"));
      assert_non_null(strstr(lines[1], "\"collapsed\":false"));
      assert_non_null(strstr(summary, "\"collapsed\": false"));
    }
    free(summary);
    free(warnings);
  }
}

// The steps of eval.jsonl's encoder records, in order, into steps[] (at most 8); their count.
static int encoder_steps(const char *dir, int steps[8]) {
  char lines[8][1024];
  int n_lines = eval_lines(dir, lines), n = 0;
  double v;
  for (int i = 0; i < n_lines; i++)
    if (strstr(lines[i], "\"what\":\"encoder\"") && json_get(lines[i], "step", &v) == 1)
      steps[n++] = (int)v;
  return n;
}

// ledger.jsonl's losses as written, one string per line (at most 16), into losses; their count.
static int ledger_losses(const char *dir, char losses[16][32]) {
  char *text = read_text(dir, "ledger.jsonl");
  int n = 0;
  for (char *line = strtok(text, "\n"); line && n < 16; line = strtok(NULL, "\n")) {
    const char *l = strstr(line, "\"loss\":");
    assert_non_null(l);
    snprintf(losses[n++], 32, "%.*s", (int)strcspn(l + 7, ",}"), l + 7);
  }
  free(text);
  return n;
}

// eval.every_steps = 3 over 7 steps of 4 an epoch: evaluations after steps 3 and 6 and at the
// run's end, none at the epoch's end (4). The monitor leaves training alone: the losses are a
// run's without it, to the last digit, and a run stopped after step 5 and resumed evaluates at
// the same steps with the same losses. Two replicas (threads, and MPI ranks when MPIEXEC is set)
// evaluate at the same steps too. knn_every_epochs beside it is refused.
static void test_every_steps(void **state) {
  (void)state;
  static const int expected[3] = {3, 6, 7};
  const char *every = "--set eval.every_steps=3";
  char dir[400], plain[400];
  snprintf(dir, sizeof dir, "%s/every3", tmpdir);
  snprintf(plain, sizeof plain, "%s/every3-no-monitor", tmpdir);
  free(run_ok("%s train --objective=inbatch --steps 7 %s %s --quiet --out %s 2>&1", bin, small,
              every, dir));
  free(run_ok("%s train --objective=inbatch --steps 7 %s --no-knn --quiet --out %s 2>&1", bin,
              small, plain));
  int steps[8];
  assert_int_equal(encoder_steps(dir, steps), 3);
  assert_memory_equal(steps, expected, sizeof expected);
  char with[16][32] = {{0}}, without[16][32] = {{0}};
  assert_int_equal(ledger_losses(dir, with), 7);
  assert_int_equal(ledger_losses(plain, without), 7);
  assert_memory_equal(with, without, sizeof with[0] * 7);

  char resumed[400];
  snprintf(resumed, sizeof resumed, "%s/every3-resumed", tmpdir);
  free(run_ok("%s train --objective=inbatch --steps 7 %s %s --stop-at 5 --quiet --out %s 2>&1", bin,
              small, every, resumed));
  free(run_ok("%s train --resume %s --quiet 2>&1", bin, resumed));
  assert_int_equal(encoder_steps(resumed, steps), 3);
  assert_memory_equal(steps, expected, sizeof expected);
  char again[16][32] = {{0}};
  assert_int_equal(ledger_losses(resumed, again), 7);
  assert_memory_equal(again, with, sizeof with[0] * 7);

  char two[400];
  snprintf(two, sizeof two, "%s/every3-two-replicas", tmpdir);
  free(
      run_ok("%s train --objective=inbatch --steps 7 %s %s --set parallel.replicas=2 --quiet "
             "--out %s 2>&1",
             bin, small, every, two));
  assert_int_equal(encoder_steps(two, steps), 3);
  assert_memory_equal(steps, expected, sizeof expected);
  const char *mpiexec = getenv("MPIEXEC");
  if (mpiexec && mpiexec[0]) {
    snprintf(two, sizeof two, "%s/every3-two-ranks", tmpdir);
    free(
        run_ok("ASAN_OPTIONS=detect_leaks=0 timeout 300 %s --allow-run-as-root --oversubscribe "
               "-np 2 %s train --objective=inbatch --steps 7 %s %s --set parallel.backend=mpi "
               "--quiet --out %s 2>&1",
               mpiexec, bin, small, every, two));
    assert_int_equal(encoder_steps(two, steps), 3);
    assert_memory_equal(steps, expected, sizeof expected);
  } else if (getenv("CI")) {
    fail_msg("MPIEXEC is not set: the two-rank run cannot start");
  }

  char *out = NULL;
  assert_int_equal(sh("%s train --objective=inbatch --steps 7 %s %s --set eval.knn_every_epochs=2 "
                      "--quiet --out %s/both > %s/both.err 2>&1",
                      bin, small, every, tmpdir, tmpdir),
                   1);
  out = read_text(tmpdir, "both.err");
  assert_non_null(strstr(out, "every_steps = 3 and knn_every_epochs = 2 are two schedules"));
  free(out);
}

int main(void) {
  if (cli_test_init("quality-monitor") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unlabeled_run),
      cmocka_unit_test(test_labeled_run),
      cmocka_unit_test(test_collapse_warning),
      cmocka_unit_test(test_every_steps),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
