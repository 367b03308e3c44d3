#include "run/run_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// A time budget's length comes from the steps this process times after its first (which creates
// oneDNN's kernels and faults the buffers in): at least BUDGET_PROBE_STEPS of them and at least
// BUDGET_PROBE_FRACTION of the budget (at most BUDGET_PROBE_MAX_S), so that a recipe whose steps
// take a fraction of a second is timed over many of them. A start has a few slow steps (the
// loader filling up, first page faults: one of 18 took 2.4x the others), which a plain mean
// counts as if the whole run had them: a 420 s budget trained 390 s. So a step is the mean of the
// fastest BUDGET_PROBE_KEEP of the probe's step times (that one left out, the same run predicts
// 418 s), plus the mean time between steps (ledger writes, checkpoints).
enum { BUDGET_PROBE_STEPS = 5 };

static const double BUDGET_PROBE_FRACTION = 0.02, BUDGET_PROBE_MAX_S = 30, BUDGET_PROBE_KEEP = 0.9;

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Once the probe has timed enough steps of a time budget: 1, with what is left of the budget and
// a step's time in seconds; 0 while it has not.
static int time_budget_measured(ReplicaState *r, int step, const LedgerRecord *rec, double *left_s,
                                double *per_step_s) {
  const double amount = r->run->budget.amount;
  const int done = step + 1;
  *left_s = amount - rec->train_seconds;
  *per_step_s = rec->step_ms / 1e3;
  if (step == r->run->start_step) {
    r->probe_start_seconds = rec->train_seconds;
    r->probe_start_step = done;
    return rec->train_seconds >= amount;
  }
  if (r->probe_n == r->probe_cap) {
    r->probe_cap = r->probe_cap ? 2 * r->probe_cap : 64;
    r->probe_ms = realloc(r->probe_ms, sizeof *r->probe_ms * (size_t)r->probe_cap);
    if (!r->probe_ms) TL_DIE("out of memory for %d step times", r->probe_cap);
  }
  r->probe_ms[r->probe_n++] = rec->step_ms;
  const int timed = done - r->probe_start_step;
  const double probe_s = rec->train_seconds - r->probe_start_seconds;
  if (rec->train_seconds >= amount) return 1;
  if (timed < BUDGET_PROBE_STEPS ||
      probe_s < fmin(BUDGET_PROBE_FRACTION * amount, BUDGET_PROBE_MAX_S))
    return 0;
  double all_ms = 0;
  for (int i = 0; i < r->probe_n; i++) all_ms += r->probe_ms[i];
  qsort(r->probe_ms, (size_t)r->probe_n, sizeof *r->probe_ms, compare_double);
  const int keep = (int)ceil(BUDGET_PROBE_KEEP * r->probe_n);
  double kept_ms = 0;
  for (int i = 0; i < keep; i++) kept_ms += r->probe_ms[i];
  const double between_s = fmax(probe_s - all_ms / 1e3, 0) / r->probe_n;
  *per_step_s = kept_ms / keep / 1e3 + between_s;
  free(r->probe_ms);
  r->probe_ms = NULL;
  r->probe_n = r->probe_cap = 0;
  return 1;
}

// A time or FLOP budget fixes the run's length once its first steps are measured: after the first
// step for FLOPs (the count is exact and the same every step), after the probe above for time.
// Until then the schedules follow a run without end (after any warm-up, the peak learning rate
// and the base momentum), and the run goes on whatever its provisional length. Rank 0 decides and
// every replica takes its number, each step of the probe, so all of them stop after the same one.
void run_freeze_length(ReplicaState *r, int step, const LedgerRecord *rec) {
  Run *run = r->run;
  if (r->length_frozen) return;
  const int done = step + 1;
  int total = 0;
  if (r->rank == 0) {
    // FLOPs: the whole budget over a step's count (the same every step); time: the steps done
    // and what is left over a step's time.
    double left, per_step;
    int measured = 1, counted = done;
    if (run->budget.kind == BUDGET_FLOPS) {
      left = run->budget.amount;
      per_step = run->flops_total / done;
      counted = 0;
    } else {
      measured = time_budget_measured(r, step, rec, &left, &per_step);
    }
    if (measured && config_budget_steps(r->cfg, counted, left, per_step, &total) != 0) {
      comm_abort(r->comm, tl_last_error());
      return;
    }
    if (measured) run->layout.total_steps = total;
    if (measured) r->pace_start_seconds = rec->train_seconds;
  }
  int t = total;
  if (r->world > 1) comm_broadcast(r->comm, &t, sizeof t, 0);
  if (t == 0) return;
  if (r->rank != 0 && run->quiet_rank) run->layout.total_steps = t;
  r->length_frozen = 1;
  r->total_steps = t;
  r->rep.obj->env.total_steps = t;
  // Every rank, so that all of them check the length again at the same steps.
  r->pace_start_step = done;
  if (r->rank == 0) {
    run->length_frozen = 1;
    if (!run->quiet_rank && !run->opt->quiet) {
      printf("budget %s: %d steps (%s per step measured)\n", r->cfg->train.budget, t,
             run->budget.kind == BUDGET_FLOPS ? "FLOPs" : "time");
      fflush(stdout);
    }
  }
}

// A time budget's length is checked again when a quarter, half, three quarters and nine tenths
// of it are done:
// the steps left are what is left of the budget at the pace since the length was frozen (every
// step's whole time, what runs between steps included), so a run whose steps slow down (or
// speed up) after the probe still ends within a few percent of its budget. The schedules take
// the new length from the next step on (a cosine's remaining part is that of the new length).
// Rank 0 decides and every replica takes its number, as when the length was frozen.
enum { LENGTH_CHECKS = 4, LENGTH_CHECK_MIN_STEPS = 10 };

static const double LENGTH_CHECK_AT[LENGTH_CHECKS] = {0.25, 0.5, 0.75, 0.9};

void run_check_length(ReplicaState *r, int step, const LedgerRecord *rec) {
  Run *run = r->run;
  if (run->budget.kind != BUDGET_SECONDS || !r->length_frozen || r->length_checks == LENGTH_CHECKS)
    return;
  const int done = step + 1;
  // Every replica knows the same total and the same checks done, so all reach this together.
  if (done < LENGTH_CHECK_AT[r->length_checks] * r->total_steps ||
      done - r->pace_start_step < LENGTH_CHECK_MIN_STEPS || done >= r->total_steps)
    return;
  r->length_checks++;
  int total = 0;
  const int before = r->total_steps;
  if (r->rank == 0) {
    const double pace = (rec->train_seconds - r->pace_start_seconds) / (done - r->pace_start_step);
    if (config_budget_steps(r->cfg, done, run->budget.amount - rec->train_seconds, pace, &total) !=
        0) {
      comm_abort(r->comm, tl_last_error());
      return;
    }
    run->layout.total_steps = total;
  }
  if (r->world > 1) comm_broadcast(r->comm, &total, sizeof total, 0);
  if (r->rank != 0 && run->quiet_rank) run->layout.total_steps = total;
  r->total_steps = total;
  r->rep.obj->env.total_steps = total;
  if (r->rank == 0 && total != before && !run->quiet_rank && !run->opt->quiet) {
    printf("budget %s: %d steps (was %d; %.3f s a step since step %d)\n", r->cfg->train.budget,
           total, before,
           (rec->train_seconds - r->pace_start_seconds) / (done - r->pace_start_step),
           r->pace_start_step);
    fflush(stdout);
  }
}
