#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/timer.h"
#include "data/loader.h"
#include "eval/monitor.h"
#include "io/atomic_file.h"
#include "io/dir_lock.h"
#include "io/regular_file.h"
#include "objectives/objective.h"
#include "parallel/agree.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "parallel/replica_sync.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/features.h"
#include "train/optim.h"
#include "train/replica.h"
#include "train/run_layout.h"

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
  int started;    // the replicas were started (failures after it stop them through Comm)
  int finishing;  // resumed at its last step without a summary: evaluate and summarize
  KnnResult last_eval, knn_start, knn_raw;
  int steps_done;
  int quiet_rank;  // an MPI rank other than 0: trains, but writes and prints nothing
} Run;

// The signal that asked the run to stop (SIGINT, SIGTERM, SIGHUP), or 0. A second one ends the
// process at once, unless it comes within STOP_REPEAT_NS of the first: one Ctrl-C can arrive
// twice (`timeout --foreground` passes the terminal's SIGINT on to a child that got it too).
static volatile sig_atomic_t stop_signal;
static struct timespec stop_signal_time;
#define STOP_REPEAT_NS 250000000L

static void on_stop_signal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  if (stop_signal) {
    long ns = (now.tv_sec - stop_signal_time.tv_sec) * 1000000000L +
              (now.tv_nsec - stop_signal_time.tv_nsec);
    if (ns >= STOP_REPEAT_NS) _exit(128 + sig);
    return;
  }
  stop_signal_time = now;
  stop_signal = sig;
}

// A closed terminal or ssh session (SIGHUP) stops the run as SIGTERM does, unless the run was
// started to outlive it (nohup). (A closed pipe on
// stdout loses the progress lines, not the run: `tally train` ignores SIGPIPE from its start.)
static void install_stop_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  // Under nohup SIGHUP is ignored on purpose: the run must outlive the terminal.
  struct sigaction hup;
  if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, NULL);
}

static void format_duration(double seconds, char *buf, size_t n) {
  if (!(seconds >= 0) || seconds > 1e7) {
    snprintf(buf, n, "?");
    return;
  }
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, n, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    snprintf(buf, n, "%ld:%02ld", s / 60, s % 60);
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

// One evaluation's console line: kNN top-1 (labeled data), the probe, the label-free quality.
static void print_eval(const char *what, KnnResult r) {
  if (isfinite(r.top1))
    printf("kNN top-1 %-26s %.4f (k=%d; k=20: %.4f)", what, r.top1, r.knn_k, r.top1_k20);
  else
    printf("label-free quality %-17s", what);
  if (isfinite(r.linear_top1)) printf("  linear probe %.4f", r.linear_top1);
  if (isfinite(r.quality.rankme))
    printf("  rankme %.1f  embedding_std %.4f (1/sqrt(d) %.4f)", r.quality.rankme,
           r.quality.embedding_std, r.quality.embedding_std_reference);
  printf("  [%.1f s]\n", r.seconds);
  fflush(stdout);
}

// Appends one evaluation to eval.jsonl (knn_result_write_line). Returns -1 with
// tl_last_error() when the line could not be written whole.
static int record_eval(const Run *run, const char *what, long step, KnnResult r) {
  FILE *f = regular_fopen(run->path_eval, "a");
  if (!f) return -1;
  knn_result_write_line(f, step, what, NULL, &r);
  int ok = fflush(f) == 0 && !ferror(f);
  int err = errno;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : tl_fail("%s: cannot write: %s", run->path_eval, strerror(err ? err : EIO));
}

// One warning line when the embeddings collapse (at the first evaluation that finds them so, and
// again only if they recover and collapse anew), on stderr so a quiet run shows it too.
static void warn_at_collapse(Run *run, int step, const EmbeddingQuality *q) {
  const int collapsed = embedding_quality_collapsed(q);
  if (collapsed && !run->collapsed)
    fprintf(stderr,
            "tally: warning: step %d: the embeddings have collapsed: embedding_std %.2g is %.1f%% "
            "of 1/sqrt(d) = %.4f (collapse: below %.0f%%), rankme %.2f\n",
            step, q->embedding_std, 100 * q->embedding_std / q->embedding_std_reference,
            q->embedding_std_reference, 100 * QUALITY_COLLAPSED_FRACTION, q->rankme);
  run->collapsed = collapsed;
}

// Rank 0's evaluation; the other replicas wait at the barrier that follows. 1 when a stop
// signal cut it short (nothing recorded).
static int evaluate(Run *run, KnnMonitor *mon, int step) {
  // Encoding the memory bank takes a while: say so before it starts.
  if (!run->opt->quiet) {
    if (mon->labeled)
      printf(
          "kNN monitor: encoding %d training and %d test images, and %d for the label-free "
          "quality...\n",
          mon->n_train, mon->n_test, mon->n_quality);
    else
      printf("quality monitor: encoding %d training images...\n", mon->n_quality);
    fflush(stdout);
  }
  KnnResult r = knn_monitor_run(mon);
  if (r.failed) return tl_fail("%s monitor: %s", mon->labeled ? "kNN" : "quality", tl_last_error());
  if (r.cancelled) return 1;
  char what[64];
  snprintf(what, sizeof what, "after step %d:", step);
  print_eval(what, r);
  warn_at_collapse(run, step, &r.quality);
  run->last_eval = r;
  run->evaluated = 1;
  return record_eval(run, "encoder", step, r);
}

static int write_summary(Run *run) {
  AtomicFile a;
  if (atomic_open(&a, run->path_summary) != 0) return -1;
  FILE *f = a.f;
  const Config *cfg = run->cfg;
  fprintf(f, "{\n  \"objective\": \"%s\",\n  \"backbone\": \"%s\",\n", run->layout.def->name,
          cfg->model.spec.type);
  fprintf(f, "  \"steps\": %d,\n  \"epochs\": %.4f,\n  \"batch_size\": %d,\n  \"replicas\": %d,\n",
          run->steps_done, (double)run->steps_done / run->layout.steps_per_epoch,
          run->layout.global_batch, run->layout.world);
  if (isfinite(run->final_loss))
    fprintf(f, "  \"final_loss\": %.9g,\n", run->final_loss);
  else
    fprintf(f, "  \"final_loss\": null,\n");
  fprintf(f, "  \"images_per_s\": %.3f,\n  \"train_seconds\": %.3f,\n", run->images_per_s,
          run->train_seconds);
  fprintf(f, "  \"peak_rss_bytes\": %zu,\n  \"flops_total\": %.9g,\n", run->peak_rss,
          run->flops_total);
  if (run->opt->planned_peak_bytes)
    fprintf(f, "  \"planned_peak_bytes\": %zu,\n", run->opt->planned_peak_bytes);
  else
    fprintf(f, "  \"planned_peak_bytes\": null,\n");
  if (cfg->train.budget[0]) {
    // How much of the budget the run spent: training seconds, FLOPs or epochs over what was given.
    const Budget *b = &run->budget;
    const double spent = b->kind == BUDGET_SECONDS ? run->train_seconds
                         : b->kind == BUDGET_FLOPS
                             ? run->flops_total
                             : (double)run->steps_done / run->layout.steps_per_epoch;
    fprintf(f, "  \"budget\": \"%s\",\n", cfg->train.budget);
    if (b->amount > 0) fprintf(f, "  \"budget_used\": %.4f,\n", spent / b->amount);
  }
  const KnnResult *last = &run->last_eval;
  if (run->evaluated && isfinite(last->top1))
    fprintf(f, "  \"knn_top1\": %.6f,\n  \"knn_top1_k20\": %.6f,\n", last->top1, last->top1_k20);
  else
    fprintf(f, "  \"knn_top1\": null,\n");
  if (run->evaluated && isfinite(last->linear_top1))
    fprintf(f, "  \"linear_top1\": %.6f,\n", last->linear_top1);
  // The label-free quality of the last evaluation (none with --no-knn).
  if (run->evaluated) {
    const EmbeddingQuality *q = &last->quality;
    const double v[3] = {q->rankme, q->embedding_std, q->embedding_std_reference};
    static const char *const keys[3] = {"rankme", "embedding_std", "embedding_std_reference"};
    for (int i = 0; i < 3; i++)
      if (isfinite(v[i]))
        fprintf(f, "  \"%s\": %.6f,\n", keys[i], v[i]);
      else
        fprintf(f, "  \"%s\": null,\n", keys[i]);
    fprintf(f, "  \"collapsed\": %s,\n", embedding_quality_collapsed(q) ? "true" : "false");
  }
  if (!run->no_knn && isfinite(run->knn_raw.linear_top1))
    fprintf(f, "  \"linear_top1_raw_pixels\": %.6f,\n", run->knn_raw.linear_top1);
  if (run->knn_start_done && isfinite(run->knn_start.top1))
    fprintf(f, "  \"knn_top1_untrained\": %.6f,\n", run->knn_start.top1);
  if (run->no_knn)
    fprintf(f, "  \"knn_top1_raw_pixels\": null\n}\n");
  else
    fprintf(f, "  \"knn_top1_raw_pixels\": %.6f\n}\n", run->knn_raw.top1);
  return atomic_commit(&a);
}

// Faults injected by tests of the failure paths. TALLY_INJECT_NAN_AT_STEP=S: the loss of step S
// becomes NaN; TALLY_INJECT_NAN_PARAM_AT_STEP=S: a parameter, after step S's update.
// TALLY_INJECT_FAIL=R:S: replica R fails at step S, as a killed process (MPI) or a replica that
// reports an error (local threads). TALLY_INJECT_KILL_IN_CHECKPOINT=S: the process is killed
// (SIGKILL) half way through writing the checkpoint after S steps.
// TALLY_INJECT_SLOW_STEPS=S:MS: every step from S on takes MS milliseconds longer (a machine
// that slows down after a time budget's steps were timed).
// TALLY_INJECT_COLLAPSE_AT_STEP=S: the backbone's parameters and statistics become 0 after step
// S's update, so every image has the same embedding (give the last step: training on it would
// not stay finite).
typedef struct {
  long nan_step;
  long nan_param_step;  // TALLY_INJECT_NAN_PARAM_AT_STEP=S: a weight becomes NaN after step S's
                        // update
  long collapse_step;
  int fail_rank;
  long fail_step;
  long kill_in_checkpoint;
  long slow_from_step, slow_ms;
} Faults;

static Faults faults_from_env(void) {
  Faults f = {-1, -1, -1, -1, -1, -1, -1, 0};
  const char *slow = getenv("TALLY_INJECT_SLOW_STEPS");
  if (slow && sscanf(slow, "%ld:%ld", &f.slow_from_step, &f.slow_ms) != 2) f.slow_from_step = -1;
  const char *nan_param = getenv("TALLY_INJECT_NAN_PARAM_AT_STEP");
  if (nan_param) f.nan_param_step = strtol(nan_param, NULL, 10);
  const char *collapse = getenv("TALLY_INJECT_COLLAPSE_AT_STEP");
  if (collapse) f.collapse_step = strtol(collapse, NULL, 10);
  const char *kill_at = getenv("TALLY_INJECT_KILL_IN_CHECKPOINT");
  if (kill_at) f.kill_in_checkpoint = strtol(kill_at, NULL, 10);
  const char *nan = getenv("TALLY_INJECT_NAN_AT_STEP");
  if (nan) f.nan_step = strtol(nan, NULL, 10);
  const char *fail = getenv("TALLY_INJECT_FAIL");
  if (fail && sscanf(fail, "%d:%ld", &f.fail_rank, &f.fail_step) != 2) f.fail_rank = -1;
  return f;
}

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
  int last_log_step;
} ReplicaState;

// What a checkpoint holds of this replica, as tensors pointing at its live state. The
// augmentation and mask streams need nothing here: they are keyed by (seed, step, image), so
// the step alone puts them where they were.
static void replica_state(ReplicaState *r, StFile *s, int64_t *steps_done) {
  st_add_paramset(s, "params.", &r->rep.ps);
  optim_state(r->rep.optim, s);
  if (r->run->layout.def->state) r->run->layout.def->state(r->rep.obj, s);
  st_add(s, "train.step", ST_I64, 0, NULL, steps_done);
}

// Rank 0: writes the checkpoint after `steps_done` steps (atomically: the last good one stays
// until the new one is whole).
static int save_checkpoint(ReplicaState *r, long steps_done) {
  Run *run = r->run;
  StFile s = {0};
  int64_t step = steps_done, channels = run->train.c;
  replica_state(r, &s, &step);
  // The input normalization the encoder was trained with, for export, embed and eval.
  st_add(&s, "data.mean", ST_F32, 1, &channels, run->aug.mean);
  st_add(&s, "data.std", ST_F32, 1, &channels, run->aug.std);
  char text[32];
  st_set_meta(&s, "format", CHECKPOINT_FORMAT);
  st_set_meta(&s, "objective", run->layout.def->name);
  snprintf(text, sizeof text, "%ld", steps_done);
  st_set_meta(&s, "step", text);
  // 0 while a budget's probe has not fixed the length: a resumed run then times its own steps.
  snprintf(text, sizeof text, "%d", run->length_frozen ? run->layout.total_steps : 0);
  st_set_meta(&s, "total_steps", text);
  st_set_meta(&s, "config", run->config_text);
  st_set_meta(&s, "model", run->model_text);
  // Train options that are not configuration but that a resumed run should keep.
  st_set_meta(&s, "no_knn", run->opt->no_knn ? "1" : "0");
  snprintf(text, sizeof text, "%.17g", run->flops_total);
  st_set_meta(&s, "flops_total", text);
  snprintf(text, sizeof text, "%.3f", run->train_seconds);
  st_set_meta(&s, "train_seconds", text);
  snprintf(text, sizeof text, "%.9g", run->final_loss);
  st_set_meta(&s, "loss", text);
  snprintf(text, sizeof text, "%ld", run->ledger_last_step);
  st_set_meta(&s, "ledger_last_step", text);
  snprintf(text, sizeof text, "%lu", run->ledger_last_crc);
  st_set_meta(&s, "ledger_last_crc", text);
  if (steps_done == r->faults.kill_in_checkpoint) {
    AtomicFile a;
    if (atomic_open(&a, run->path_ckpt) == 0) fwrite(run->config_text, 1, 100, a.f), fflush(a.f);
    raise(SIGKILL);
  }
  int rc = st_write(&s, run->path_ckpt);
  st_free(&s);
  return rc;
}

// The training data a resumed run reads must be the data its checkpoint trained on: the
// checkpoint keeps that data's per-channel mean and std, which any change of the images (another
// folder, a data.limit) moves. Float sums of the same bytes in the same order are the same bits.
static int check_same_data(const Run *run, const StFile *have, const char *path) {
  const StTensor *mean = st_find(have, "data.mean"), *std = st_find(have, "data.std");
  const int c = run->train.c;
  if (!mean || !std || mean->bytes != sizeof(float) * c || std->bytes != sizeof(float) * c)
    return tl_fail("%s: holds no normalization of %d channels (data.mean, data.std)", path, c);
  float m[3], s[3];
  memcpy(m, mean->data, sizeof(float) * c);
  memcpy(s, std->data, sizeof(float) * c);
  for (int k = 0; k < c; k++)
    if (m[k] != run->aug.mean[k] || s[k] != run->aug.std[k])
      return tl_fail(
          "%s: was trained on other data: channel %d's mean and std were %.6g and %.6g, %s "
          "gives %.6g and %.6g. Resume with the data it trained on, or start a new run",
          path, k, m[k], s[k], run->cfg->data.train, run->aug.mean[k], run->aug.std[k]);
  return 0;
}

// Puts a freshly built replica where the checkpoint left its run.
static int restore_checkpoint(ReplicaState *r, const char *path) {
  StFile have, want = {0};
  if (checkpoint_read(&have, path) != 0) return -1;
  int64_t step = -1;
  replica_state(r, &want, &step);
  int rc = checkpoint_restore(&want, &have, path);
  if (rc == 0 && step != r->run->start_step)
    rc = tl_fail("%s: holds step %ld, expected %d", path, (long)step, r->run->start_step);
  if (rc == 0) rc = check_same_data(r->run, &have, path);
  st_free(&want);
  st_free(&have);
  return rc;
}

// --init: the online parameters from a safetensors file (a Tally checkpoint or an export with
// PyTorch names). The backbone's must all be there; the head's are taken when present.
static int init_from_file(ReplicaState *r, const char *path) {
  StFile f;
  if (st_read(&f, path, 0) != 0) return -1;
  const Config *cfg = r->cfg;
  size_t backbone_floats =
      backbone_param_count(&cfg->model.spec, cfg->data.image_size, cfg->data.channels);
  int rc = 0, taken = 0;
  for (int i = 0; rc == 0 && i < r->rep.ps.n_entries; i++) {
    const ParamEntry *e = &r->rep.ps.entries[i];
    int found =
        weights_find(&f, e, &cfg->model.spec, cfg->data.channels, r->rep.ps.data + e->offset, path);
    if (found < 0)
      rc = -1;
    else if (!found && e->offset < backbone_floats)
      rc = tl_fail("%s: has no tensor for %s (PyTorch name %s)", path, e->name,
                   torch_tensor_for(e, &cfg->model.spec, cfg->data.channels).name);
    taken += found > 0;
  }
  st_free(&f);
  if (rc != 0) return -1;
  if (r->run->layout.def->params_loaded) r->run->layout.def->params_loaded(r->rep.obj);
  if (r->rank == 0 && !r->run->quiet_rank)
    printf("initialized %d of %d parameter tensors from %s\n", taken, r->rep.ps.n_entries, path);
  return 0;
}

// Rank 0's ledger files: new, or appended to after a resume (ledger_truncate_for_resume kept
// only the steps the checkpoint holds).
static int open_ledger(ReplicaState *r) {
  Run *run = r->run;
  r->jsonl = regular_fopen(run->path_jsonl, "a");
  r->csv = regular_fopen(run->path_csv, "a");
  if (!r->jsonl || !r->csv) return -1;
  if (run->start_step == 0) ledger_write_csv_header(r->csv, run->layout.def->ledger_fields);
  return 0;
}

// Rank 0's monitor: with labels, the raw-pixel baseline; the untrained encoder when asked.
static int open_monitor(ReplicaState *r) {
  Run *run = r->run;
  r->use_monitor = !run->opt->no_knn;
  if (!r->use_monitor) return 0;
  const MonitorSettings set = replica_monitor_settings(r->cfg);
  knn_monitor_init(&r->mon, &set, run->bank, run->no_knn ? NULL : &run->test, &run->aug,
                   r->rep.ps.data);
  r->mon.cancel = &stop_signal;
  if (r->mon.labeled) {
    if (!run->opt->quiet) {
      printf("kNN monitor: raw-pixel baseline on %d training and %d test images...\n",
             r->mon.n_train, r->mon.n_test);
      fflush(stdout);
    }
    run->knn_raw = knn_monitor_raw_pixels(&r->mon);
    if (run->knn_raw.failed) return tl_fail("kNN monitor: %s", tl_last_error());
    print_eval("raw pixels (baseline):", run->knn_raw);
    if (record_eval(run, "raw_pixels", 0, run->knn_raw) != 0) return -1;
  }
  if (run->opt->knn_at_start && run->start_step == 0) {
    if (!run->opt->quiet) printf("monitor: encoding with the untrained encoder...\n");
    run->knn_start = knn_monitor_run(&r->mon);
    if (run->knn_start.failed) return tl_fail("monitor: %s", tl_last_error());
    run->knn_start_done = 1;
    print_eval("untrained encoder:", run->knn_start);
    warn_at_collapse(run, 0, &run->knn_start.quality);
    return record_eval(run, "encoder", 0, run->knn_start);
  }
  return 0;
}

// Builds the replica's model, optimizer and loader (and restores them from a checkpoint when
// resuming); rank 0 also its monitor and ledger files. A failure aborts the collective group, so
// every replica stops.
static void replica_open(ReplicaState *r) {
  Run *run = r->run;
  const Config *cfg = r->cfg;
  const int *shards = run_layout_shard_sizes(&run->layout);
  ReplicaSpec spec = {cfg, &run->layout,  r->rank,     run->layout.total_steps, run->opt->out_dir,
                      0,   run->aug.mean, run->aug.std};
  int ok = replica_build(&r->rep, &spec, r->comm) == 0;
  // Every replica reads the checkpoint itself (under MPI the run folder must be readable on
  // every host, like the data).
  if (ok && run->opt->resume_path) ok = restore_checkpoint(r, run->opt->resume_path) == 0;
  if (ok && !run->opt->resume_path && run->opt->init_path)
    ok = init_from_file(r, run->opt->init_path) == 0;
  if (ok)
    ok = loader_init(&r->loader, &run->train, &run->views, run->layout.global_batch,
                     cfg->train.seed, r->rank, r->world, shards, run->start_step) == 0;
  r->loader_ok = ok;
  if (ok && r->rank == 0) ok = open_monitor(r) == 0 && open_ledger(r) == 0;
  if (!ok) comm_abort(r->comm, tl_last_error());
}

// Load, encode, compare, backward, average, update. Returns 0 to go on, 1 to stop (a failure or
// a non-finite loss; the reason is recorded).
static int train_step(ReplicaState *r, int step, float lr, LedgerRecord *rec, double *loss,
                      const Batch **batch_out, StepTimes *t) {
  Run *run = r->run;
  if (r->rank == r->faults.fail_rank && step == r->faults.fail_step) {
    if (strcmp(comm_backend(r->comm), "mpi") == 0) _exit(9);
    comm_abort(r->comm, "replica failed (injected fault)");
    return 1;
  }
  t->start = now_ms();
  const Batch *batch = loader_next(&r->loader, &rec->data_ms);
  if (!batch) {
    comm_abort(r->comm, tl_last_error());
    return 1;
  }
  *batch_out = batch;
  *loss = replica_forward_backward(&r->rep, batch, rec);
  if (step == r->faults.nan_step) *loss = NAN;
  if (r->faults.slow_from_step >= 0 && step >= r->faults.slow_from_step)
    nanosleep(&(struct timespec){r->faults.slow_ms / 1000, r->faults.slow_ms % 1000 * 1000000L},
              NULL);
  if (comm_failed(r->comm)) return 1;
  // The loss is global, so every replica sees the same value and stops at the same step.
  if (!isfinite(*loss)) {
    if (r->rank == 0) {
      if (access(run->path_ckpt, F_OK) == 0)
        fprintf(stderr,
                "tally: step %d: loss is %g; stopping. The last good checkpoint (%s) is kept.\n",
                step, *loss, run->path_ckpt);
      else
        fprintf(stderr,
                "tally: step %d: loss is %g; stopping. No checkpoint was written before it; "
                "lower optim.lr or start again.\n",
                step, *loss);
      run->exit_code = 3;
    }
    return 1;
  }
  t->computed = now_ms();
  replica_update(&r->rep, batch, lr, rec, t);
  // A finite loss does not prove finite weights (an overflow in an update, BatchNorm statistics
  // gone to infinity): a non-finite parameter stops the run before a checkpoint can keep it.
  // Every replica holds the same parameters, so every replica stops at the same step.
  if (step == r->faults.nan_param_step) r->rep.ps.data[r->rep.ps.count / 2] = NAN;
  if (step == r->faults.collapse_step)
    memset(r->rep.ps.data, 0,
           sizeof(float) * backbone_param_count(&r->cfg->model.spec, r->cfg->data.image_size,
                                                r->cfg->data.channels));
  const ParamEntry *bad = paramset_first_nonfinite(&r->rep.ps);
  if (bad) {
    if (r->rank == 0) {
      fprintf(stderr, "tally: step %d: parameter %s became non-finite; stopping. %s\n", step,
              bad->name,
              access(run->path_ckpt, F_OK) == 0 ? "The last good checkpoint is kept."
                                                : "No checkpoint was written before it.");
      run->exit_code = 3;
    }
    return 1;
  }
  int differs =
      replica_check(&r->rep, step, r->length_frozen && step + 1 == run->layout.total_steps);
  if (differs >= 0) {
    char why[160];
    snprintf(why, sizeof why, "step %d: replica %d's parameters differ from replica 0's; stopping",
             step, differs);
    comm_abort(r->comm, why);
    return 1;
  }
  r->images_done += run->layout.global_batch;
  return 0;
}

// The trainer's part of the ledger record: identity, memory, FLOPs, communication and time.
static void account_step(ReplicaState *r, int step, float lr, double loss, const Batch *batch,
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
    ledger_write_csv(r->csv, rec);
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
static void print_progress(ReplicaState *r, int step, const LedgerRecord *rec) {
  Run *run = r->run;
  int last = r->length_frozen && step + 1 == run->layout.total_steps;
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
    format_duration((run->layout.total_steps - step - 1) * run_per_step_ms / 1e3, eta, sizeof eta);
  } else {
    snprintf(total, sizeof total, "?");
    format_duration(fmax(run->budget.amount - rec->train_seconds, 0), eta, sizeof eta);
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

// Rank 0's view of the stop signal, shared with every replica so all stop after the same step.
// Its bytes fall outside the step's ledger record (counted after it, reset before the next).
static int agreed_stop_signal(ReplicaState *r) {
  int sig = r->rank == 0 ? (int)stop_signal : 0;
  if (r->world > 1) comm_broadcast(r->comm, &sig, sizeof sig, 0);
  return sig;
}

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
static void freeze_length(ReplicaState *r, int step, const LedgerRecord *rec) {
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

static void check_length(ReplicaState *r, int step, const LedgerRecord *rec) {
  Run *run = r->run;
  if (run->budget.kind != BUDGET_SECONDS || !r->length_frozen || r->length_checks == LENGTH_CHECKS)
    return;
  const int done = step + 1;
  // Every replica knows the same total and the same checks done, so all reach this together.
  if (done < LENGTH_CHECK_AT[r->length_checks] * run->layout.total_steps ||
      done - r->pace_start_step < LENGTH_CHECK_MIN_STEPS || done >= run->layout.total_steps)
    return;
  r->length_checks++;
  int total = 0;
  const int before = run->layout.total_steps;
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
  r->rep.obj->env.total_steps = total;
  if (r->rank == 0 && total != before && !run->quiet_rank && !run->opt->quiet) {
    printf("budget %s: %d steps (was %d; %.3f s a step since step %d)\n", r->cfg->train.budget,
           total, before,
           (rec->train_seconds - r->pace_start_seconds) / (done - r->pace_start_step),
           r->pace_start_step);
    fflush(stdout);
  }
}

// After each step: a checkpoint when due (every train.checkpoint_every steps, at an epoch's end,
// at an evaluation, at the run's end, and when stopping early), then the monitor when due (rank
// 0: config_eval_period_steps, and the run's end); every replica waits for it. Every rank
// decides from the step alone, so all of them wait at the same steps. Returns 0 to go on, 1 to
// stop.
static int end_of_step(ReplicaState *r, int step) {
  Run *run = r->run;
  const int done = step + 1;
  int epoch_end = done % run->layout.steps_per_epoch == 0;
  int last = r->length_frozen && done == run->layout.total_steps;
  int sig = agreed_stop_signal(r);
  int stop_at = run->opt->stop_at > 0 && done == run->opt->stop_at && !last;
  int every = r->cfg->train.checkpoint_every;
  // A checkpoint at each evaluation: a signal that cuts the evaluation short stops the run at
  // this step with its state whole.
  int eval_due = done % config_eval_period_steps(r->cfg, run->layout.steps_per_epoch) == 0;
  int due = epoch_end || eval_due || last || sig || stop_at || (every > 0 && done % every == 0);
  int eval_cancelled = 0;
  if (r->rank == 0 && due) {
    double seconds = (now_ms() - r->train_start_ms) / 1e3;
    run->train_seconds = run->opt->spent_seconds + seconds;
    run->images_per_s = r->images_done / seconds;
    run->steps_done = done;
    if (save_checkpoint(r, done) != 0) {
      comm_abort(r->comm, tl_last_error());
      return 1;
    }
    if (!sig && r->use_monitor && (last || eval_due)) {
      double te = now_ms();
      int rc = evaluate(run, &r->mon, done);
      if (rc < 0) comm_abort(r->comm, tl_last_error());
      eval_cancelled = rc > 0;
      // Evaluation time is not training time: neither the run's rate nor the next progress
      // line's recent rate counts it.
      const double spent = now_ms() - te;
      r->train_start_ms += spent;
      r->last_log_ms += spent;
    }
  }
  if (due) comm_barrier(r->comm);
  if (comm_failed(r->comm)) return 1;
  // A signal during the checkpoint or the evaluation stops the run now, its checkpoint whole; at
  // the last step only if it cut the evaluation short (--resume then evaluates and summarizes).
  if (due && !sig) {
    int late = agreed_stop_signal(r);
    if (late && (!last || eval_cancelled)) sig = late;
  }
  if (!sig && !stop_at) return 0;
  run->stopped_early = 1;
  if (r->rank == 0) {
    run->exit_code = sig ? 128 + sig : 0;
    if (!run->quiet_rank)
      printf("%s at step %d of %d; checkpoint %s\ncontinue with: tally train --resume %s\n",
             sig ? "interrupted" : "stopped as asked", done, run->layout.total_steps,
             run->path_ckpt, run->opt->out_dir);
    fflush(stdout);
  }
  return 1;
}

// A resumed run whose checkpoint holds its last step but that has no summary (its end was
// interrupted, e.g. during the final evaluation): no step to take; rank 0 evaluates and the
// summary gives the run's own figures from the checkpoint.
static void finish_without_steps(ReplicaState *r) {
  Run *run = r->run;
  if (r->rank != 0 || comm_failed(r->comm)) return;
  run->steps_done = run->start_step;
  run->train_seconds = run->opt->spent_seconds;
  run->images_per_s = run->train_seconds > 0
                          ? (double)run->start_step * run->layout.global_batch / run->train_seconds
                          : 0;
  run->final_loss = run->opt->last_loss;
  if (r->use_monitor && evaluate(run, &r->mon, run->start_step) != 0)
    comm_abort(r->comm, tl_last_error());
}

static void replica_close(ReplicaState *r) {
  Run *run = r->run;
  free(r->probe_ms);  // a run that stopped while its budget's probe ran
  if (r->rank == 0) {
    int ledger_ok = (!r->jsonl || fclose(r->jsonl) == 0) & (!r->csv || fclose(r->csv) == 0);
    if (!ledger_ok && run->exit_code == 0 && !comm_failed(r->comm)) {
      fprintf(stderr, "tally: %s: ledger not written whole: %s\n", run->path_jsonl,
              strerror(errno));
      run->exit_code = 1;
    }
    if (r->use_monitor) knn_monitor_destroy(&r->mon);
    run->peak_rss = tl_peak_rss_bytes();
    if (comm_failed(r->comm) && run->exit_code == 0) {
      fprintf(stderr, "tally: %s\n", comm_failure(r->comm));
      run->exit_code = 1;
    }
  }
  if (r->loader_ok) loader_destroy(&r->loader);
  replica_destroy(&r->rep);
}

// One replica's whole run, on its own thread (rank 0 on the caller's) or, under mpi, its process.
static void replica_main(void *shared, int rank, Comm *comm) {
  Run *run = shared;
  ReplicaState *r = calloc(1, sizeof *r);
  if (!r) TL_DIE("out of memory");
  *r = (ReplicaState){.run = run,
                      .cfg = run->cfg,
                      .rank = rank,
                      .world = run->layout.world,
                      .comm = comm,
                      .faults = faults_from_env()};
  run_split_threads(r->world);

  replica_open(r);
  r->length_frozen = run->length_frozen;
  // A resumed run's pace is measured from its own start (set again if the length is frozen later).
  r->pace_start_seconds = run->opt->spent_seconds;
  r->pace_start_step = run->start_step;
  if (!r->length_frozen) r->rep.obj->env.total_steps = INT_MAX;
  comm_barrier(r->comm);
  if (run->finishing) finish_without_steps(r);
  r->train_start_ms = r->last_log_ms = now_ms();
  for (int step = run->start_step;
       (step < run->layout.total_steps || !r->length_frozen) && !comm_failed(r->comm); step++) {
    const Config *cfg = r->cfg;
    float lr =
        lr_at_step(config_lr(cfg), step, cfg->optim.warmup_steps,
                   r->length_frozen ? run->layout.total_steps : INT_MAX, cfg->optim.schedule);
    LedgerRecord rec = {0};
    StepTimes t;
    const Batch *batch = NULL;
    double loss;
    if (train_step(r, step, lr, &rec, &loss, &batch, &t)) break;
    if (r->rank == 0) account_step(r, step, lr, loss, batch, &t, &rec);
    freeze_length(r, step, &rec);
    check_length(r, step, &rec);
    if (r->rank == 0) print_progress(r, step, &rec);
    if (end_of_step(r, step)) break;
  }
  replica_close(r);
  free(r);
}

// mkdir -p. The reason given is the first folder's that could not be made (a read-only file
// system, not the "No such file" its missing child then gets).
static int make_dirs(const char *dir) {
  // Room for the longest name written inside it, a temporary checkpoint's.
  char path[4096];
  if (strlen(dir) + 64 > sizeof path)
    return tl_fail("%.64s...: a run folder's path of %zu bytes is too long (at most %zu)", dir,
                   strlen(dir), sizeof path - 64);
  snprintf(path, sizeof path, "%s", dir);
  // Every name checked before any folder is made: a long one half way would leave the folders
  // before it behind.
  for (const char *c = path; *c;) {
    size_t n = strcspn(c, "/");
    if (n > NAME_MAX)
      return tl_fail("%s: a folder name of %zu bytes is longer than the file system's %d", dir, n,
                     NAME_MAX);
    c += n + (c[n] == '/');
  }
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p) continue;
    char c = *p;
    *p = 0;
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return tl_fail("%s: cannot create run folder%s%s: %s", dir, c ? " " : "", c ? path : "",
                     strerror(errno));
    if (!c) return 0;
    *p = c;
  }
}

static int exists(const char *dir, const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

// The temporary files a killed writer left of the run's state files (atomic_file.h names them
// FILE.tmp.PID.N): with the folder's lock held, no live writer owns one.
static void remove_stale_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));)
    for (int i = 0; RUN_STATE_FILES[i]; i++) {
      size_t n = strlen(RUN_STATE_FILES[i]);
      if (strncmp(e->d_name, RUN_STATE_FILES[i], n) == 0 &&
          strncmp(e->d_name + n, ".tmp.", 5) == 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
      }
    }
  closedir(d);
}

// Creates and locks the run folder. A folder that holds a run is refused unless the run is
// being resumed or --overwrite says to replace it.
static int make_run_dir(const char *dir, Run *run) {
  if (make_dirs(dir) != 0 || dir_lock(dir, ".lock", "run") != 0) return -1;
  remove_stale_temporaries(dir);
  int resuming = run->opt->resume_path != NULL;
  if (!resuming && !run->opt->overwrite &&
      (exists(dir, CHECKPOINT_FILE) || exists(dir, "ledger.jsonl") || exists(dir, "summary.json")))
    return tl_fail(
        "%s: holds a run already; continue it with --resume %s, or replace it with "
        "--overwrite",
        dir, dir);
  snprintf(run->path_jsonl, sizeof run->path_jsonl, "%s/ledger.jsonl", dir);
  snprintf(run->path_csv, sizeof run->path_csv, "%s/ledger.csv", dir);
  snprintf(run->path_ckpt, sizeof run->path_ckpt, "%s/%s", dir, CHECKPOINT_FILE);
  snprintf(run->path_summary, sizeof run->path_summary, "%s/summary.json", dir);
  snprintf(run->path_eval, sizeof run->path_eval, "%s/eval.jsonl", dir);
  // A previous summary would look like this run's result if this run fails; a new run starts
  // from none of the old run's files.
  const char *const remove_fresh[] = {run->path_summary, run->path_eval, run->path_ckpt,
                                      run->path_jsonl, run->path_csv};
  for (int i = 0; i < (resuming ? 1 : 5); i++)
    if (unlink(remove_fresh[i]) != 0 && errno != ENOENT)
      return tl_fail("%s: cannot remove: %s", remove_fresh[i], strerror(errno));
  if (resuming && ledger_truncate_for_resume(dir, run->start_step, run->ledger_last_step,
                                             run->ledger_last_crc) != 0)
    return -1;
  char path[4200];
  snprintf(path, sizeof path, "%s/config.ini", dir);
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  fputs(run->config_text, a.f);
  return atomic_commit(&a);
}

// The configuration as INI texts: config.ini's content and the model section, both kept in
// every checkpoint.
static void config_texts(Run *run) {
  size_t n;
  FILE *f = open_memstream(&run->config_text, &n);
  if (!f) TL_DIE("out of memory");
  config_write(run->cfg, f);
  fclose(f);
  f = open_memstream(&run->model_text, &n);
  if (!f) TL_DIE("out of memory");
  config_write_model(run->cfg, f);
  fclose(f);
}

// CRC-32 of the training images: their pixels when in memory; streamed, each file's name under
// the root and its size in pixels (a rank reads its own copy, which must list the same images).
static unsigned long data_crc32(const Dataset *d, const char *root) {
  uLong crc = crc32(0L, Z_NULL, 0);
  if (d->pixels) return crc32_z(crc, d->pixels, (size_t)d->n * d->h * d->w * d->c);
  const size_t root_len = strlen(root);
  for (int i = 0; i < d->n; i++) {
    const char *name = d->files[i];
    if (strncmp(name, root, root_len) == 0) name += root_len;
    crc = crc32_z(crc, (const Bytef *)name, strlen(name) + 1);
    const uint16_t size[2] = {d->source_h[i], d->source_w[i]};
    crc = crc32_z(crc, (const Bytef *)size, sizeof size);
  }
  return crc;
}

// What defines this rank's run, for ranks_agree: the objective, the resolved configuration and
// model, where it starts and how long it is, and the training data itself (its size and the
// CRC-32 of its pixels and labels: the same folder mounted at another path is the same data).
static int ranks_agree_on_run(Run *run, Comm *comm) {
  const Dataset *d = &run->train;
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f) TL_DIE("out of memory");
  // The objective, then the configuration: a difference is named by what the user chose.
  fprintf(f, "[run]\nobjective = %s\n", run->layout.def->name);
  fputs(run->config_text, f);
  fputs("[model file]\n", f);
  fputs(run->model_text, f);
  fprintf(f, "[run]\nstart_step = %d\n", run->start_step);
  fprintf(f, "total_steps = %d\nlength_fixed = %d\nstop_at = %ld\nno_knn = %d\n",
          run->length_frozen ? run->layout.total_steps : -1, run->length_frozen, run->opt->stop_at,
          run->no_knn);
  fprintf(f, "flops_spent = %.17g\n", run->flops_total);
  fprintf(f, "[training data]\nimages = %d\nimage = %dx%dx%d\nclasses = %d\n", d->n, d->h, d->w,
          d->c, d->n_classes);
  fprintf(f, "pixels_crc32 = %08lx\nlabels_crc32 = %08lx\n", data_crc32(d, run->cfg->data.train),
          crc32_z(crc32(0L, Z_NULL, 0), (const Bytef *)d->labels, sizeof(int) * (size_t)d->n));
  fclose(f);
  // Rank 0 alone reads the monitor's own set: the others' paths to it need not exist.
  static const char *const paths[] = {"data.train", "data.test", "model.file",
                                      "eval.train", "eval.test", NULL};
  int rc = ranks_agree(comm, text, paths);
  free(text);
  return rc == 0;
}

// The monitor's labeled sets: [eval] train (its memory bank and quality sample) and test when
// given, for labeled and unlabeled training data alike, read by rank 0 alone (the only one that
// evaluates); else [data] test beside the training set, when that is labeled. Unlabeled training
// data without a set of the monitor's own has nothing to vote with (run->no_knn): the monitor
// measures the label-free quality only. -1 with tl_last_error().
static int load_monitor_data(Run *run) {
  const Config *cfg = run->cfg;
  run->bank = &run->train;
  if (cfg->eval.train[0]) {
    run->bank = &run->eval_train;
    if (run->quiet_rank) return 0;
    if (dataset_load_path(cfg, &run->eval_train, cfg->eval.train, 0) != 0 ||
        dataset_load_path(cfg, &run->test, cfg->eval.test, 0) != 0)
      return -1;
    const char *unlabeled = !run->eval_train.n_classes ? cfg->eval.train
                            : !run->test.n_classes     ? cfg->eval.test
                                                       : NULL;
    if (unlabeled)
      return tl_fail(
          "%s: no class subfolders; the monitor's own set ([eval] train, test) is "
          "there to be labeled",
          unlabeled);
    return dataset_align_test_labels(&run->eval_train, &run->test, cfg->eval.test);
  }
  if (strcmp(cfg->data.labels, "none") == 0) {
    if (!run->quiet_rank)
      printf(
          "kNN monitor off: data.labels = none; each evaluation measures the label-free quality "
          "(rankme, embedding_std) only (give the monitor a labeled set of its own with "
          "eval.train and eval.test, or score the encoder with `tally eval RUN --set "
          "eval.train=LABELED --set eval.test=LABELED`)\n");
    run->no_knn = 1;
    return 0;
  }
  if (!cfg->data.test[0])
    return tl_fail(
        "the kNN monitor scores the encoder on a labeled test set, and data.test is empty: give "
        "--set data.test=PATH (labeled as %s is), or --no-knn",
        cfg->data.train);
  const int ch = cfg->data.channels;
  if ((strcmp(cfg->data.format, "idx") == 0
           ? dataset_load_idx(&run->test, cfg->data.test, ch, cfg->data.test_limit)
           : dataset_load_imagefolder(&run->test, cfg->data.test, cfg->data.image_size, ch,
                                      cfg->data.test_limit, cfg->data.stream)) != 0)
    return -1;
  return dataset_align_test_labels(&run->train, &run->test, cfg->data.test);
}

// What the steps of train_run return to go on; any other value is the exit code to stop with.
enum { GO_ON = -1 };

// Says what went wrong (tl_last_error) and gives the exit code of a failure.
static int failed(void) {
  fprintf(stderr, "tally: %s\n", tl_last_error());
  return 1;
}

// The objective, the replicas (the rank count under mpi, whose communicator *mpi receives) and
// the batch's split over them.
static int open_layout(Run *run, Comm **mpi) {
  const Config *cfg = run->cfg;
  const TrainOptions *opt = run->opt;
  const ObjectiveDef *def = run_objective(opt->objective);
  if (!def) {
    failed();
    return 2;  // a usage error, as an unknown option is
  }
  if (!opt->no_knn && config_validate_eval_set(cfg) != 0) return failed();
  int world = cfg->parallel.replicas;
  if (strcmp(cfg->parallel.backend, "mpi") == 0) {
    *mpi = comm_mpi_create(NULL, NULL);
    if (!*mpi) return failed();
    world = comm_size(*mpi);
    run->quiet_rank = comm_rank(*mpi) != 0;
    comm_set_timeout(*mpi, cfg->parallel.timeout);
  }
  run->no_knn = opt->no_knn;
  return run_layout_init(&run->layout, cfg, def, world) == 0 ? GO_ON : failed();
}

// The training set (its pixels, or with data.stream its file list) as the recipe describes it,
// and the monitor's sets; the run's steps follow from its size. *t0: when reading began.
static int load_training_data(Run *run, double *t0) {
  const Config *cfg = run->cfg;
  *t0 = now_ms();
  const int ch = cfg->data.channels;
  const int idx = strcmp(cfg->data.format, "idx") == 0;
  if (!idx && !run->quiet_rank) {
    printf("reading %s: %s\n", cfg->data.train,
           cfg->data.stream ? "the file list and each image's header (the pixels are decoded as "
                              "batches need them, data.stream = 1)"
                            : "decoding every image into memory (data.stream = 0)");
    fflush(stdout);
  }
  int loaded = idx ? dataset_load_idx(&run->train, cfg->data.train, ch, cfg->data.limit) == 0
                   : dataset_load_imagefolder(&run->train, cfg->data.train, cfg->data.image_size,
                                              ch, cfg->data.limit, cfg->data.stream) == 0;
  if (loaded && strcmp(cfg->data.labels, "none") != 0 && !run->train.n_classes) {
    fprintf(stderr,
            "tally: %s: no class subfolders; to train on unlabeled images set data.labels = "
            "none\n",
            cfg->data.train);
    return 1;
  }
  if (loaded && !run->opt->no_knn) loaded = load_monitor_data(run) == 0;
  if (!loaded || run_check_image_size(cfg, cfg->data.train, run->train.h, run->train.w) != 0 ||
      run_layout_set_images(&run->layout, cfg, run->train.n) != 0)
    return failed();
  return GO_ON;
}

// Where the run starts and how long it is: a resumed run's step, a budget's length (fixed by its
// first steps unless the checkpoint fixed it), --stop-at; and the shards of the batch.
static int settle_length(Run *run) {
  const TrainOptions *opt = run->opt;
  RunLayout *L = &run->layout;
  run->start_step = (int)opt->start_step;
  config_budget(run->cfg, &run->budget);  // validated with the configuration
  run->length_frozen = run->budget.kind != BUDGET_SECONDS && run->budget.kind != BUDGET_FLOPS;
  if (opt->frozen_total_steps > 0) {
    L->total_steps = (int)opt->frozen_total_steps;
    run->length_frozen = 1;
  }
  run->flops_total = opt->spent_flops;
  run->ledger_last_step = opt->resume_path ? opt->ledger_last_step : -1;
  run->ledger_last_crc = opt->ledger_last_crc;
  if (run->length_frozen && run->start_step > L->total_steps) {
    fprintf(stderr,
            "tally: the checkpoint is at step %d, past the run's %d steps; give a larger "
            "--steps to go on\n",
            run->start_step, L->total_steps);
    return 1;
  }
  // A finished run is left as it is; one whose end was cut short gets its evaluation and summary.
  if (opt->resume_path && run->length_frozen && run->start_step == L->total_steps) {
    if (exists(opt->out_dir, "summary.json")) {
      if (!run->quiet_rank)
        printf(
            "%s: finished already (%d of %d steps; its summary.json); nothing to do. --steps N "
            "continues it past %d\n",
            opt->out_dir, run->start_step, L->total_steps, L->total_steps);
      return 0;
    }
    run->finishing = 1;
  }
  if (opt->stop_at > 0 && run->length_frozen && opt->stop_at > L->total_steps) {
    fprintf(stderr, "tally: --stop-at %ld: the run has %d steps\n", opt->stop_at, L->total_steps);
    return 2;
  }
  if (opt->stop_at > 0 && opt->stop_at <= run->start_step) {
    fprintf(stderr, "tally: --stop-at %ld: the run is already at step %d\n", opt->stop_at,
            run->start_step);
    return 2;
  }
  return run_layout_set_shards(L, run->cfg) == 0 ? GO_ON : failed();
}

// The training set's normalization (every view group's, the monitor's and the checkpoint's) and
// the views it makes; the run's opening line, and its configuration as text. steps_text: the
// run's length as that line says it.
static int describe_run(Run *run, char *steps_text, size_t n) {
  const Config *cfg = run->cfg;
  const RunLayout *L = &run->layout;
  AugmentParams *a = &run->aug;
  a->out_size = cfg->data.image_size;
  if (dataset_channel_stats(&run->train, a->mean, a->std) != 0) return failed();
  run->views = replica_views(cfg, L->def, a->mean, a->std);
  // A budget not yet turned into steps says what it is; its first steps will fix the count.
  if (run->length_frozen)
    snprintf(steps_text, n, "%d", L->total_steps);
  else
    snprintf(steps_text, n, "budget %s of", cfg->train.budget);
  if (!run->quiet_rank)
    printf(
        "tally train: objective %s, backbone %s (%s), %d training images (%dx%dx%d), "
        "batch %d, %s steps (%d per epoch), %d replica%s\n",
        L->def->name, cfg->model.spec.type, cfg->model.file, run->train.n, run->train.h,
        run->train.w, run->train.c, L->global_batch, steps_text, L->steps_per_epoch, L->world,
        L->world == 1 ? "" : "s");
  config_texts(run);
  return GO_ON;
}

// Every rank agrees on the run before rank 0 creates (or takes over) the run folder.
static int open_run_folder(Run *run, Comm *mpi, double t0, const char *steps_text) {
  const Config *cfg = run->cfg;
  if (mpi && !ranks_agree_on_run(run, mpi)) {
    run->started = 1;  // stopped through the collectives already
    return 1;
  }
  if (run->quiet_rank) return GO_ON;
  const int streamed = strcmp(cfg->data.format, "idx") != 0 && cfg->data.stream;
  printf("data %s in %.1f s; run folder %s\n", streamed ? "listed" : "loaded",
         (now_ms() - t0) / 1e3, run->opt->out_dir);
  if (run->start_step > 0) printf("resuming at step %d of %s\n", run->start_step, steps_text);
  fflush(stdout);
  return make_run_dir(run->opt->out_dir, run) == 0 ? GO_ON : failed();
}

// The replicas train: one per process under mpi (this process's rank is its replica), else one
// thread each. Then rank 0 writes the summary of a finished run (an interrupted one has its
// checkpoint and ledger). Returns the run's exit code.
static int train_replicas(Run *run, Comm *mpi) {
  install_stop_handlers();
  run->started = 1;
  if (mpi)
    replica_main(run, comm_rank(mpi), mpi);
  else
    run_local_replicas(run->layout.world, replica_main, run);
  if (run->exit_code != 0 || run->quiet_rank || run->stopped_early) return run->exit_code;
  if (write_summary(run) != 0) return failed();
  printf(
      "done: %d steps in %.1f s (%.0f images/s), final loss %.4f, peak RSS %.0f MiB; "
      "summary in %s\n",
      run->steps_done, run->train_seconds, run->images_per_s, run->final_loss,
      run->peak_rss / 1048576.0, run->path_summary);
  return 0;
}

int train_run(const Config *cfg, const TrainOptions *opt) {
  Run *run = calloc(1, sizeof *run);
  if (!run) TL_DIE("out of memory");
  run->cfg = cfg;
  run->opt = opt;
  Comm *mpi = NULL;
  double t0 = 0;
  char steps_text[64];
  int rc = open_layout(run, &mpi);
  if (rc == GO_ON) rc = load_training_data(run, &t0);
  if (rc == GO_ON) rc = settle_length(run);
  if (rc == GO_ON) rc = describe_run(run, steps_text, sizeof steps_text);
  if (rc == GO_ON) rc = open_run_folder(run, mpi, t0, steps_text);
  if (rc == GO_ON) rc = train_replicas(run, mpi);
  // A rank that fails before training starts (its run folder, its data) must not leave the
  // others waiting in their first collective: stop them all.
  if (mpi && !run->started && rc != 0) comm_abort(mpi, "could not start (see the line above)");
  if (mpi) comm_destroy(mpi);
  dataset_free(&run->train);
  dataset_free(&run->test);
  dataset_free(&run->eval_train);
  free(run->config_text);
  free(run->model_text);
  free(run);
  return rc;
}
