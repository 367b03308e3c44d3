#include "run/run_state.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/timer.h"
#include "io/regular_file.h"
#include "ledger/bytes.h"

// The time left as every duration reads ("850 ms", "12.5 s", "3.20 min"); "?" while a pace
// cannot be told yet (no step timed, or one so slow the run would outlast any wait).
static void format_eta(double seconds, char *buf, size_t n) {
  if (!(seconds >= 0) || seconds > 1e7)
    snprintf(buf, n, "?");
  else
    format_quantity(QTY_SECONDS, seconds, buf, n);
}

// The memory of the step's record: what is live now, and the process's peak.
static void fill_memory(LedgerRecord *rec) {
  MemSnapshot m;
  run_memory_snapshot(m);
  run_fill_memory(rec, m);
  rec->data_bytes = run_memory_category(m, MEM_DATA);
  rec->eval_bytes = run_memory_category(m, MEM_EVAL);
  rec->peak_rss_bytes = tl_peak_rss_bytes();
}

// Rank 0's ledger files: new, or appended to after a resume (ledger_truncate_for_resume kept
// only the steps the checkpoint holds).
int run_open_ledger(ReplicaState *r) {
  Run *run = r->run;
  r->jsonl = regular_fopen(run->path_jsonl, "a");
  r->csv = regular_fopen(run->path_csv, "a");
  if (!r->jsonl || !r->csv) return -1;
  // A new CSV (also one a resumed run found missing) starts with its header.
  struct stat st;
  if (fstat(fileno(r->csv), &st) != 0 || st.st_size > 0) return 0;
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (!m) TL_DIE("out of memory");
  ledger_write_csv_header(m, run->layout.def->ledger_fields);
  fclose(m);
  fwrite(text, 1, len, r->csv);
  run->ledger_csv_crc = crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)len);
  free(text);
  return 0;
}

// The trainer's part of the ledger record: identity, memory, FLOPs, communication and time.
void run_account_step(ReplicaState *r, int step, float lr, double loss, const Batch *batch,
                      const StepTimes *t, LedgerRecord *rec) {
  Run *run = r->run;
  CommStats cs = comm_stats(r->comm);
  replica_count(&r->rep, rec);
  rec->step = step;
  rec->epoch = step / run->layout.steps_per_epoch;
  rec->objective = run->layout.def->name;
  rec->replicas = r->world;
  rec->lr = lr;
  rec->loss = loss;
  fill_memory(rec);
  int sizes[LEDGER_MAX_VIEW_GROUPS], counts[LEDGER_MAX_VIEW_GROUPS];
  for (int g = 0; g < batch->n_groups; g++)
    sizes[g] = batch->group[g].size, counts[g] = batch->group[g].count;
  ledger_view_groups_finish(rec, batch->n_groups, sizes, counts, r->rep.encoder_act_bytes);
  rec->comm_ms = cs.ms[COLL_ALLREDUCE] + cs.ms[COLL_ALLGATHER] + cs.ms[COLL_BROADCAST];
  rec->optimizer_ms = t->updated - t->averaged;
  rec->step_ms = t->updated - t->start;
  // Every replica's FLOPs: rank 0's scaled by its share of the batch (the costs are per sample).
  run->flops_total += run_step_flops(&r->rep.shard, rec);
  rec->flops_total = run->flops_total;
  rec->train_seconds = run->opt->spent_seconds + (now_ms() - r->train_start_ms) / 1e3;
  rec->images_per_s = run->layout.global_batch / (rec->step_ms / 1e3);
  if (step % r->cfg->ledger.every == 0 && r->jsonl) {
    // Record by record: a kill loses at most the line being written, which readers skip. The
    // line's CRC goes into the next checkpoint, which ties this ledger to it.
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);
    if (!m) TL_DIE("out of memory");
    ledger_write_json(m, rec);
    fclose(m);
    fwrite(line, 1, len, r->jsonl);
    run->ledger_last_step = step;
    run->ledger_last_crc = crc32(0L, (const Bytef *)line, (uInt)len);
    free(line);
    // The CSV row too: its running CRC ties ledger.csv to the next checkpoint as well.
    m = open_memstream(&line, &len);
    if (!m) TL_DIE("out of memory");
    ledger_write_csv(m, rec);
    fclose(m);
    fwrite(line, 1, len, r->csv);
    run->ledger_csv_crc = crc32(run->ledger_csv_crc, (const Bytef *)line, (uInt)len);
    free(line);
    if (fflush(r->jsonl) != 0 || fflush(r->csv) != 0 || ferror(r->jsonl) || ferror(r->csv)) {
      char why[4400];
      snprintf(why, sizeof why, "%s: ledger record of step %d not written: %s", run->path_jsonl,
               step, strerror(errno));
      comm_abort(r->comm, why);
    }
  }
  run->final_loss = loss;
}

// A progress line with the rate since the last line and the ETA it implies.
void run_print_progress(ReplicaState *r, int step, const LedgerRecord *rec) {
  Run *run = r->run;
  int last = r->length_frozen && step + 1 == r->total_steps;
  if (run->opt->quiet ||
      !((step + 1) % r->cfg->train.log_every == 0 || last || step == run->start_step))
    return;
  double now = now_ms();
  // The rate shown is the recent one; the ETA follows the whole run's (evaluation excluded), so
  // it does not jump with every noisy window.
  int first = step == run->start_step;
  double per_step_ms = first ? rec->step_ms : (now - r->last_log_ms) / (step - r->last_log_step);
  double run_per_step_ms = (now - r->train_start_ms) / (step + 1 - run->start_step);
  // While a time budget's first steps are timed, the count is not known yet: "?", and the ETA is
  // what is left of the budget.
  char eta[32], total[16];
  if (r->length_frozen) {
    snprintf(total, sizeof total, "%d", run->layout.total_steps);
    format_eta((run->layout.total_steps - step - 1) * run_per_step_ms / 1e3, eta, sizeof eta);
  } else {
    snprintf(total, sizeof total, "?");
    format_eta(fmax(run->budget.amount - rec->train_seconds, 0), eta, sizeof eta);
  }
  printf(
      "step %*d/%s  epoch %d  loss %.4f  lr %.4g  %.0f img/s  act %.0f MiB  %.1f GFLOP  ETA %s\n",
      (int)strlen(total), step + 1, total, rec->epoch + 1, rec->loss, rec->lr,
      run->layout.global_batch / (per_step_ms / 1e3), rec->activation_bytes / 1048576.0,
      (rec->flops_forward + rec->flops_backward) / 1e9, eta);
  fflush(stdout);
  r->last_log_ms = now;
  r->last_log_step = step;
}
