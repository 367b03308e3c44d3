// `tally compare`: trains every (objective, budget, seed) one after another, each as a child
// `tally train` in its own run folder under the compare's folder, scores each finished run with a
// child `tally eval --json`, and writes compare.json and compare.html: per objective and budget,
// each measure's mean over seeds with its 95% interval, the compute and memory it took, the
// ledger's answers, and a verdict. Every step is kept in files, so the same command run again
// after a crash, a Ctrl-C or a kill -9 skips what finished and resumes the run under way.
#pragma once
#include "config.h"

enum {
  COMPARE_MAX_OBJECTIVES = 8,
  COMPARE_MAX_BUDGETS = 4,
  COMPARE_MAX_SEEDS = 30,  // the t table of the intervals covers 1..29 degrees of freedom
  COMPARE_MAX_ARGS = 1024,
};

typedef struct {
  int n_objectives, n_budgets, n_seeds;
  const char *objectives[COMPARE_MAX_OBJECTIVES];
  const char *config_paths[COMPARE_MAX_OBJECTIVES];  // --config of each; NULL: configs/NAME.ini
  const char *budgets[COMPARE_MAX_BUDGETS];          // train.budget texts: 2PFLOP, 7m, 3epochs
  // Each objective's configuration at each budget, resolved and validated as `tally train` would
  // resolve it: what is planned. Seed s trains it with train.seed + s.
  const Config *configs[COMPARE_MAX_OBJECTIVES][COMPARE_MAX_BUDGETS];
  // Options every `tally train` of the compare gets, as given (--set, --data, --batch-size, --lr).
  const char *shared_args[COMPARE_MAX_ARGS];
  int n_shared_args;
  const char *out_dir;
  int quiet;            // the trainings' progress lines are left out
  int no_memory_check;  // runs whose plan does not fit the machine start anyway
} CompareSpec;

// Chooses each objective's recipe (spec->config_paths) from at most one of: config_dir (each is
// DIR/NAME.ini), all_config (one FILE for all) or per_objective ("NAME=FILE" texts; the others
// keep configs/NAME.ini). Refuses an objective named twice and a NAME=FILE that names none.
// Returns 0, or -1 with tl_last_error() set.
int compare_choose_recipes(CompareSpec *spec, const char *config_dir, const char *all_config,
                           const char *const *per_objective, int n_per_objective);

// Runs the compare. Returns the exit code: 0 with compare.json and compare.html written; 1 when a
// plan, a run or an evaluation failed (one line says which and why), the code of a training
// that stopped on a NaN loss (3), 128 + the signal when interrupted (the run under way keeps its
// checkpoint; the same command continues); 2 when --out holds a compare of other settings.
int compare_run(const CompareSpec *spec);

// The run folder of (objective o, budget b, seed s) under the compare's folder.
void compare_run_dir(const CompareSpec *spec, int o, int b, int s, char *out, size_t n);
// What `tally eval --json` printed for a run, kept beside its other files.
#define COMPARE_EVAL_FILE "compare-eval.json"
