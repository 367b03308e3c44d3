// What the parts of a training run (train/trainer.c and the train/run_*.c files beside it) share:
// the run, each replica's state, and the functions one part calls in another. Internal to
// `tally train`: nothing outside src/train/ includes it.
#pragma once
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "data/loader.h"
#include "eval/monitor.h"
#include "io/safetensors.h"
#include "ledger/record.h"
#include "objectives/objective.h"
#include "parallel/comm.h"
#include "train/replica.h"
#include "train/run_layout.h"
#include "run/trainer.h"

// What all replicas share: the read-only data, the plan of steps, and rank 0's outputs.
typedef struct {
  const Config *cfg;
  const TrainOptions *opt;
  // The objective, the replicas and their shards, the steps of an epoch and of the run (a time or
  // FLOP budget's once measured): as `tally plan` draws them.
  RunLayout layout;
  Dataset train, test;
  Dataset eval_train;   // [eval] train, when given (rank 0)
  const Dataset *bank;  // the monitor's memory bank and quality sample: eval_train or train
  AugmentParams aug;  // the evaluation transform: data.image_size, the training set's normalization
  ViewRecipe views;   // what the loader prepares for each step
  int start_step;     // 0, or the steps a resumed checkpoint holds
  // The resolved configuration and model as INI text: written to config.ini and into every
  // checkpoint, from which --resume reads them back.
  char *config_text, *model_text;
  char path_jsonl[4096], path_csv[4096], path_ckpt[4096], path_summary[4096], path_eval[4096];
  // Written by rank 0 only.
  int exit_code;
  double final_loss, images_per_s, train_seconds;
  size_t peak_rss;
  int evaluated, knn_start_done;  // last_eval and knn_start hold results
  int stopped_early;              // 1: --stop-at or a signal ended the run before its last step
  int no_knn;         // no kNN: asked (--no-knn, no monitor at all) or no labels to vote with
  int collapsed;      // the last evaluation found the embeddings collapsed
  Budget budget;      // [train] budget
  int length_frozen;  // the run's length is fixed (always, except a time/FLOP budget's first steps)
  double flops_total;     // training FLOPs so far over every replica (rank 0's count, scaled)
  long ledger_last_step;  // the last record in ledger.jsonl (-1: none yet)
  unsigned long ledger_last_crc;  // the CRC-32 of its line, kept in checkpoints
  unsigned long ledger_csv_crc;   // the CRC-32 of ledger.csv so far, header included, kept too
  long long eval_bytes;           // eval.jsonl's size as this run knows it, and the CRC-32 of
  unsigned long eval_crc;         // those bytes, kept in checkpoints too
  int started;    // the replicas were started (failures after it stop them through Comm)
  int finishing;  // resumed at its last step without a summary: evaluate and summarize
  KnnResult last_eval, knn_start, knn_raw;
  int steps_done;
  int quiet_rank;  // an MPI rank other than 0: trains, but writes and prints nothing
} Run;

// Faults injected by tests of the failure paths. TALLY_INJECT_NAN_AT_STEP=S: the loss of step S
// becomes NaN; TALLY_INJECT_NAN_PARAM_AT_STEP=S: a parameter, after step S's update.
// TALLY_INJECT_FAIL=R:S: replica R fails at step S, as a killed process (MPI) or a replica that
// reports an error (local threads). TALLY_INJECT_KILL_IN_CHECKPOINT=S: the process is killed
// (SIGKILL) half way through writing the checkpoint after S steps.
// TALLY_INJECT_SLOW_STEPS=S:MS: every step from S on takes MS milliseconds longer (a machine
// that slows down after a time budget's steps were timed).
// TALLY_INJECT_COLLAPSE_AT_STEP=S: the backbone's parameters and statistics become 0 after step
// S's update, so every image has the same embedding (give the last step: training on it would
// not stay finite). TALLY_INJECT_SLOW_EVAL=MS: rank 0's evaluations by the monitor take MS
// milliseconds longer (a large labeled folder).
typedef struct {
  long nan_step;
  long nan_param_step;  // TALLY_INJECT_NAN_PARAM_AT_STEP=S: a weight becomes NaN after step S's
                        // update
  long collapse_step;
  int fail_rank;
  long fail_step;
  long kill_in_checkpoint;
  long slow_from_step, slow_ms;
  long slow_eval_ms;
} Faults;

// One replica's training state.
typedef struct {
  Run *run;
  const Config *cfg;
  int rank, world;
  Comm *comm;
  Replica rep;  // model, objective, optimizer: built and stepped as `tally plan` does
  Loader loader;
  int loader_ok;
  KnnMonitor mon;     // rank 0
  int use_monitor;    // rank 0: kNN with labels, the label-free quality always; off with --no-knn
  FILE *jsonl, *csv;  // rank 0
  Faults faults;
  double train_start_ms, images_done, last_log_ms;
  double probe_start_seconds;  // rank 0: training time when a time budget's timed steps began
  int probe_start_step;        // rank 0: steps done then
  double *probe_ms;            // rank 0: the probe's step times so far (probe_n of probe_cap)
  int probe_n, probe_cap;
  // rank 0: a time budget's pace is measured from here (when its length was frozen, or the
  // resumed run's start), and how many of its checks of the length have run
  double pace_start_seconds;
  int pace_start_step, length_checks;
  int length_frozen;  // this replica's copy of the run's (each stops on its own count)
  // This replica's copy of the run's length, once frozen: the local replicas share `Run`, and
  // rank 0 changes its total at a time budget's checks while another replica may still be
  // deciding from it whether to take part in that check.
  int total_steps;
  int last_log_step;
} ReplicaState;

// run_signals.c: the signal that asked the run to stop, or 0 (the monitor's cancel flag too).
extern volatile sig_atomic_t run_stop_signal;
void run_install_stop_handlers(void);
int run_agreed_stop_signal(ReplicaState *r);

// run_folder.c: the run folder, locked, and the configuration written into it.
int run_folder_has(const char *dir, const char *name);
int run_make_folder(const char *dir, Run *run);
void run_config_texts(Run *run);

// run_agree.c: under mpi, every rank runs the same run or none does (1: they agree).
int run_ranks_agree(Run *run, Comm *comm);

// run_checkpoint.c: a checkpoint written, restored, or --init's starting weights.
int run_save_checkpoint(ReplicaState *r, long steps_done);
int run_restore_checkpoint(ReplicaState *r, const char *path);
int run_init_from_file(ReplicaState *r, const char *path);

// run_monitor.c: the monitor's data and the evaluations.
int run_load_monitor_data(Run *run);
int run_open_monitor(ReplicaState *r);
int run_evaluate(Run *run, KnnMonitor *mon, int step);

// run_ledger.c: the ledger's files and record of each step, and the progress line.
int run_open_ledger(ReplicaState *r);
void run_account_step(ReplicaState *r, int step, float lr, double loss, const Batch *batch,
                      const StepTimes *t, LedgerRecord *rec);
void run_print_progress(ReplicaState *r, int step, const LedgerRecord *rec);

// run_budget.c: a time or FLOP budget's length, fixed once measured and checked as it goes.
void run_freeze_length(ReplicaState *r, int step, const LedgerRecord *rec);
void run_check_length(ReplicaState *r, int step, const LedgerRecord *rec);

// run_summary.c: summary.json of a finished run.
int run_write_summary(Run *run);
