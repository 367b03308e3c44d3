// `tally plan`: the ledger a configuration will produce, drawn up before training without data or
// compute. The plan is measured, not estimated: the trainer's own replicas (train/replica.c) and
// kNN monitor are built and stepped, with oneDNN in dry-run mode (primitives created, FLOPs
// counted, nothing executed) and every large buffer only reserved (address space, never
// committed), so a plan of any size takes megabytes. What the trainer holds beyond them (dataset,
// loader buffers) comes from the same sizing functions its allocations use.
#pragma once
#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "config.h"
#include "ledger/record.h"

typedef struct {
  int no_knn;        // as `tally train --no-knn`: no kNN monitor, no evaluation memory
  int knn_at_start;  // as `tally train --knn-at-start`: the encoder is evaluated before step 0
} PlanOptions;

enum { PLAN_MAX_BUCKETS = 64 };

typedef struct {
  // What the plan was drawn from.
  char backbone[64];    // the model file's name, e.g. resnet-small
  int n_train, n_test;  // images after [data] limit / test_limit
  int image_size, channels;
  int world;  // [parallel] replicas (under the mpi backend: set it to the rank count)
  int global_batch, local_batch;  // local: rank 0's shard
  int steps_per_epoch;
  long total_steps;       // 0: set by a time budget, which training times
  size_t param_count;     // trainable floats (and buffers) of the online model
  int patches_per_image;  // vit backbones; else 0
  double timed_step_ms;   // a timed probe's median step here (plan_time_steps); NaN: not timed
  double timed_step_range_ms[2];  // its fastest and slowest step
  // The buckets an mpi run averages the gradient in while backward runs (parallel/grad_sync.h),
  // in the order they start: their floats, and the share of the step's backward FLOPs done when
  // backward had written each and those before it (where its sum starts; 1 for one it never
  // completes). Planned steps only (0 buckets otherwise); past PLAN_MAX_BUCKETS, neighbours are
  // merged in pairs.
  int grad_buckets;
  size_t grad_bucket_floats[PLAN_MAX_BUCKETS];
  double grad_bucket_ready[PLAN_MAX_BUCKETS];
  // Memory in bytes, as the ledger counts it: the whole process (every local replica; one
  // replica's process under the mpi backend).
  size_t category_bytes[MEM_NCAT];  // live while training, MEM_EVAL after every evaluation
  size_t dataset_bytes;             // training and test images and labels (in MEM_DATA)
  size_t loader_bytes;              // prefetch buffers and epoch permutations (in MEM_DATA)
  size_t eval_peak_bytes;           // MEM_EVAL at its highest, inside a kNN vote
  // What no category counts: code, libraries, oneDNN's generated kernels, thread stacks and the
  // C heap — the planning process's own peak resident memory once it has built every network of
  // its first plan (a dry run touches none of the counted buffers).
  size_t process_bytes;
  size_t total_bytes;  // the planned peak: every category, MEM_EVAL at its peak
} PlanTotals;

// As the step of plan_build: the run's last step.
#define PLAN_LAST_STEP LONG_MAX

// Draws up the record of 0-based `step` of a run of `objective` under cfg (validated here).
// step < 0 plans memory only (no step is run; counts, FLOPs and communication stay 0), which is
// what a memory budget search needs; PLAN_LAST_STEP plans the run's last step. opt NULL: the
// trainer's defaults. Returns 0, or -1 with tl_last_error() set (unknown objective, unreadable
// data, an objective that rejects the model).
int plan_build(const Config *cfg, const char *objective, long step, const PlanOptions *opt,
               LedgerRecord *out, PlanTotals *totals);

// A timed probe: `steps` training steps (after one that creates the primitives) of `objective`
// under cfg on this machine, one replica, on random views of the run's sizes; the median ms a
// step into *ms_per_step, the fastest and slowest into range_ms (when not NULL). Real memory and
// compute, unlike plan_build. Returns 0, or -1 with tl_last_error() set (several replicas or the
// mpi backend: a timed step is one replica's).
int plan_time_steps(const Config *cfg, const char *objective, int steps, double *ms_per_step,
                    double range_ms[2]);

// The config key a memory budget is spent on: train.batch_size, or moco.queue_size for
// objectives with a queue (moco), where the batch stays fixed.
const char *plan_budget_key(const char *objective);
// Finds the largest value of plan_budget_key(objective) whose planned total fits `budget_bytes`,
// by bisection over plan_build. fitted receives cfg with that value set; *value the value.
// Returns 0, or -1 with tl_last_error() set (even the smallest value does not fit, or a build
// fails).
int plan_fit_budget(const Config *cfg, const char *objective, size_t budget_bytes,
                    const PlanOptions *opt, Config *fitted, long *value);

// "2GiB", "512 MiB", "1.5GB", "4096": binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
// units, case-insensitive, or plain bytes. Returns 0, or -1 with tl_last_error() set.
int plan_parse_size(const char *text, size_t *bytes);

// One column per plan, rows grouped by the ledger's four questions, cost, time and memory totals.
// names: the column titles (objectives).
void plan_print_table(FILE *f, int n, const char *const *names, const LedgerRecord *recs,
                      const PlanTotals *totals);
// One JSON object: the ledger's fields under their ledger.jsonl names (measured-only fields
// null), then the totals as planned_* members. One line, like a ledger.jsonl line.
void plan_print_json(FILE *f, const LedgerRecord *rec, const PlanTotals *totals);

// What `tally plan` asks of every column.
typedef struct {
  PlanOptions options;
  long step;            // as plan_build's
  int fit_budget;       // 1: first the largest plan_budget_key value whose plan fits budget_bytes
  size_t budget_bytes;  //    (plan_fit_budget)
  int timed;            // 1: also a timed probe of 5 steps (plan_time_steps)
  int json;             // 1: no lines for a reader (plan_print_columns prints JSON)
} PlanRequest;

// One column of `tally plan`: fits cfg to the budget when asked (cfg becomes the fitted
// configuration), plans the step, times it when asked; says what it found on f. Returns 0, or
// -1 with tl_last_error() set.
int plan_column(FILE *f, Config *cfg, const char *objective, const PlanRequest *req,
                LedgerRecord *rec, PlanTotals *totals);
// The columns as `tally plan` shows them: one JSON line each (plan_print_json), or a heading and
// plan_print_table.
void plan_print_columns(FILE *f, int n, const char *const *names, const LedgerRecord *recs,
                        const PlanTotals *totals, int json);
