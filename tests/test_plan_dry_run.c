// `tally plan` is a dry run in memory as well as in compute: its sizes come from arithmetic, so a
// configuration far larger than the machine is planned in a few tens of megabytes and under a
// second, and what cannot run is said as a plan ("needs X") or as a clear error, never as an
// out-of-memory kill. Each case runs the binary as a user does and reads its peak resident size
// from the kernel (wait4), next to sizes computed here by hand.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli_test_util.h"
#include "core/alloc.h"

// What a plan may hold resident whatever it plans: the binary, oneDNN, the primitive
// descriptors and the datasets' headers. Before plans were arithmetic, a 4M-key queue took 4 GB.
enum { PLAN_RSS_LIMIT_KB = 200 * 1024 };

typedef struct {
  int exit_code;  // -1: killed by a signal
  long max_rss_kb;
  char out[1 << 16], err[4096];
} PlanRun;

static void read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
}

// Runs `tally plan ARGS...` (NULL-terminated) with stdout and stderr captured.
static void run_plan(PlanRun *r, ...) {
  const char *argv[32] = {bin, "plan"};
  int argc = 2;
  va_list ap;
  va_start(ap, r);
  for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 31;) argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  char out_path[300], err_path[300];
  snprintf(out_path, sizeof out_path, "%s/out", tmpdir);
  snprintf(err_path, sizeof err_path, "%s/err", tmpdir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) _exit(127);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  int status;
  struct rusage ru;
  assert_int_equal(wait4(pid, &status, 0, &ru), pid);
  r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r->max_rss_kb = ru.ru_maxrss;
  read_file(out_path, r->out, sizeof r->out);
  read_file(err_path, r->err, sizeof r->err);
  printf("plan %s ...: exit %d, peak RSS %ld MiB\n", argv[2], r->exit_code, r->max_rss_kb / 1024);
}

static double json_number(const char *json, const char *key) {
  char pattern[96];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *at = strstr(json, pattern);
  if (!at) fail_msg("no %s in %s", key, json);
  return strtod(at + strlen(pattern), NULL);
}

static void test_huge_queue_is_planned_not_allocated(void **state) {
  (void)state;
  PlanRun *r = calloc(1, sizeof *r);
  // 4M keys of 128 floats: 2 GiB of queue and 4 GiB of logits at batch 256.
  run_plan(r, "--objective=moco", "--set", "moco.queue_size=4194304", "--set",
           "model.head_out_dim=128", "--set", "moco.symmetric=0", "--no-knn", "--json", NULL);
  assert_int_equal(r->exit_code, 0);
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  // Each key: 128 floats (512 bytes) and the 8-byte step it was enqueued at: 2^22 x 520 bytes.
  assert_true(json_number(r->out, "queue_bytes") == 2181038080.0);
  // The queue and the step's logits against it: 256 queries x 4M keys.
  assert_true(json_number(r->out, "planned_total_bytes") >
              json_number(r->out, "queue_bytes") + 256.0 * 4194304 * sizeof(float));
  free(r);
}

static void test_batch_beyond_memory_is_a_plan(void **state) {
  (void)state;
  PlanRun *r = calloc(1, sizeof *r);
  // NT-Xent over 2 x 16384 views: a 32768 x 32768 similarity matrix and its gradient (8 GiB).
  run_plan(r, "--objective=inbatch", "--set", "train.batch_size=16384", "--no-knn", NULL);
  assert_int_equal(r->exit_code, 0);
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  const double machine = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  const double logits = 2.0 * 32768.0 * 32768.0 * sizeof(float);
  if (logits > machine) {
    if (!strstr(r->out, "fits in memory") || !strstr(r->out, "no ("))
      fail_msg("a plan larger than this machine's memory does not say so:\n%s", r->out);
  } else {
    assert_non_null(strstr(r->out, "fits in memory"));
  }
  // Every replica's thread plans in reservations, not only the first.
  run_plan(r, "--objective=inbatch", "--set", "train.batch_size=16384", "--set",
           "parallel.replicas=4", "--no-knn", NULL);
  assert_int_equal(r->exit_code, 0);
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  free(r);
}

static void test_memory_budget_search_stays_small(void **state) {
  (void)state;
  PlanRun *r = calloc(1, sizeof *r);
  run_plan(r, "--objective=moco", "--memory-budget", "100TiB", "--no-knn", NULL);
  assert_int_equal(r->exit_code, 0);
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  // The queue's own range caps the search.
  assert_non_null(strstr(r->out, "moco.queue_size within 100 TiB is 16777216"));
  run_plan(r, "--objective=inbatch", "--memory-budget", "100TiB", "--no-knn", NULL);
  assert_int_equal(r->exit_code, 0);
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  free(r);
}

static void test_step_too_large_to_index_is_refused(void **state) {
  (void)state;
  char model[300];
  snprintf(model, sizeof model, "%s/vit-patch1.ini", tmpdir);
  FILE *f = fopen(model, "w");
  assert_non_null(f);
  fputs(
      "[backbone]\ntype = vit\npatch_size = 1\npad_to = 4096\ndim = 128\ndepth = 4\n"
      "heads = 4\nmlp_ratio = 4\npool = cls\n",
      f);
  fclose(f);
  char set_model[320];
  snprintf(set_model, sizeof set_model, "model.file=%s", model);
  PlanRun *r = calloc(1, sizeof *r);
  // 512 views x 4096^2 tokens overflow a tensor's row index: a user error naming the way out.
  run_plan(r, "--objective=inbatch", "--set", set_model, "--no-knn", NULL);
  assert_int_equal(r->exit_code, 1);
  assert_non_null(strstr(r->err, "patch_size"));
  // One image fits the index, but its attention (16M x 16M scores) does not fit any address space.
  run_plan(r, "--objective=mae", "--set", set_model, "--set", "train.batch_size=1", "--no-knn",
           NULL);
  assert_int_equal(r->exit_code, 1);
  assert_non_null(strstr(r->err, "more address space than this process has"));
  assert_true(r->max_rss_kb < PLAN_RSS_LIMIT_KB);
  free(r);
}

// `tally train` checks its own plan before it starts: a run larger than the machine is refused
// with the sizes and the way out, and leaves no run folder behind.
static void test_train_refuses_a_run_that_cannot_fit(void **state) {
  (void)state;
  PlanRun *r = calloc(1, sizeof *r);
  run_plan(r, "--objective=inbatch", "--set", "train.batch_size=60000", "--no-knn", "--json", NULL);
  assert_int_equal(r->exit_code, 0);
  const double planned = json_number(r->out, "planned_total_bytes");
  // Independent floor: the 120000 x 120000 similarity matrix and its gradient alone.
  assert_true(planned > 2.0 * 120000.0 * 120000.0 * sizeof(float));
  if (planned <= tl_machine_memory_bytes()) {
    printf("this machine holds %.0f GiB: a refused run cannot be shown here\n", planned / 0x1p30);
    free(r);
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s train --objective=inbatch --set train.batch_size=60000 --no-knn --out %s/big "
           "2>%s/err",
           bin, tmpdir, tmpdir);
  assert_int_equal(sh("%s", cmd), 1);
  char path[300];
  snprintf(path, sizeof path, "%s/err", tmpdir);
  read_file(path, r->err, sizeof r->err);
  assert_non_null(strstr(r->err, "--no-memory-check"));
  assert_int_equal(sh("test -e %s/big", tmpdir), 1);
  free(r);
}

// The safeguard behind all of the above: a planned block is address space only, so code that
// would touch it during a plan stops at once instead of committing it silently.
static void test_planned_blocks_fault_when_touched(void **state) {
  (void)state;
  tl_alloc_set_untouched(1);
  float *big = tl_alloc((size_t)1 << 30, MEM_ACT, COMP_ENCODER);
  tl_alloc_set_untouched(0);
  assert_int_equal(tl_mem_live(MEM_ACT), (size_t)1 << 30);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    ((volatile float *)big)[12345] = 1.0f;
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
  tl_free(big);
  assert_int_equal(tl_mem_live(MEM_ACT), 0);
  // Outside a plan the same call gives real, zeroed memory.
  float *real = tl_alloc(1 << 20, MEM_ACT, COMP_ENCODER);
  real[12345] = 2.0f;
  assert_true(real[0] == 0.0f && real[12345] == 2.0f);
  tl_free(real);
}

int main(void) {
  if (cli_test_init("plan-dry-run") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_huge_queue_is_planned_not_allocated),
      cmocka_unit_test(test_batch_beyond_memory_is_a_plan),
      cmocka_unit_test(test_memory_budget_search_stays_small),
      cmocka_unit_test(test_step_too_large_to_index_is_refused),
      cmocka_unit_test(test_train_refuses_a_run_that_cannot_fit),
      cmocka_unit_test(test_planned_blocks_fault_when_touched),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
