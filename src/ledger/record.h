// One step of the resource ledger: what was encoded, what is held for backward, what is cached
// from earlier steps, what the next step must redo, and what it all cost. Objectives fill the
// counts from the code that does the work; the trainer fills memory (from the accounting
// allocator), FLOPs (from the ops' own counters), communication and time.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "core/alloc.h"
#include "parallel/comm.h"

// What one group of views (data/views.h: `count` views of each image at `size` pixels a side)
// cost this step, on this replica.
enum { LEDGER_MAX_VIEW_GROUPS = 4 };
typedef struct {
  int size, count;                       // the group's side in pixels and views of each image
  long views_grad, views_nograd;         // its views through an encoder with and without gradient
  double flops_forward, flops_backward;  // the encoders' FLOPs on its views
  size_t activation_bytes;               // encoder activations held for its views
} LedgerViewGroup;

// The record's fields as one table (the writers, the reader, `tally plan` and `tally report` all
// walk it), grouped by the question each answers.
typedef enum {
  LEDGER_IDENTITY,  // step, objective, lr, loss
  LEDGER_ENCODED,   // what was encoded this step
  LEDGER_HELD,      // what is held for backward (and the rest of memory)
  LEDGER_CACHED,    // what is cached from earlier steps
  LEDGER_NEXT,      // what the next step must redo
  LEDGER_COST,      // FLOPs, communication, shards
  LEDGER_TIME,      // wall time and throughput
  LEDGER_NGROUPS
} LedgerGroup;

typedef enum {
  UNIT_COUNT,
  UNIT_BYTES,
  UNIT_FLOPS,
  UNIT_MS,
  UNIT_SECONDS,
  UNIT_STEPS,
  UNIT_RATIO,
  UNIT_RATE,
  UNIT_TEXT,
  UNIT_FRACTION,  // a share in [0, 1], shown as a percentage (an accuracy)
  UNIT_FLAG,      // 0 or 1 (a collapsed encoder); its mean over seeds is the share that had it
} LedgerUnit;

typedef struct {
  const char *name;  // as written in ledger.jsonl / ledger.csv
  LedgerGroup group;
  LedgerUnit unit;
  // 1: only a real run can know it (time, loss, RSS, momentum drift); `tally plan` leaves it null.
  int measured_only;
} LedgerFieldInfo;

// The fields only one objective has (ObjectiveDef.ledger_fields: moco's queue, mae's patches):
// the objective declares them, a record carries its declaration and their values (`own`, in
// declaration order), and the writers put them after the common fields under their own names.
enum { LEDGER_MAX_OWN_FIELDS = 8 };
typedef struct {
  int n;
  LedgerFieldInfo field[LEDGER_MAX_OWN_FIELDS];
} LedgerOwnFields;
// The index of the field called `name` in `own` (may be NULL), or -1.
int ledger_own_find(const LedgerOwnFields *own, const char *name);
// The declaration of the objective called `objective` (NULL: none), for a reader.
typedef const LedgerOwnFields *(*LedgerOwnLookup)(const char *objective);

typedef struct {
  // identity
  long step;
  int epoch;
  const char *objective;
  int replicas;
  double lr;
  double loss;

  // encoded this step (this replica)
  long images_source;        // distinct source images loaded
  long views_grad;           // views through the online encoder with gradient
  long views_nograd;         // views through the momentum encoder, forward only
  long negatives_per_query;  // comparison candidates per query
  long positives_per_query;
  // The step's views by group (ledger.jsonl: "view_groups", a list of objects; ledger.csv:
  // view_group<k>_<member> columns). An objective of several groups fills groups 1.. (their
  // views, FLOPs and activations) and the views of group 0; ledger_view_groups_finish does the
  // rest.
  int view_groups;
  LedgerViewGroup view_group[LEDGER_MAX_VIEW_GROUPS];

  // held (bytes, from the accounting allocator)
  size_t activation_bytes;                 // retained for backward, all components
  size_t activation_bytes_by[COMP_NCOMP];  // by component
  size_t activation_grad_bytes;
  size_t param_bytes, grad_bytes, optimizer_bytes, momentum_encoder_bytes;
  size_t workspace_bytes, data_bytes;
  size_t eval_bytes;  // the kNN monitor's model, feature banks and scratchpad (MEM_EVAL)

  // cached from earlier steps
  size_t queue_bytes;  // held between steps for later steps to compare against (MEM_QUEUE)

  // the next step
  long encodings_next_new;     // encodings the next step computes anew
  long encodings_next_reused;  // encodings it takes from cache instead

  // cost
  double flops_forward, flops_backward;
  double flops_forward_by[COMP_NCOMP], flops_backward_by[COMP_NCOMP];
  // The part of flops_forward + flops_backward that convolutions ran by Winograd kernels
  // ([train] conv_algorithm), counted as direct convolution's arithmetic like the rest.
  double flops_winograd;
  double comm_bytes;
  double comm_allreduce_bytes, comm_allgather_bytes;
  // Collectives this step (a bucketed gradient average is one): each pays the link's latency
  // per round of its algorithm, which `tally plan --nodes` adds to the bytes' time.
  long comm_allreduce_calls, comm_allgather_calls;
  double flops_total;   // training FLOPs so far, every replica, this step included
  int shard_samples;    // this replica's samples
  double shard_weight;  // its weight in the gradient average

  // time
  double data_ms, forward_ms, backward_ms, comm_ms, optimizer_ms, step_ms;
  double images_per_s;
  double train_seconds;  // training time so far, evaluation excluded
  size_t peak_rss_bytes;

  // the objective's own fields
  const LedgerOwnFields *own_fields;  // NULL: none
  double own[LEDGER_MAX_OWN_FIELDS];
} LedgerRecord;

// Completes the view groups once the step's FLOPs are in the record: each group's size and count
// from the recipe (n_groups, sizes, counts), and group 0 what the encoders did and hold
// (encoder_act_bytes: this replica's encoder activations) that the objective did not put in a
// later group (for an objective of one group: all of it, its views the step's).
void ledger_view_groups_finish(LedgerRecord *r, int n_groups, const int *sizes, const int *counts,
                               size_t encoder_act_bytes);

// The counted communication fields (bytes and calls, per kind and in all) from a step's
// collective statistics: the trainer and the plan fill them the same way.
void ledger_record_comm(LedgerRecord *r, const CommStats *cs);

// The common fields (every record has them), by index.
int ledger_field_count(void);
const LedgerFieldInfo *ledger_field_info(int i);
// Index of the common field called `name`, or -1.
int ledger_field_find(const char *name);
// A value of `unit` for people, the one way the plan's, the report's and the compare's tables
// write it: bytes, FLOPs and times in the unit of their ladder that reads best (ledger/bytes.h:
// "1.50 GiB", "350 GFLOP", "850 ms"), counts and steps whole, rates with 3 significant digits
// (whole from 100 on), ratios with 4; "-" for a value not known (NaN, infinite, or text).
void ledger_format_value(LedgerUnit unit, double v, char *buf, size_t n);
// The field's value as a double (NaN for text and for a non-finite double).
double ledger_field_value(const LedgerRecord *r, int i);
// The value of the field called `name`, common or the record's objective's own; NaN when the
// record has no such field.
double ledger_value(const LedgerRecord *r, const char *name);
const char *ledger_group_title(LedgerGroup g);

// JSON Lines: one object per record, field names with units.
void ledger_write_json(FILE *f, const LedgerRecord *r);
// The members of that object without the braces, so a caller can add its own; with
// `planned`, measured-only fields are written as null.
void ledger_write_json_members(FILE *f, const LedgerRecord *r, int planned);
// Reads one line written by ledger_write_json: known fields are set, unknown names skipped, nulls
// read as NaN (doubles) or 0; text fields are left NULL. The objective's own fields (after its
// "objective" member) are read when `lookup` (may be NULL) knows its declaration. Returns the
// number of fields set, or -1 when the line is not a flat JSON object.
int ledger_read_json(const char *line, LedgerRecord *r, LedgerOwnLookup lookup);
// CSV: a header line once (the common fields, then `own`'s, which may be NULL), then one row per
// record, same names.
void ledger_write_csv_header(FILE *f, const LedgerOwnFields *own);
void ledger_write_csv(FILE *f, const LedgerRecord *r);

// What ties a run folder's ledger to the checkpoint a run resumes from (its metadata keeps it).
typedef struct {
  long steps_done;  // the checkpoint's step: records of later steps are dropped
  // The last record written before the checkpoint (-1: none, or a checkpoint from before this
  // was kept) and the CRC-32 of its ledger.jsonl line.
  long last_step;
  unsigned long last_crc;
  // The CRC-32 of ledger.csv's bytes through that record, its header included (-1: not kept).
  long long csv_crc;
  // eval.jsonl as the run had written it at the checkpoint: its first `eval_bytes` bytes (-1:
  // not kept) and their CRC-32. `tally eval RUN` appends after them.
  long long eval_bytes;
  unsigned long eval_crc;
  // The monitor evaluates step `steps_done` again (a run resumed at its last step without its
  // summary): its record of that step is dropped, a `tally eval` record is kept.
  int evaluate_again;
} LedgerResume;

// Resuming at `steps_done`: rewrites a run's ledger.jsonl and ledger.csv (atomically) keeping
// the records of steps before it — the steps the checkpoint holds — and dropping later ones and
// a last line cut off by a kill. eval.jsonl keeps evaluations up to and including it, except
// the raw-pixel baseline, which the resumed run reports again. Missing files are fine.
// The ledger must be the checkpoint's own: a ledger.jsonl whose line of `last_step` is missing or
// differs, or a ledger.csv whose kept bytes differ from what the checkpoint saw written, is
// refused, untouched (a checkpoint copied from another run would mix two runs' records; another
// CSV's first line would become the header), and so is an eval.jsonl that does not begin with
// the bytes the run had written. The resumed run goes on from what is kept: *kept receives
// ledger.csv's CRC-32 and eval.jsonl's size and CRC-32.
typedef struct {
  unsigned long csv_crc, eval_crc;
  long long eval_bytes;
} LedgerKept;
int ledger_truncate_for_resume(const char *run_dir, const LedgerResume *how, LedgerKept *kept);
// 0 when the ledger.jsonl at `path` is missing or its whole line of `step` has CRC-32 `crc` (the
// last such line: a resumed run's records follow the ones it dropped); -1 with tl_last_error()
// saying it is not the ledger of the checkpoint that recorded them.
int ledger_check_own(const char *path, long step, unsigned long crc);
