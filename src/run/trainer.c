#include "run/trainer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/timer.h"
#include "run/run_state.h"

// The faults the TALLY_INJECT_* variables ask for (Faults, run_state.h); -1: none.
static Faults faults_from_env(void) {
  Faults f = {-1, -1, -1, -1, -1, -1, -1, 0, 0};
  const char *slow_eval = getenv("TALLY_INJECT_SLOW_EVAL");
  if (slow_eval) f.slow_eval_ms = strtol(slow_eval, NULL, 10);
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

// Builds the replica's model, optimizer and loader (and restores them from a checkpoint when
// resuming); rank 0 also its monitor and ledger files. A failure aborts the collective group, so
// every replica stops.
static void replica_open(ReplicaState *r) {
  Run *run = r->run;
  const Config *cfg = r->cfg;
  const ReplicaSpec spec = {.cfg = cfg,
                            .layout = &run->layout,
                            .rank = r->rank,
                            .total_steps = run->layout.total_steps,
                            .out_dir = run->opt->out_dir,
                            .input_mean = run->aug.mean,
                            .input_std = run->aug.std};
  int ok = replica_build(&r->rep, &spec, r->comm) == 0;
  // Every replica reads the checkpoint itself (under MPI the run folder must be readable on
  // every host, like the data).
  if (ok && run->opt->resume_path) ok = run_restore_checkpoint(r, run->opt->resume_path) == 0;
  if (ok && !run->opt->resume_path && run->opt->init_path)
    ok = run_init_from_file(r, run->opt->init_path) == 0;
  if (ok)
    ok =
        loader_init(&r->loader, &run->train, &run->views, run->layout.global_batch, cfg->train.seed,
                    r->rep.shard.offset, r->rep.shard.local, run->start_step) == 0;
  r->loader_ok = ok;
  if (ok && r->rank == 0) ok = run_open_monitor(r) == 0 && run_open_ledger(r) == 0;
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
  const int freeze = r->cfg->optim.backbone_freeze_steps;
  r->rep.optim->backbone_frozen = step < freeze;
  r->rep.optim->backbone_lr_scale = backbone_lr_scale_at(step, freeze, r->cfg->optim.warmup_steps);
  replica_update(&r->rep, batch, lr, rec, t);
  // A finite loss does not prove finite weights (an overflow in an update, BatchNorm statistics
  // gone to infinity): a non-finite parameter stops the run before a checkpoint can keep it.
  // Every replica holds the same parameters, so every replica stops at the same step.
  if (step == r->faults.nan_param_step) r->rep.ps.data[r->rep.ps.count / 2] = NAN;
  if (step == r->faults.collapse_step)
    memset(r->rep.ps.data, 0, sizeof(float) * r->rep.optim->backbone_floats);
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
  int differs = replica_check(&r->rep, step, r->length_frozen && step + 1 == r->total_steps);
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

// TALLY_INJECT_SLOW_EVAL (Faults).
static void slow_eval(const ReplicaState *r) {
  const long ms = r->faults.slow_eval_ms;
  if (ms > 0) nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
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
  int last = r->length_frozen && done == r->total_steps;
  int sig = run_agreed_stop_signal(r);
  int stop_at = run->opt->stop_at > 0 && done == run->opt->stop_at && !last;
  int every = r->cfg->train.checkpoint_every;
  // A checkpoint at each evaluation: a signal that cuts the evaluation short stops the run at
  // this step with its state whole.
  int eval_due = done % config_eval_period_steps(r->cfg, run->layout.steps_per_epoch) == 0;
  int due = epoch_end || eval_due || last || sig || stop_at || (every > 0 && done % every == 0);
  int eval_cancelled = 0;
  // The others wait while rank 0 checkpoints and evaluates: they hear from it meanwhile, and name
  // this if it stops answering.
  const int evaluates = !sig && !run->opt->no_knn && (last || eval_due);
  char phase[128];
  snprintf(phase, sizeof phase, "its checkpoint%s after step %d",
           evaluates ? " and the monitor's evaluation" : "", done);
  if (due) comm_solo_begin(r->comm, 0, phase);
  if (r->rank == 0 && due) {
    double seconds = (now_ms() - r->train_start_ms) / 1e3;
    run->train_seconds = run->opt->spent_seconds + seconds;
    run->images_per_s = r->images_done / seconds;
    run->steps_done = done;
    if (run_save_checkpoint(r, done) != 0) {
      comm_abort(r->comm, tl_last_error());
      return 1;
    }
    if (!sig && r->use_monitor && (last || eval_due)) {
      double te = now_ms();
      slow_eval(r);
      int rc = run_evaluate(run, &r->mon, done);
      if (rc < 0) comm_abort(r->comm, tl_last_error());
      eval_cancelled = rc > 0;
      // Evaluation time is not training time: neither the run's rate nor the next progress
      // line's recent rate counts it.
      const double spent = now_ms() - te;
      r->train_start_ms += spent;
      r->last_log_ms += spent;
    }
  }
  if (due) comm_solo_end(r->comm, 0);
  if (due) comm_barrier(r->comm);
  if (comm_failed(r->comm)) return 1;
  // A signal during the checkpoint or the evaluation stops the run now, its checkpoint whole; at
  // the last step only if it cut the evaluation short (--resume then evaluates and summarizes).
  if (due && !sig) {
    int late = run_agreed_stop_signal(r);
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
  if (r->use_monitor && run_evaluate(run, &r->mon, run->start_step) != 0)
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

  // Rank 0 opens its monitor alone (the raw-pixel baseline on a labeled folder takes a while).
  comm_solo_begin(comm, 0, "its monitor's start (the raw-pixel baseline)");
  replica_open(r);
  r->length_frozen = run->length_frozen;
  r->total_steps = run->layout.total_steps;
  // A resumed run's pace is measured from its own start (set again if the length is frozen later).
  r->pace_start_seconds = run->opt->spent_seconds;
  r->pace_start_step = run->start_step;
  if (!r->length_frozen) r->rep.obj->env.total_steps = INT_MAX;
  comm_solo_end(r->comm, 0);
  comm_barrier(r->comm);
  if (run->finishing) {
    comm_solo_begin(r->comm, 0, "the monitor's evaluation of the checkpoint's last step");
    finish_without_steps(r);
    comm_solo_end(r->comm, 0);
  }
  r->train_start_ms = r->last_log_ms = now_ms();
  for (int step = run->start_step;
       (step < r->total_steps || !r->length_frozen) && !comm_failed(r->comm); step++) {
    const Config *cfg = r->cfg;
    float lr = lr_at_step(config_lr(cfg), step, cfg->optim.warmup_steps,
                          r->length_frozen ? r->total_steps : INT_MAX, cfg->optim.schedule);
    LedgerRecord rec = {0};
    StepTimes t;
    const Batch *batch = NULL;
    double loss;
    if (train_step(r, step, lr, &rec, &loss, &batch, &t)) break;
    if (r->rank == 0) run_account_step(r, step, lr, loss, batch, &t, &rec);
    run_freeze_length(r, step, &rec);
    run_check_length(r, step, &rec);
    if (r->rank == 0) run_print_progress(r, step, &rec);
    if (end_of_step(r, step)) break;
  }
  replica_close(r);
  free(r);
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
                                              ch, cfg->data.limit, dataset_flags(cfg)) == 0;
  if (loaded && strcmp(cfg->data.labels, "none") != 0 && !run->train.n_classes) {
    fprintf(stderr,
            "tally: %s: no class subfolders; to train on unlabeled images set data.labels = "
            "none\n",
            cfg->data.train);
    return 1;
  }
  if (loaded && !run->opt->no_knn) loaded = run_load_monitor_data(run) == 0;
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
    if (run_folder_has(opt->out_dir, "summary.json")) {
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
        "batch %d, %s steps (%d per epoch), %d replica%s, %s\n",
        L->def->name, cfg->model.spec.type, cfg->model.file, run->train.n, run->train.h,
        run->train.w, run->train.c, L->global_batch, steps_text, L->steps_per_epoch, L->world,
        L->world == 1 ? "" : "s", cfg->train.precision);
  run_config_texts(run);
  return GO_ON;
}

// Every rank agrees on the run before rank 0 creates (or takes over) the run folder.
static int open_run_folder(Run *run, Comm *mpi, double t0, const char *steps_text) {
  const Config *cfg = run->cfg;
  if (mpi && !run_ranks_agree(run, mpi)) {
    run->started = 1;  // stopped through the collectives already
    return 1;
  }
  if (run->quiet_rank) return GO_ON;
  const int streamed = strcmp(cfg->data.format, "idx") != 0 && cfg->data.stream;
  printf("data %s in %.1f s; run folder %s\n", streamed ? "listed" : "loaded",
         (now_ms() - t0) / 1e3, run->opt->out_dir);
  if (run->start_step > 0) printf("resuming at step %d of %s\n", run->start_step, steps_text);
  const int threads = run_threads_per_replica(run->layout.world);
  if (run->start_step > 0 && run->opt->checkpoint_threads > 0 &&
      run->opt->checkpoint_threads != threads)
    printf(
        "note: the checkpoint was written with %d thread%s per replica, this run has %d: the "
        "steps from here add up in another order, so the result is not bit-identical to a run "
        "done in one go\n",
        run->opt->checkpoint_threads, run->opt->checkpoint_threads == 1 ? "" : "s", threads);
  fflush(stdout);
  return run_make_folder(run->opt->out_dir, run) == 0 ? GO_ON : failed();
}

// The replicas train: one per process under mpi (this process's rank is its replica), else one
// thread each. Then rank 0 writes the summary of a finished run (an interrupted one has its
// checkpoint and ledger). Returns the run's exit code.
static int train_replicas(Run *run, Comm *mpi) {
  run_install_stop_handlers();
  run->started = 1;
  if (mpi)
    replica_main(run, comm_rank(mpi), mpi);
  else
    run_local_replicas(run->layout.world, replica_main, run);
  if (run->exit_code != 0 || run->quiet_rank || run->stopped_early) return run->exit_code;
  if (run_write_summary(run) != 0) return failed();
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
