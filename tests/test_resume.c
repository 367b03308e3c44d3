// Runs that survive: a run stopped part way (--stop-at, SIGINT, SIGTERM, kill -9, a kill in the
// middle of a checkpoint write) and then resumed ends bit for bit where the same run done in one
// go ends — every tensor of the final checkpoint (parameters, BatchNorm statistics, optimizer
// state, moco's key encoder and its wrapped queue) and every ledger loss — for each objective,
// with one replica, two local replicas and two MPI ranks.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "objective_test_util.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *mpiexec;

// Small runs crossing an epoch boundary (8 steps of 32 per epoch); moco's queue of 48 keys wraps
// in the second step, so a resumed queue must hold the right keys with the right step tags, and
// at the stop (step 4: 128 keys pushed) its next slot is 32, not the 0 a restarted queue has.
static const char *objective_args(const char *objective) {
  if (!strcmp(objective, "moco"))
    return "--objective=moco --set moco.queue_size=48 --set train.batch_size=32";
  if (!strcmp(objective, "mae"))
    return "--objective=mae --set train.batch_size=32 --set optim.warmup_steps=3";
  return "--objective=inbatch --set train.batch_size=32";
}

static const char *common = "--set data.limit=256 --no-knn --quiet --set parallel.checksum_every=1";

// How a backend is launched: a prefix before the binary and settings after it.
typedef struct {
  const char *name, *launch, *settings;
} Backend;

static Backend backends[3];

static void init_backends(void) {
  static char mpi_launch[512];
  snprintf(mpi_launch, sizeof mpi_launch,
           "ASAN_OPTIONS=detect_leaks=0 timeout 300 %s --allow-run-as-root --oversubscribe -np 2",
           mpiexec && mpiexec[0] ? mpiexec : "mpiexec");
  backends[0] = (Backend){"one", "", ""};
  backends[1] = (Backend){"local2", "", "--set parallel.replicas=2"};
  backends[2] = (Backend){"mpi2", mpi_launch, "--set parallel.backend=mpi"};
}

static int train(const Backend *b, const char *objective, const char *extra, const char *dir) {
  int rc = sh("%s %s train %s %s %s %s --out %s/%s > %s/%s.log 2>&1", b->launch, bin,
              objective_args(objective), common, b->settings, extra, tmpdir, dir, tmpdir, dir);
  if (rc != 0) sh("cat %s/%s.log", tmpdir, dir);
  return rc;
}

static int resume(const Backend *b, const char *extra, const char *dir) {
  int rc = sh("%s %s train --resume %s/%s --no-knn --quiet %s >> %s/%s.log 2>&1", b->launch, bin,
              tmpdir, dir, extra, tmpdir, dir);
  if (rc != 0) sh("cat %s/%s.log", tmpdir, dir);
  return rc;
}

// The ledger's losses as written (text), one per step 0..steps-1 in order.
static void read_losses(const char *dir, int steps, char losses[][40]) {
  char path[512], line[16384];
  snprintf(path, sizeof path, "%s/%s/ledger.jsonl", tmpdir, dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    assert_true(n < steps);
    char *s = strstr(line, "\"step\":"), *l = strstr(line, "\"loss\":");
    assert_non_null(s);
    assert_non_null(l);
    assert_int_equal(strtol(s + 7, NULL, 10), n);
    snprintf(losses[n], 40, "%.*s", (int)strcspn(l + 7, ",}"), l + 7);
    n++;
  }
  fclose(f);
  assert_int_equal(n, steps);
}

static void expect_same_ledger(const char *a, const char *b, int steps) {
  char(*la)[40] = calloc((size_t)steps, 40), (*lb)[40] = calloc((size_t)steps, 40);
  assert_non_null(la);
  assert_non_null(lb);
  read_losses(a, steps, la);
  read_losses(b, steps, lb);
  for (int i = 0; i < steps; i++)
    if (strcmp(la[i], lb[i]) != 0)
      fail_msg("step %d: loss %s in %s, %s in %s", i, la[i], a, lb[i], b);
  free(la);
  free(lb);
}

// --steps 10 straight equals --steps 10 --stop-at 4 then --resume, for one objective on every
// backend.
static void stop_and_resume(const char *objective) {
  for (int k = 0; k < 3; k++) {
    const Backend *b = &backends[k];
    char straight[64], split[64];
    snprintf(straight, sizeof straight, "%s-%s-straight", objective, b->name);
    snprintf(split, sizeof split, "%s-%s-split", objective, b->name);
    assert_int_equal(train(b, objective, "--steps 10", straight), 0);
    assert_int_equal(train(b, objective, "--steps 10 --stop-at 4", split), 0);
    assert_int_equal(sh("grep -q 'continue with: tally train --resume' %s/%s.log", tmpdir, split),
                     0);
    assert_int_not_equal(sh("test -e %s/%s/summary.json", tmpdir, split), 0);
    assert_int_equal(resume(b, "", split), 0);
    assert_int_equal(sh("test -e %s/%s/summary.json", tmpdir, split), 0);
    expect_same_checkpoint(straight, split, NULL);
    expect_same_ledger(straight, split, 10);
  }
}

static void test_resume_inbatch(void **state) {
  (void)state;
  stop_and_resume("inbatch");
}

static void test_resume_moco(void **state) {
  (void)state;
  stop_and_resume("moco");
}

static void test_resume_mae(void **state) {
  (void)state;
  stop_and_resume("mae");
}

// Starts a run in the background and returns its pid once it has written `records` records. Its
// steps take 200 ms longer each (TALLY_INJECT_SLOW_STEPS: a sleep, nothing computed differently),
// so the signal the test sends always arrives before the run could have finished.
static pid_t start_and_wait(const char *extra, const char *dir, int records) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "TALLY_INJECT_SLOW_STEPS=0:200 exec %s train %s %s %s --out %s/%s > %s/%s.log 2>&1",
             bin, objective_args("mae"), common, extra, tmpdir, dir, tmpdir, dir);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 6000 && ledger_lines(dir) < records; i++) usleep(10000);
  return pid;
}

static int wait_exit_code(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// SIGINT and SIGTERM finish the step under way, write the checkpoint, say how to resume and
// exit 130 / 143; the run folder has no summary, `tally report` reads it, and --resume ends
// where the uninterrupted run ends.
static void interrupt_with(int sig, int expected_code, const char *dir) {
  const char *steps = "--steps 120";
  if (ledger_lines("signal-straight") != 120)
    assert_int_equal(train(&backends[0], "mae", steps, "signal-straight"), 0);
  pid_t pid = start_and_wait(steps, dir, 3);
  kill(pid, sig);
  assert_int_equal(wait_exit_code(pid), expected_code);
  assert_int_equal(sh("grep -q 'interrupted at step' %s/%s.log", tmpdir, dir), 0);
  assert_int_equal(
      sh("grep -q 'continue with: tally train --resume %s/%s' %s/%s.log", tmpdir, dir, tmpdir, dir),
      0);
  assert_int_not_equal(sh("test -e %s/%s/summary.json", tmpdir, dir), 0);
  // The checkpoint holds exactly the steps the ledger records.
  char path[512];
  snprintf(path, sizeof path, "%s/%s/checkpoint.safetensors", tmpdir, dir);
  size_t count;
  long held;
  free(checkpoint_params(path, &count, &held));
  assert_int_equal(held, ledger_lines(dir));
  assert_int_equal(sh("%s report %s/%s > /dev/null 2>&1", bin, tmpdir, dir), 0);
  assert_int_equal(resume(&backends[0], "", dir), 0);
  expect_same_checkpoint("signal-straight", dir, NULL);
  expect_same_ledger("signal-straight", dir, 120);
}

static void test_sigint(void **state) {
  (void)state;
  interrupt_with(SIGINT, 130, "sigint");
}

static void test_sigterm(void **state) {
  (void)state;
  interrupt_with(SIGTERM, 143, "sigterm");
}

// kill -9 at any moment loses only the steps since the last checkpoint: killed after a few
// records, after many, and in the middle of writing a checkpoint, each run resumes to the same
// end as the run that was never killed.
static void test_kill_9(void **state) {
  (void)state;
  const char *args = "--steps 120 --set train.checkpoint_every=7";
  assert_int_equal(train(&backends[0], "mae", args, "kill-straight"), 0);
  const int after[] = {9, 40};
  for (int i = 0; i < 2; i++) {
    char dir[64];
    snprintf(dir, sizeof dir, "kill-%d", after[i]);
    pid_t pid = start_and_wait(args, dir, after[i]);
    kill(pid, SIGKILL);
    assert_int_equal(wait_exit_code(pid), 128 + SIGKILL);
    assert_int_equal(resume(&backends[0], "", dir), 0);
    expect_same_checkpoint("kill-straight", dir, NULL);
    expect_same_ledger("kill-straight", dir, 120);
  }
  // Killed while the step-14 checkpoint is half written: the one before it (the epoch's end at
  // step 8, after the periodic one at step 7) is what resumes.
  assert_int_equal(sh("TALLY_INJECT_KILL_IN_CHECKPOINT=14 %s train %s %s %s --out %s/kill-ckpt "
                      "> %s/kill-ckpt.log 2>&1",
                      bin, objective_args("mae"), common, args, tmpdir, tmpdir),
                   128 + SIGKILL);
  char path[512];
  snprintf(path, sizeof path, "%s/kill-ckpt/checkpoint.safetensors", tmpdir);
  size_t count;
  long held;
  free(checkpoint_params(path, &count, &held));
  assert_int_equal(held, 8);
  assert_int_equal(resume(&backends[0], "", "kill-ckpt"), 0);
  expect_same_checkpoint("kill-straight", "kill-ckpt", NULL);
}

// A resumed run keeps what defines it: a --set that would change the model, the objective, the
// data or the optimizer is refused (exit 2) naming it; --steps may lengthen the run.
static void test_resume_rules(void **state) {
  (void)state;
  const Backend *one = &backends[0];
  assert_int_equal(train(one, "inbatch", "--steps 3", "rules"), 0);
  assert_int_equal(resume(one, "--set optim.lr=0.5", "rules"), 2);
  assert_int_equal(sh("grep -q 'optim.lr=0.5' %s/rules.log", tmpdir), 0);
  assert_int_equal(resume(one, "--set model.file=models/vit-tiny.ini", "rules"), 2);
  assert_int_equal(resume(one, "--objective=moco", "rules"), 2);
  assert_int_equal(resume(one, "--config configs/inbatch.ini", "rules"), 2);
  // A second run in the same folder without --resume or --overwrite is refused.
  assert_int_equal(train(one, "inbatch", "--steps 3", "rules"), 1);
  assert_int_equal(sh("grep -q 'holds a run already' %s/rules.log", tmpdir), 0);
  // Lengthened: 3 more steps after the 3 done, the ledger has 6.
  assert_int_equal(resume(one, "--steps 6 --set train.log_every=1", "rules"), 0);
  assert_int_equal(ledger_lines("rules"), 6);
  // A corrupt checkpoint (bytes changed among the tensors) is refused with one line naming it.
  assert_int_equal(sh("f=%s/rules/checkpoint.safetensors; printf 'garbage' | dd of=$f bs=1 "
                      "seek=$(($(stat -c %%s $f) - 100)) conv=notrunc 2>/dev/null",
                      tmpdir),
                   0);
  assert_int_equal(resume(one, "--steps 8", "rules"), 1);
  assert_int_equal(sh("grep -q 'checkpoint.safetensors.*corrupt' %s/rules.log", tmpdir), 0);
}

int main(void) {
  mpiexec = getenv("MPIEXEC");
  if (cli_test_init("resume") != 0) return 1;
  init_backends();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_inbatch), cmocka_unit_test(test_resume_moco),
      cmocka_unit_test(test_resume_mae),     cmocka_unit_test(test_sigint),
      cmocka_unit_test(test_sigterm),        cmocka_unit_test(test_kill_9),
      cmocka_unit_test(test_resume_rules),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
