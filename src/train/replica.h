// One data-parallel replica: its oneDNN context, parameters, objective and optimizer, and the
// step that trains it. `tally train` builds and steps replicas with this module, and `tally plan`
// builds and steps the very same ones in dry run (nothing computed, large buffers only reserved)
// on a stand-in batch — so what the plan counts is what the trainer's step counts, by
// construction, field by field.
#pragma once
#include "config.h"
#include "core/exec_ctx.h"
#include "core/params.h"
#include "eval/monitor.h"
#include "ledger/record.h"
#include "objectives/objective.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "train/optim.h"
#include "train/run_layout.h"

typedef struct {
  const Config *cfg;
  const ObjectiveDef *def;
  int rank, world;
  RunShard shard;  // this replica's part of the global batch
  Comm *comm;
  ExecCtx ctx;
  BuildPolicy policy;  // how its networks are built, from the configuration
  BufferArena arena;   // the pooled buffers its backbones share (ops/buffer_pool.h)
  ParamSet ps;
  Objective *obj;
  Optimizer *optim;
  GradSync *grad_sync;  // overlapped gradient averaging, where the backend can
  float *buffer_pack;   // (replica_buffer_floats) BatchNorm statistics on their way to the average
  size_t encoder_act_bytes;  // encoder activations this replica's objective holds (its build's)
} Replica;

typedef struct {
  const Config *cfg;
  const RunLayout *layout;  // the objective, replicas and their shards
  int rank;
  long total_steps;                     // the schedules' length
  const char *out_dir;                  // where the objective may write images (rank 0), or NULL
  int dry_run;                          // a plan: build and walk the step, compute nothing
  const float *input_mean, *input_std;  // the views' normalization (ObjectiveEnv); NULL in a plan
} ReplicaSpec;

// The kNN monitor's settings from the run's configuration.
MonitorSettings replica_monitor_settings(const Config *cfg);

// The views a step of `def` trains on under cfg: its view groups from the recipe's [augment]
// (data.image_size a side), normalized by (mean, std) per channel (NULL: none, as in a plan,
// which only sizes them).
ViewRecipe replica_views(const Config *cfg, const ObjectiveDef *def, const float *mean,
                         const float *std);

// Builds the replica: every replica initializes from the same seed, so all start identical.
// Returns 0, or -1 with the reason recorded (tl_last_error); replica_destroy cleans up either way.
int replica_build(Replica *r, const ReplicaSpec *spec, Comm *comm);
void replica_destroy(Replica *r);

// The step's phase boundaries (milliseconds), for the ledger's times.
typedef struct {
  double start, computed, averaged, updated;
} StepTimes;

// The objective's forward and backward on the batch (counters reset first). Returns the step's
// loss, the same on every replica.
double replica_forward_backward(Replica *r, const Batch *batch, LedgerRecord *rec);

// The rest of the step, once the loss is known to be finite: the gradients averaged over replicas
// (weighted by sample count), the optimizer at `lr` (not in a dry run: nothing to update), the
// replicas' buffers averaged, the objective's after-update (momentum encoders, queues). Sets
// t->averaged and t->updated.
void replica_update(Replica *r, const Batch *batch, float lr, LedgerRecord *rec, StepTimes *t);

// Every `checksum_every` steps and at the run's last step (`last`): rank of the first replica
// whose parameters differ from replica 0's, or -1. The last step's check means a run shorter
// than checksum_every cannot end with diverged replicas unseen.
int replica_check(Replica *r, long step, int last);

// The counted part of the step's record, from the context and the communicator: FLOPs by
// component, communication bytes, the shard.
void replica_count(const Replica *r, LedgerRecord *rec);
