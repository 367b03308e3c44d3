#include "compare/compare.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/dir_lock.h"
#include "io/json_read.h"
#include "io/regular_file.h"
#include "ledger/record.h"
#include "train/checkpoint.h"
#include "compare/compare_results.h"
#include "plan/plan.h"

// ---- signals and children ----

// The first SIGINT, SIGTERM or SIGHUP the compare got, and the child it is waiting for. Each
// signal is passed on to the child: a training then checkpoints and exits 128 + the signal (a
// Ctrl-C that reaches it from the terminal too arrives twice within microseconds, which the
// trainer counts as one), an evaluation simply ends.
static volatile sig_atomic_t stop_signal;
static volatile pid_t child_pid;

static void on_stop_signal(int sig) {
  if (!stop_signal) stop_signal = sig;
  pid_t child = child_pid;
  if (child > 0) kill(child, sig);
}

static void install_stop_handlers(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

// Runs this same executable with argv (argv[0] included, NULL-terminated), its stdout to
// stdout_fd when >= 0, and waits. Returns its exit code, or 128 + the signal that ended it. A
// child outlives no compare: if the compare dies (kill -9), the kernel sends it SIGTERM, so a
// training writes its checkpoint and the next compare resumes it.
static int run_child(char *const *argv, int stdout_fd) {
  const pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return tl_fail("cannot start %s %s: %s", argv[0], argv[1], strerror(errno)), 70;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(143);  // the compare died before prctl took effect
    if (stdout_fd >= 0 && dup2(stdout_fd, STDOUT_FILENO) < 0) _exit(70);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "tally compare: cannot run /proc/self/exe: %s\n", strerror(errno));
    _exit(70);
  }
  child_pid = pid;
  if (stop_signal) kill(pid, stop_signal);  // arrived between fork and here
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      child_pid = 0;
      return tl_fail("waiting for %s %s: %s", argv[0], argv[1], strerror(errno)), 70;
    }
  child_pid = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- the compare's folder ----

static int exists(const char *dir, const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

static int make_dir(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return tl_fail("%s: cannot create: %s", path, strerror(errno));
      *p = '/';
    }
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return tl_fail("%s: cannot create: %s", path, strerror(errno));
  return 0;
}

// What makes two invocations the same compare: the objectives with their recipes, the budgets,
// the shared options and (with_seeds) the number of seeds, one per line.
static char *settings_text(const CompareSpec *spec, bool with_seeds) {
  char *text;
  size_t n;
  FILE *f = open_memstream(&text, &n);
  if (!f) TL_DIE("out of memory");
  for (int o = 0; o < spec->n_objectives; o++)
    fprintf(f, "objective %s %s\n", spec->objectives[o],
            spec->config_paths[o] ? spec->config_paths[o] : "(its recipe)");
  for (int b = 0; b < spec->n_budgets; b++) fprintf(f, "budget %s\n", spec->budgets[b]);
  if (with_seeds) fprintf(f, "seeds %d\n", spec->n_seeds);
  for (int i = 0; i < spec->n_shared_args; i++) fprintf(f, "option %s\n", spec->shared_args[i]);
  fclose(f);
  return text;
}

// Drops the "seeds N" line from a settings text, in place.
static void drop_seeds_line(char *text) {
  char *line = strncmp(text, "seeds ", 6) == 0 ? text : strstr(text, "\nseeds ");
  if (!line) return;
  if (line != text) line++;
  char *end = strchr(line, '\n');
  if (end)
    memmove(line, end + 1, strlen(end + 1) + 1);
  else
    *line = 0;
}

// compare.settings as settings_text writes it, or -1 (error set) naming its first line that is
// not: a cut-off file or another one in its place is never taken for "other settings".
static int settings_well_formed(const char *path, const char *text) {
  static const char *const kinds[] = {"objective ", "budget ", "seeds ", "option "};
  int seen[4] = {0}, line = 1;
  for (const char *p = text; *p; line++) {
    const char *end = strchr(p, '\n');
    int kind = -1;
    for (int k = 0; k < 4 && kind < 0; k++)
      if (strncmp(p, kinds[k], strlen(kinds[k])) == 0) kind = k;
    char *after = NULL;
    if (kind == 2 && (strtol(p + 6, &after, 10) < 1 || after != end)) kind = -1;
    if (!end || kind < 0 || end == p + strlen(kinds[kind]))
      return tl_fail(
          "%s: line %d is not a compare's setting (a cut-off file, or another in its "
          "place?); move it away to start this compare anew",
          path, line);
    seen[kind]++;
    p = end + 1;
  }
  if (!seen[0] || !seen[1])
    return tl_fail("%s: names no %s; move it away to start this compare anew", path,
                   seen[0] ? "budget" : "objective");
  return 0;
}

// A folder holds the runs of one compare: the first invocation writes its settings
// (compare.settings); a later one with other settings is refused (2), since its runs would be
// mixed with the first's. Only the number of seeds may change: seed s's run is the same run in
// any compare, so more seeds add runs beside the finished ones, and compare.json covers the
// seeds asked for.
static int check_settings(const CompareSpec *spec) {
  char path[4200], *mine = settings_text(spec, true), *theirs = NULL;
  snprintf(path, sizeof path, "%s/compare.settings", spec->out_dir);
  int rc = regular_read_text(path, &theirs, NULL);
  if (rc == 0 && settings_well_formed(path, theirs) != 0) rc = -1;
  if (rc == 0 && strcmp(mine, theirs) != 0) {
    char *mine_unseeded = settings_text(spec, false);
    drop_seeds_line(theirs);
    bool same = strcmp(mine_unseeded, theirs) == 0;
    free(mine_unseeded);
    if (!same) {
      fprintf(stderr,
              "tally compare: %s holds a compare of other settings (its compare.settings); give "
              "another --out, or run it with the same options (only --seeds may change)\n",
              spec->out_dir);
      rc = 2;
    } else {
      printf("tally compare: %s now has %d seed%s; its finished runs are kept\n", spec->out_dir,
             spec->n_seeds, spec->n_seeds == 1 ? "" : "s");
      rc = 1;  // rewrite compare.settings with this seed count, below
    }
  }
  if (rc == 1) {
    AtomicFile a;
    rc = atomic_open(&a, path) != 0 || fputs(mine, a.f) < 0 || atomic_commit(&a) != 0;
    if (rc) fprintf(stderr, "tally compare: %s\n", tl_last_error());
  } else if (rc < 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    rc = 1;
  }
  free(mine);
  free(theirs);
  return rc;
}

// ---- the plan ----

typedef struct {
  PlanTotals totals;
  double run_flops;  // planned training FLOPs of one run (NaN: a time budget, fixed by timing)
  Budget budget;
  double probe_ms;  // a timed probe's step here (plan_time_steps); NaN: none
} CellPlan;

static int plan_cells(const CompareSpec *spec, CellPlan plans[][COMPARE_MAX_BUDGETS]) {
  const PlanOptions no_knn = {.no_knn = 1};
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      CellPlan *p = &plans[o][b];
      LedgerRecord rec;
      if (config_budget(spec->configs[o][b], &p->budget) != 0 ||
          plan_build(spec->configs[o][b], spec->objectives[o], PLAN_LAST_STEP, &no_knn, &rec,
                     &p->totals) != 0) {
        fprintf(stderr, "tally compare: %s at %s: %s\n", spec->objectives[o], spec->budgets[b],
                tl_last_error());
        return 1;
      }
      p->run_flops = p->totals.total_steps > 0 ? rec.flops_total : NAN;
      p->probe_ms = NAN;
    }
  return 0;
}

// A run's state from its folder's files.
typedef enum { RUN_NEW, RUN_STARTED, RUN_RESUMABLE, RUN_TRAINED, RUN_SCORED } RunState;

static RunState run_state(const char *dir) {
  if (exists(dir, "summary.json")) return exists(dir, COMPARE_EVAL_FILE) ? RUN_SCORED : RUN_TRAINED;
  if (exists(dir, CHECKPOINT_FILE)) return RUN_RESUMABLE;
  return exists(dir, "ledger.jsonl") ? RUN_STARTED : RUN_NEW;
}

// Before any run of an objective has finished to measure its pace: a few real steps of it here
// (tally plan --time), so the first estimate is a number rather than "not yet timed". An
// objective whose step cannot be probed (several replicas) is left to the measured rates.
static void probe_cells(const CompareSpec *spec, CellPlan plans[][COMPARE_MAX_BUDGETS]) {
  for (int o = 0; o < spec->n_objectives; o++) {
    int untrained = 0, timed = 0;
    for (int b = 0; b < spec->n_budgets; b++)
      for (int s = 0; s < spec->n_seeds; s++) {
        char dir[4096];
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        const int st = run_state(dir);
        untrained |= st < RUN_TRAINED && plans[o][b].budget.kind != BUDGET_SECONDS;
        timed |= st >= RUN_TRAINED;
      }
    if (!untrained || timed) continue;
    printf("timing %s: 5 steps here...\n", spec->objectives[o]);
    fflush(stdout);
    double ms;
    if (plan_time_steps(spec->configs[o][0], spec->objectives[o], 5, &ms, NULL) != 0) {
      printf("  (not timed: %s)\n", tl_last_error());
      continue;
    }
    for (int b = 0; b < spec->n_budgets; b++) plans[o][b].probe_ms = ms;
  }
}

// Training FLOPs per second measured on the finished runs of objective o (o < 0: of every
// objective), and evaluation seconds per run; NaN when none has finished.
typedef struct {
  double flops, seconds, eval_seconds;
  int evals;
} Measured;

static Measured measured(const CompareSpec *spec, int only_o) {
  Measured m = {0};
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++)
      for (int s = 0; s < spec->n_seeds; s++) {
        if (only_o >= 0 && o != only_o) continue;
        char dir[4096], path[4200], *text;
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/summary.json", dir);
        if (regular_read_text(path, &text, NULL) == 0) {
          double flops = json_flat_number(text, "flops_total");
          double seconds = json_flat_number(text, "train_seconds");
          if (isfinite(flops) && seconds > 0) m.flops += flops, m.seconds += seconds;
          free(text);
        }
        snprintf(path, sizeof path, "%s/%s", dir, COMPARE_EVAL_FILE);
        if (regular_read_text(path, &text, NULL) == 0) {
          double seconds = json_flat_number(text, "seconds");
          if (isfinite(seconds)) m.eval_seconds += seconds, m.evals++;
          free(text);
        }
      }
  return m;
}

// How long what is left will take, as well as it can be told, and from what: a time budget is
// its own length; a FLOP or epoch budget's planned FLOPs at the FLOP rate measured on this
// compare's finished runs of that objective (or of any, said so); evaluations at their measured
// mean. Unknown parts are named rather than guessed.
static void print_estimate(const CompareSpec *spec, CellPlan plans[][COMPARE_MAX_BUDGETS]) {
  double seconds = 0;
  int unknown_runs = 0, other_rate_runs = 0, runs_left = 0, evals_left = 0;
  double budget_seconds = 0, flop_seconds = 0, probe_seconds = 0;
  Measured all = measured(spec, -1);
  for (int o = 0; o < spec->n_objectives; o++) {
    Measured own = measured(spec, o);
    for (int b = 0; b < spec->n_budgets; b++)
      for (int s = 0; s < spec->n_seeds; s++) {
        char dir[4096];
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        RunState st = run_state(dir);
        evals_left += st != RUN_SCORED;
        if (st >= RUN_TRAINED) continue;
        runs_left++;
        const CellPlan *p = &plans[o][b];
        if (p->budget.kind == BUDGET_SECONDS) {
          budget_seconds += p->budget.amount;
        } else if (own.seconds > 0) {
          flop_seconds += p->run_flops / (own.flops / own.seconds);
        } else if (!isnan(p->probe_ms) && p->totals.total_steps > 0) {
          probe_seconds += p->totals.total_steps * p->probe_ms / 1e3;
        } else if (all.seconds > 0) {
          flop_seconds += p->run_flops / (all.flops / all.seconds);
          other_rate_runs++;
        } else {
          unknown_runs++;
        }
      }
  }
  seconds = budget_seconds + flop_seconds + probe_seconds;
  if (runs_left == 0 && evals_left == 0) {
    printf("every run is trained and scored already\n");
    return;
  }
  char text[32];
  printf("time left: %d run%s to train, %d to evaluate:", runs_left, runs_left == 1 ? "" : "s",
         evals_left);
  if (budget_seconds > 0) {
    ledger_format_value(UNIT_SECONDS, budget_seconds, text, sizeof text);
    printf(" %s of time budgets;", text);
  }
  if (flop_seconds > 0) {
    ledger_format_value(UNIT_SECONDS, flop_seconds, text, sizeof text);
    printf(" %s for planned FLOPs at the rate measured on finished runs%s;", text,
           other_rate_runs ? " (another objective's for some)" : "");
  }
  if (probe_seconds > 0) {
    ledger_format_value(UNIT_SECONDS, probe_seconds, text, sizeof text);
    printf(" %s for planned steps at a timed probe's pace (5 steps here, before any run);", text);
  }
  if (unknown_runs)
    printf(
        " %d run%s of FLOP or epoch budgets not yet timed (no run has finished to measure "
        "a rate);",
        unknown_runs, unknown_runs == 1 ? "" : "s");
  if (all.evals) {
    double eval_seconds = evals_left * all.eval_seconds / all.evals;
    ledger_format_value(UNIT_SECONDS, eval_seconds, text, sizeof text);
    printf(" evaluations about %s (measured);", text);
    seconds += eval_seconds;
  } else {
    printf(" evaluations not yet timed;");
  }
  ledger_format_value(UNIT_SECONDS, seconds, text, sizeof text);
  printf(" %s%s in all\n", unknown_runs || !all.evals ? "at least " : "about ", text);
}

// Prints every (objective, budget)'s plan: steps, FLOPs, planned peak memory and whether it fits
// this machine. Returns 1 when one does not fit (and no_memory_check is off).
static int print_plan(const CompareSpec *spec, CellPlan plans[][COMPARE_MAX_BUDGETS]) {
  const double machine = tl_machine_memory_bytes();
  char have[32];
  ledger_format_value(UNIT_BYTES, machine, have, sizeof have);
  printf("tally compare: %d objective%s x %d budget%s x %d seed%s = %d runs in %s\n",
         spec->n_objectives, spec->n_objectives == 1 ? "" : "s", spec->n_budgets,
         spec->n_budgets == 1 ? "" : "s", spec->n_seeds, spec->n_seeds == 1 ? "" : "s",
         spec->n_objectives * spec->n_budgets * spec->n_seeds, spec->out_dir);
  printf("%-10s %-10s %-16s %10s %14s %14s %s\n", "objective", "budget", "backbone", "steps",
         "FLOP/run", "planned peak", "fits ");
  int refused = 0;
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      const CellPlan *p = &plans[o][b];
      const int checked = strcmp(spec->configs[o][b]->parallel.backend, "local") == 0;
      const int fits = (double)p->totals.total_bytes <= machine;
      char steps[32], flops[32], peak[32];
      if (p->totals.total_steps > 0)
        snprintf(steps, sizeof steps, "%ld", p->totals.total_steps);
      else
        snprintf(steps, sizeof steps, "timed");
      ledger_format_value(UNIT_FLOPS, p->run_flops, flops, sizeof flops);
      ledger_format_value(UNIT_BYTES, (double)p->totals.total_bytes, peak, sizeof peak);
      printf("%-10s %-10s %-16s %10s %14s %14s %s\n", spec->objectives[o], spec->budgets[b],
             p->totals.backbone, steps, flops, peak,
             !checked ? "(not checked: each rank's machine)"
             : fits   ? "yes"
                      : "NO");
      refused |= checked && !fits;
    }
  printf(
      "(memory: %s on this machine; each run is planned without the kNN monitor, which the "
      "compare's trainings do not run)\n",
      have);
  if (refused && !spec->no_memory_check) {
    fprintf(stderr,
            "tally compare: a run above needs more memory than this machine has (%s); lower its "
            "train.batch_size (or the model's size), or start anyway with --no-memory-check\n",
            have);
    return 1;
  }
  return 0;
}

// ---- one run ----

// argv of a child `tally` command, built up in place.
typedef struct {
  char *argv[COMPARE_MAX_ARGS + 32];
  int n;
  char objective[96], seed[64];  // texts argv points to
} Args;

static void arg(Args *a, const char *s) {
  if (a->n < (int)(sizeof a->argv / sizeof *a->argv) - 1) a->argv[a->n++] = (char *)s;
  a->argv[a->n] = NULL;
}

// A folder another (killed) compare's training still holds, finishing its checkpoint after the
// SIGTERM its compare's death sent it: wait for it to let go, up to a minute.
static int wait_for_run_lock(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // a run locks its folder (dir_lock.h)
  if (fd < 0) return 0;
  int said = 0, rc = 0;
  for (int tries = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; tries++) {
    if (stop_signal) break;
    if (tries == 600) {
      rc = tl_fail("%s: another run is using this folder", dir);
      break;
    }
    if (!said++) printf("waiting for the run still stopping in %s\n", dir);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  close(fd);
  return rc;
}

// Trains run (o, b, s) to its end: from the start, or resumed from its checkpoint.
static int train(const CompareSpec *spec, int o, int b, int s, const char *dir, RunState st) {
  Args a = {.n = 0};
  arg(&a, "tally");
  arg(&a, "train");
  if (st == RUN_RESUMABLE) {
    arg(&a, "--resume");
    arg(&a, dir);
  } else {
    snprintf(a.objective, sizeof a.objective, "--objective=%s", spec->objectives[o]);
    arg(&a, a.objective);
    if (spec->config_paths[o]) {
      arg(&a, "--config");
      arg(&a, spec->config_paths[o]);
    }
    for (int i = 0; i < spec->n_shared_args; i++) arg(&a, spec->shared_args[i]);
    arg(&a, "--budget");
    arg(&a, spec->budgets[b]);
    snprintf(a.seed, sizeof a.seed, "train.seed=%llu",
             spec->configs[o][b]->train.seed + (unsigned long long)s);
    arg(&a, "--set");
    arg(&a, a.seed);
    arg(&a, "--out");
    arg(&a, dir);
    arg(&a, "--no-knn");  // the compare scores every run with tally eval afterwards
    // A run killed before its first checkpoint left a ledger and nothing to resume from.
    if (st == RUN_STARTED) arg(&a, "--overwrite");
  }
  if (spec->quiet) arg(&a, "--quiet");
  if (spec->no_memory_check) arg(&a, "--no-memory-check");
  if (wait_for_run_lock(dir) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 1;
  }
  return run_child(a.argv, -1);
}

// Scores a trained run with `tally eval --json`, its output kept as DIR/compare-eval.json (whole
// or not at all). The raw-pixel baselines depend on the data only: the first seed's evaluation
// computes them.
static int evaluate(const char *dir, int s) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, COMPARE_EVAL_FILE);
  AtomicFile out;
  if (atomic_open(&out, path) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 1;
  }
  Args a = {.n = 0};
  arg(&a, "tally");
  arg(&a, "eval");
  arg(&a, dir);
  arg(&a, "--json");
  if (s > 0) arg(&a, "--no-baseline");
  int rc = run_child(a.argv, fileno(out.f));
  if (rc != 0) {
    atomic_abort(&out);
    return rc;
  }
  if (atomic_commit(&out) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 1;
  }
  // What it printed must be the JSON object this compare reads.
  char *text = NULL;
  int ok = regular_read_text(path, &text, NULL) == 0 && text[0] == '{' &&
           json_flat_value(text, "rankme") != NULL;
  free(text);
  if (!ok) {
    unlink(path);
    fprintf(stderr, "tally compare: tally eval %s --json printed no result\n", dir);
    return 1;
  }
  return 0;
}

// The line that ends a compare a child stopped.
static int child_failed(const char *what, const char *dir, int rc) {
  if (rc > 128 && rc - 128 <= 64) {
    fprintf(stderr,
            "tally compare: stopped by signal %d during %s in %s; run the same command again to "
            "continue (finished runs are kept, this one %s)\n",
            rc - 128, what, dir,
            strcmp(what, "training") == 0 ? "resumes from its checkpoint" : "is evaluated again");
  } else {
    fprintf(stderr,
            "tally compare: %s in %s failed (exit %d, its message is above); compare.json is not "
            "written\n",
            what, dir, rc);
  }
  return rc;
}

// What a killed compare was writing (atomic_file.h) is no one's once this one holds the lock:
// its own files' temporaries, and its evaluations' in the runs' folders.
static void remove_stale_temporaries(const CompareSpec *spec) {
  atomic_remove_stale(spec->out_dir, COMPARE_STATE_FILES);
  static const char *const run_files[] = {COMPARE_EVAL_FILE, NULL};
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++)
      for (int s = 0; s < spec->n_seeds; s++) {
        char dir[4096];
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        atomic_remove_stale(dir, run_files);
      }
}

// A run scored by an earlier invocation: its files are read back whole and as this run's, or
// the compare stops naming the one that is not.
static int scored_run_is_whole(const char *dir) {
  char *eval, *summary;
  if (compare_read_run(dir, &eval, &summary, NULL) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 0;
  }
  free(eval);
  free(summary);
  return 1;
}

int compare_run(const CompareSpec *spec) {
  install_stop_handlers();
  if (make_dir(spec->out_dir) != 0 || dir_lock(spec->out_dir, ".compare.lock", "compare") != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 1;
  }
  remove_stale_temporaries(spec);
  int rc = check_settings(spec);
  if (rc) return rc;
  static CellPlan plans[COMPARE_MAX_OBJECTIVES][COMPARE_MAX_BUDGETS];
  if (plan_cells(spec, plans) != 0 || print_plan(spec, plans) != 0) return 1;
  probe_cells(spec, plans);
  print_estimate(spec, plans);

  const int total = spec->n_objectives * spec->n_budgets * spec->n_seeds;
  int done = 0;
  // Budget by budget, and within one every objective's seed 0 first: an interrupted compare
  // has a first answer for every objective as early as possible.
  for (int b = 0; b < spec->n_budgets; b++)
    for (int s = 0; s < spec->n_seeds; s++)
      for (int o = 0; o < spec->n_objectives; o++) {
        char dir[4096];
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        RunState st = run_state(dir);
        done++;
        if (stop_signal) return child_failed("the compare", spec->out_dir, 128 + stop_signal);
        if (st == RUN_SCORED) {
          if (!scored_run_is_whole(dir)) return 1;
          printf("[%d/%d] %s: trained and scored already\n", done, total, dir);
          continue;
        }
        if (st < RUN_TRAINED) {
          printf("[%d/%d] %s %s seed %d: %s %s\n", done, total, spec->objectives[o],
                 spec->budgets[b], s,
                 st == RUN_RESUMABLE ? "resuming the training in" : "training in", dir);
          // An evaluation of an earlier run in this folder is not this run's.
          char path[4200];
          snprintf(path, sizeof path, "%s/%s", dir, COMPARE_EVAL_FILE);
          if (unlink(path) != 0 && errno != ENOENT) {
            fprintf(stderr, "tally compare: %s: cannot remove: %s\n", path, strerror(errno));
            return 1;
          }
          rc = train(spec, o, b, s, dir, st);
          if (rc == 0 && stop_signal) rc = 128 + stop_signal;
          if (rc == 0 && !exists(dir, "summary.json")) {
            fprintf(stderr, "tally compare: %s: the training ended without a summary.json\n", dir);
            rc = 1;
          }
          if (rc) return child_failed("training", dir, rc);
        }
        printf("[%d/%d] %s: evaluating\n", done, total, dir);
        rc = evaluate(dir, s);
        if (rc == 0 && stop_signal) rc = 128 + stop_signal;
        if (rc) return child_failed("evaluation", dir, rc);
        if (done < total) print_estimate(spec, plans);
      }

  static CompareCell cells[COMPARE_MAX_OBJECTIVES * COMPARE_MAX_BUDGETS];
  char json_path[4200], html_path[4200];
  snprintf(json_path, sizeof json_path, "%s/compare.json", spec->out_dir);
  snprintf(html_path, sizeof html_path, "%s/compare.html", spec->out_dir);
  if (compare_collect(spec, cells) != 0 || compare_write_json(spec, cells, json_path) != 0 ||
      compare_write_html(spec, cells, html_path) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 1;
  }
  printf("\n");
  compare_print_table(stdout, spec, cells);
  printf("\nverdict:\n");
  for (int b = 0; b < spec->n_budgets; b++) {
    char text[COMPARE_VERDICT_MAX];
    compare_verdict(spec, cells, b, text, sizeof text);
    printf("  %s\n", text);
  }
  printf("written: %s, %s\n", json_path, html_path);
  return 0;
}
