// The training loop: load, encode, compare, backward, average, update, account.
#pragma once
#include "config.h"

typedef struct {
  const char *objective;    // inbatch | moco | mae
  const char *out_dir;      // run folder (created; must not already hold a finished run)
  int knn_at_start;         // also evaluate the untrained encoder (a baseline) before step 0
  int quiet;                // no progress lines
  int no_knn;               // no monitor at all: no kNN, no label-free quality (benchmarks)
  int overwrite;            // replace a run the folder already holds
  const char *resume_path;  // checkpoint to continue from (the run folder's), or NULL
  long start_step;          // the steps that checkpoint holds
  const char *init_path;    // safetensors to take the starting weights from, or NULL
  long stop_at;             // > 0: end after this many steps as an interruption would
  // Resuming a run whose length a time or FLOP budget fixed: that length, and the training
  // seconds and FLOPs it had spent (0 otherwise).
  long frozen_total_steps;
  double spent_seconds, spent_flops;
  // Resuming: the last ledger record the checkpoint saw written (its step, -1 for none, and the
  // CRC-32 of its ledger.jsonl line), which ties the run folder's ledger to the checkpoint.
  long ledger_last_step;
  unsigned long ledger_last_crc;
  long long ledger_csv_crc;  // and the CRC-32 of ledger.csv up to that record (-1: not recorded)
  long long eval_bytes;      // eval.jsonl's size as the run had written it (-1: not recorded)
  unsigned long eval_crc;    // and the CRC-32 of those bytes
  double last_loss;  // resuming: the loss of the checkpoint's last step (NaN if not recorded)
  // Resuming: the OpenMP threads each replica had when the checkpoint was written (0: not
  // recorded). oneDNN's reductions split over threads, so another count changes the arithmetic.
  int checkpoint_threads;
  // The run's planned peak memory (`tally plan`'s total, drawn up before it started), kept in
  // summary.json beside the measured peak; 0 when it was not planned.
  size_t planned_peak_bytes;
} TrainOptions;

// Runs a whole training job. Returns 0 on success (a finished run, or one stopped by --stop-at);
// on failure prints one line saying what went wrong and where (file, path, step) and returns a
// nonzero exit code; 128 + the signal when SIGINT or SIGTERM stopped it (after a checkpoint).
int train_run(const Config *cfg, const TrainOptions *opt);

// The run folder of a training not told where: runs/OBJECTIVE-YYYYmmdd-HHMMSS (local time), so
// runs started one after another sort by when they began and never share a folder.
void run_default_folder(const char *objective, char *out, size_t cap);
