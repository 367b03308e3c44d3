// The training loop: load, encode, compare, backward, average, update, account.
#pragma once
#include "config.h"

typedef struct {
  const char *objective;  // inbatch | moco | mae
  const char *out_dir;    // run folder (created; must not already hold a finished run)
  int knn_at_start;       // also evaluate the untrained encoder (a baseline) before step 0
  int quiet;              // no progress lines
  int no_knn;             // skip the kNN monitor (benchmarks)
} TrainOptions;

// Runs a whole training job. Returns 0 on success; on failure prints one line saying what went
// wrong and where (file, path, step) and returns a nonzero exit code.
int train_run(const Config *cfg, const TrainOptions *opt);
