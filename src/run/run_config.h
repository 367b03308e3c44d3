// The configuration a command runs with: a recipe (the one named, else configs/OBJECTIVE.ini when
// it exists, else the built-in defaults) refined by the command line, or a resumed run's own with
// what a resumed run may change; and what a training checks against its plan before it starts.
#pragma once
#include <stddef.h>

#include "config.h"
#include "run/trainer.h"

// What the command line said about the configuration (train, plan, compare), as given.
typedef struct {
  const char *config_path;  // NULL: configs/NAME.ini when it exists, else the built-in defaults
  const char *sets[256];
  int n_sets;
  char steps_set[64], epochs_set[64], budget_set[96];
  // --data, --batch-size, --lr: before the --set options, which may refine them.
  const char *data_path;
  char batch_set[64], lr_set[64];
} ConfigArgs;

// The configuration `tally train --objective=NAME` runs with these options, validated. Returns 0,
// or -1 with tl_last_error() set.
int run_config_load(const char *objective, const ConfigArgs *a, Config *cfg);

// --resume DIR: the configuration, objective and step from DIR's checkpoint (and --no-knn when the
// run was started with it; what it has spent; the length a time or FLOP budget fixed), with the
// overrides a resumed run may take from ca's --set, --steps and --epochs. ckpt_path receives the
// checkpoint's path. Returns 0; 1 with tl_last_error() when the checkpoint cannot be read or the
// result is not valid; 2 with tl_last_error() for an override a resumed run may not take.
int run_config_resume(const char *dir, const ConfigArgs *ca, Config *cfg, char *objective,
                      size_t objective_cap, char *ckpt_path, size_t ckpt_cap, TrainOptions *opt);

// A run that cannot fit is refused before it starts, from its plan (arithmetic, a fraction of a
// second), instead of being killed by the kernel minutes in; the planned peak is kept in
// opt->planned_peak_bytes for the run's summary either way (`check` 0: --no-memory-check). Under
// mpi each rank's machine is its own, so only the local backend is planned. A plan that fails
// leaves the error to train_run. Returns 1 when the run may start, 0 with tl_last_error() saying
// what it needs.
int run_fits_in_memory(const Config *cfg, const char *objective, TrainOptions *opt, int check);

// A FLOP budget below one step, or above what Tally counts, is refused before the run starts:
// its plan counts a step's FLOPs as training will (a dry run, a fraction of a second). A resumed
// run's length is fixed already. Returns 1, or 0 with tl_last_error() set.
int run_budget_fits_steps(const Config *cfg, const char *objective, const TrainOptions *opt);
