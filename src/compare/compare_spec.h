// What a compare is, apart from running it: its objectives with their recipes, budgets and seeds
// (CompareSpec), and where its folder keeps each run and what is kept there. The runner
// (compare.c) and the reading of its results (compare_results.c) both build on it.
#pragma once
#include <stddef.h>

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

// The run folder of (objective o, budget b, seed s) under the compare's folder.
void compare_run_dir(const CompareSpec *spec, int o, int b, int s, char *out, size_t n);
// What `tally eval --json` printed for a run, kept beside its other files.
#define COMPARE_EVAL_FILE "compare-eval.json"
