#include "plan/plan.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#include "core/exec_ctx.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "ledger/bytes.h"
#include "eval/knn.h"
#include "eval/monitor.h"
#include "objectives/objective.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "train/optim.h"
#include "train/replica.h"
#include "train/run_layout.h"

static void snapshot_sub(MemSnapshot out, MemSnapshot a, MemSnapshot b) {
  for (int c = 0; c < MEM_NCAT; c++)
    for (int k = 0; k < COMP_NCOMP; k++) out[c][k] = a[c][k] - b[c][k];
}

// What the replicas of one plan share. They are built one at a time in rank order (turn), so the
// memory of rank 0 alone is known (a process's own under the mpi backend); then they step together.
typedef struct {
  const Config *cfg;
  PlanOptions opt;
  RunLayout layout;  // the run's objective, steps, replicas and shards, as the trainer's
  long step;         // the stand-in batch's step (< 0: memory only)
  long record_step;  // the step the record is of (as step, but 0 for a time budget's last)
  int n_test;
  // The monitor's sets: its memory bank (n_bank images: [eval] train, else the training set) and
  // its test images (n_test: [eval] test, else [data] test); whether each is streamed from files.
  int n_bank, bank_streamed, test_streamed;
  int own_eval_set;    // [eval] train and test are the monitor's
  long total_steps;    // the layout's, or a budget's
  int length_unknown;  // a time budget: the length is timed by training
  pthread_mutex_t mutex;
  pthread_cond_t turn_changed;
  int turn;              // rank whose build is under way; world once all are built
  int failed;            // some replica could not build its objective or optimizer
  MemSnapshot baseline;  // live before the plan started (a test process may hold memory)
  MemSnapshot rank0;     // allocated by rank 0's build
  MemSnapshot stepped;   // live during the step, whole process, fake batches excluded
  // MEM_EVAL (rank 0): live after the raw-pixel baseline, live after an encoder evaluation, and
  // the highest it reaches inside a vote.
  size_t eval_before_first, eval_after_first, eval_peak;
  LedgerRecord rec;          // rank 0's step: counts, FLOPs, communication
  size_t encoder_act_bytes;  // rank 0's objective's encoder activations (its build's)
  size_t param_count;        // rank 0's online floats, as its build took them
  int grad_buckets;          // rank 0's gradient buckets, as PlanTotals has them
  size_t grad_bucket_floats[PLAN_MAX_BUCKETS];
  double grad_bucket_ready[PLAN_MAX_BUCKETS];
} Plan;

// The monitor votes (kNN) when it has labels: its own set's, or the training data's.
static int monitor_votes(const Plan *pl) {
  return pl->own_eval_set || strcmp(pl->cfg->data.labels, "none") != 0;
}

// The kNN monitor as the trainer builds it, and the evaluation memory its passes reach. Only the
// image counts of the datasets are read while building.
static void plan_monitor(Plan *pl, KnnMonitor *mon, float *params) {
  const Config *cfg = pl->cfg;
  const int S = cfg->data.image_size, C = cfg->data.channels, px = S * S * C;
  static const AugmentParams no_aug;
  Dataset train = {.n = pl->n_bank, .h = S, .w = S, .c = C};
  Dataset test = {.n = pl->n_test, .h = S, .w = S, .c = C};
  const size_t base = run_memory_category(pl->baseline, MEM_EVAL);
  const MonitorSettings set = replica_monitor_settings(cfg);
  const int labeled = monitor_votes(pl);
  knn_monitor_init(mon, &set, &train, labeled ? &test : NULL, &no_aug, params);
  const int nt = mon->n_train, ne = mon->n_test;
  // knn_monitor_raw_pixels (labeled): both banks of raw pixels, then a vote over px-wide features.
  size_t raw = 0;
  if (labeled) {
    knn_reserve_scratchpad(&mon->ctx, nt, ne, px);
    raw = sizeof(float) * ((size_t)nt * px + (size_t)ne * px) + knn_eval_bytes(nt, ne, px);
  }
  pl->eval_before_first = tl_mem_live(MEM_EVAL) - base;
  size_t peak_raw = pl->eval_before_first + raw;
  // knn_monitor_run: a vote over D-wide features into the banks the monitor holds, the quality.
  size_t run = knn_monitor_reserve_run(mon);
  pl->eval_after_first = tl_mem_live(MEM_EVAL) - base;
  size_t peak_run = pl->eval_after_first + run;
  pl->eval_peak = peak_raw > peak_run ? peak_raw : peak_run;
}

// A plan reserves its large buffers without memory behind them (see tl_alloc_set_untouched), so
// code that reads one while planning faults here: a defect in Tally, said as one. A reservation is
// mapped (mincore succeeds on its page); a fault anywhere else is some other crash (a library
// that ran out of memory under an address-space limit, say), and is not blamed on the plan.
static void on_reserved_touched(int sig, siginfo_t *info, void *context) {
  (void)sig;
  (void)context;
  const long page = sysconf(_SC_PAGESIZE);
  unsigned char resident;
  void *at = (void *)((uintptr_t)info->si_addr & ~(uintptr_t)(page - 1));
  static const char reserved[] =
      "tally: internal error: the plan touched a buffer it only reserves (dry-run code path)\n";
  static const char other[] =
      "tally: internal error: a segmentation fault while planning, outside the buffers the plan "
      "reserves (under an address-space limit, ulimit -v, a library may have run out of "
      "memory)\n";
  const int mapped = info->si_addr && mincore(at, 1, &resident) == 0;
  const char *msg = mapped ? reserved : other;
  const size_t len = mapped ? sizeof reserved - 1 : sizeof other - 1;
  if (write(STDERR_FILENO, msg, len) < 0) _exit(70);
  _exit(70);
}

static void wait_turn(Plan *pl, int turn) {
  pthread_mutex_lock(&pl->mutex);
  while (pl->turn < turn) pthread_cond_wait(&pl->turn_changed, &pl->mutex);
  pthread_mutex_unlock(&pl->mutex);
}

// Rank 0's backward FLOPs when each gradient bucket of an mpi run completes: the plan's replicas
// are local and average the gradient after backward, but the buckets an mpi run would start as
// backward writes them are tracked by a bucketer of the same layout (it starts nothing on this
// backend), and the FLOPs counted so far are read whenever a report completes one.
typedef struct {
  GradSync *gs;
  const ExecCtx *ctx;
  void (*bucketer)(void *user, size_t offset, size_t count);
  void *bucketer_user;
  int n;
  double *flops;  // [n] when bucket b completed; -1 until it does
} BucketClock;

static double backward_flops(const ExecCtx *ctx) {
  double sum = 0;
  for (int c = 0; c < COMP_NCOMP; c++) sum += ctx->flops_backward[c];
  return sum;
}

static void on_grad_reported(void *user, size_t offset, size_t count) {
  BucketClock *bc = user;
  bc->bucketer(bc->bucketer_user, offset, count);
  for (int b = 0; b < bc->n; b++)
    if (bc->flops[b] < 0 && grad_sync_bucket_complete(bc->gs, b))
      bc->flops[b] = backward_flops(bc->ctx);
}

static void bucket_clock_start(BucketClock *bc, Replica *r) {
  bc->gs = grad_sync_create(r->comm, &r->ps, (size_t)r->cfg->parallel.bucket_kib * 1024);
  bc->ctx = &r->ctx;
  bc->n = grad_sync_bucket_count(bc->gs);
  bc->flops = malloc(sizeof *bc->flops * (size_t)bc->n);
  if (!bc->flops) TL_DIE("out of memory");
  for (int b = 0; b < bc->n; b++) bc->flops[b] = -1;
  grad_sync_begin(bc->gs, 1, 1);
  bc->bucketer = r->ps.grad_ready;
  bc->bucketer_user = r->ps.grad_ready_user;
  r->ps.grad_ready = on_grad_reported;
  r->ps.grad_ready_user = bc;
}

// After backward: the buckets, merged in neighbouring pairs while there are too many, into pl.
// Buckets start in index order on every rank (grad_sync.h), so one written early still waits for
// those before it.
static void bucket_clock_stop(BucketClock *bc, Plan *pl) {
  const double total = backward_flops(bc->ctx);
  double ready = 0;
  int n = 0;
  for (int b = 0; b < bc->n; b++) {
    size_t offset, count;
    grad_sync_bucket_range(bc->gs, b, &offset, &count);
    ready = fmax(ready, bc->flops[b] >= 0 && total > 0 ? bc->flops[b] / total : 1);
    pl->grad_bucket_floats[n] = count;
    pl->grad_bucket_ready[n] = ready;
    if (++n == PLAN_MAX_BUCKETS) {
      for (int k = 0; k < n / 2; k++) {
        pl->grad_bucket_floats[k] =
            pl->grad_bucket_floats[2 * k] + pl->grad_bucket_floats[2 * k + 1];
        pl->grad_bucket_ready[k] = pl->grad_bucket_ready[2 * k + 1];
      }
      n /= 2;
    }
  }
  pl->grad_buckets = n;
  grad_sync_destroy(bc->gs);  // nothing started, so nothing to wait for; detaches the callback
  free(bc->flops);
}

// The trainer's step (the same replica functions), on a stand-in batch of the right size: views,
// indices and labels reserved and never written (nothing reads them in a dry run).
static void plan_step(Plan *pl, Replica *r) {
  const Config *cfg = pl->cfg;
  const int C = cfg->data.channels, local = r->shard.local;
  const ViewRecipe views = replica_views(cfg, pl->layout.def, NULL, NULL);
  Batch batch = {.global_step = (int)pl->step,
                 .epoch = (int)(pl->step / pl->layout.steps_per_epoch),
                 .n = local};
  batch.views =
      tl_alloc(sizeof(float) * (size_t)local * view_recipe_floats(&views, C), MEM_DATA, COMP_OTHER);
  batch_set_groups(&batch, &views, C);
  batch.indices = tl_alloc(sizeof(int) * (size_t)local, MEM_DATA, COMP_OTHER);
  batch.labels = tl_alloc(sizeof(int) * (size_t)local, MEM_DATA, COMP_OTHER);
  LedgerRecord rec = {0};
  StepTimes t = {0};
  BucketClock clock;
  if (r->rank == 0) bucket_clock_start(&clock, r);
  replica_forward_backward(r, &batch, &rec);
  if (r->rank == 0) bucket_clock_stop(&clock, pl);
  replica_update(r, &batch, 0.0f, &rec, &t);
  // The same exchange; a plan's verdict is moot.
  (void)replica_check(r, pl->step, !pl->length_unknown && pl->step == pl->total_steps - 1);
  comm_barrier(r->comm);
  if (r->rank == 0) {
    replica_count(r, &rec);
    pl->rec = rec;
    pl->encoder_act_bytes = r->encoder_act_bytes;
    MemSnapshot now;
    run_memory_snapshot(now);
    snapshot_sub(pl->stepped, now, pl->baseline);
  }
  comm_barrier(r->comm);
  tl_free(batch.views);
  tl_free(batch.indices);
  tl_free(batch.labels);
}

static void plan_replica(void *shared, int rank, Comm *comm) {
  Plan *pl = shared;
  // The trainer splits the cores among replicas; oneDNN sizes scratchpads for the threads it gets.
  run_split_threads(pl->layout.world);
  tl_alloc_set_untouched(1);  // per thread: this replica's buffers are reservations too
  wait_turn(pl, rank);
  MemSnapshot before, after;
  run_memory_snapshot(before);
  // No run folder: a plan writes no images, and reads none (no input normalization).
  const ReplicaSpec spec = {.cfg = pl->cfg,
                            .layout = &pl->layout,
                            .rank = rank,
                            .total_steps = pl->total_steps,
                            .dry_run = 1};
  Replica r;
  const int built = replica_build(&r, &spec, comm) == 0;
  KnnMonitor mon;
  const int use_knn = rank == 0 && built && !pl->opt.no_knn;
  if (use_knn) plan_monitor(pl, &mon, r.ps.data);
  run_memory_snapshot(after);
  pthread_mutex_lock(&pl->mutex);
  if (rank == 0) snapshot_sub(pl->rank0, after, before);
  if (rank == 0 && built) pl->param_count = r.ps.count;
  if (!built) pl->failed = 1;
  pl->turn++;
  pthread_cond_broadcast(&pl->turn_changed);
  pthread_mutex_unlock(&pl->mutex);

  // Every replica decides on the same shared outcome, so none waits in a collective alone.
  wait_turn(pl, pl->layout.world);
  if (!pl->failed) {
    if (pl->step >= 0) {
      plan_step(pl, &r);
    } else if (rank == 0) {
      MemSnapshot now;
      run_memory_snapshot(now);
      snapshot_sub(pl->stepped, now, pl->baseline);
    }
  }

  if (use_knn) knn_monitor_destroy(&mon);
  replica_destroy(&r);
}

// Every replica built in rank order and stepped together in dry run, as the trainer's threads
// are: large buffers are only reserved meanwhile, and code that touches one is reported.
static void plan_replicas(Plan *pl) {
  pthread_mutex_init(&pl->mutex, NULL);
  pthread_cond_init(&pl->turn_changed, NULL);
  run_memory_snapshot(pl->baseline);
  struct sigaction reserved_touched = {.sa_sigaction = on_reserved_touched, .sa_flags = SA_SIGINFO},
                   before;
  sigaction(SIGSEGV, &reserved_touched, &before);
  tl_alloc_set_untouched(1);
  run_local_replicas(pl->layout.world, plan_replica, pl);
  tl_alloc_set_untouched(0);
  sigaction(SIGSEGV, &before, NULL);
  pthread_mutex_destroy(&pl->mutex);
  pthread_cond_destroy(&pl->turn_changed);
}

static int is_folder(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// flags: DATASET_UNLABELED for the run's own data of data.labels = none (dataset_flags).
static int peek_dataset(const Config *cfg, const char *path, int folder, int limit, int flags,
                        int *n) {
  if (folder) return dataset_imagefolder_count(path, limit, flags, n);
  int all, h, w;
  if (dataset_idx_peek(path, &all, &h, &w) != 0) return -1;
  if (run_check_image_size(cfg, path, h, w) != 0) return -1;
  *n = limit > 0 && limit < all ? limit : all;
  return 0;
}

// The image counts of the training set and the monitor's sets, read as the trainer reads them
// (without the images), and the run's steps that follow from them.
static int plan_images(Plan *pl) {
  const Config *cfg = pl->cfg;
  // A test set is loaded only for the kNN monitor, which needs labels (unlabeled, the monitor
  // measures the label-free quality alone): [eval] test with its own memory bank, [eval] train,
  // when given, else [data] test.
  pl->own_eval_set = cfg->eval.train[0] && !pl->opt.no_knn;
  if (pl->own_eval_set && config_validate_eval_set(cfg) != 0) return -1;
  const int data_folder = strcmp(cfg->data.format, "idx") != 0;
  const int data_test = monitor_votes(pl) && !pl->own_eval_set && !pl->opt.no_knn;
  if (data_test && !cfg->data.test[0])
    return tl_fail(
        "the kNN monitor scores the encoder on a labeled test set, and data.test is empty: give "
        "--set data.test=PATH, or --no-knn");
  int n_train;
  if (peek_dataset(cfg, cfg->data.train, data_folder, cfg->data.limit,
                   dataset_flags(cfg) & DATASET_UNLABELED, &n_train) != 0 ||
      (data_test &&
       peek_dataset(cfg, cfg->data.test, data_folder, cfg->data.test_limit, 0, &pl->n_test) != 0))
    return -1;
  pl->n_bank = n_train;
  pl->bank_streamed = pl->test_streamed = data_folder && cfg->data.stream;
  if (pl->own_eval_set) {
    // As the trainer reads them (dataset_load_path): a folder is an ImageFolder root.
    const int bank_folder = is_folder(cfg->eval.train), test_folder = is_folder(cfg->eval.test);
    if (peek_dataset(cfg, cfg->eval.train, bank_folder, 0, 0, &pl->n_bank) != 0 ||
        peek_dataset(cfg, cfg->eval.test, test_folder, 0, 0, &pl->n_test) != 0)
      return -1;
    pl->bank_streamed = bank_folder && cfg->data.stream;
    pl->test_streamed = test_folder && cfg->data.stream;
  }
  return run_layout_set_images(&pl->layout, cfg, n_train);
}

// The process's own resident memory, taken once per process, after its first plan has built every
// network in dry run and oneDNN's lazily built kernels exist (exec_build_lazy_kernels): later
// plans in the same process (a --memory-budget search) then compare their counted bytes against
// one fixed baseline, not against a peak that creeps as the heap does.
static size_t process_baseline_bytes(void) {
  static size_t baseline;
  if (!baseline) {
    exec_build_lazy_kernels();
    baseline = tl_peak_rss_bytes();
  }
  return baseline;
}

// The steps a FLOP budget allows: step 0 planned without the budget gives rank 0's FLOPs, scaled
// to every replica by rank 0's shard of the run layout, as the trainer's first step measures them.
static int flops_budget_steps(const Config *cfg, const RunLayout *L, const char *objective,
                              const PlanOptions *opt, int *total) {
  Config *unbounded = malloc(sizeof *unbounded);
  if (!unbounded) TL_DIE("out of memory");
  *unbounded = *cfg;
  unbounded->train.budget[0] = 0;
  LedgerRecord r;
  int rc = plan_build(unbounded, objective, 0, opt, &r, NULL);
  free(unbounded);
  if (rc != 0) return -1;
  Budget budget;
  config_budget(cfg, &budget);
  const RunShard rank0 = run_layout_shard(L, 0);
  return config_budget_steps(cfg, 0, budget.amount, run_step_flops(&rank0, &r), total);
}

// The run's length under its budget, and the step the record is of (PLAN_LAST_STEP: the last).
// A FLOP budget's length is its amount over a step's FLOPs, as the trainer counts it after its
// first step; a time budget's is known only once training has timed its first steps (until then
// its schedules follow a run without end, as here).
static int plan_length(Plan *pl, const char *objective) {
  const Config *cfg = pl->cfg;
  int total_steps = pl->layout.total_steps;
  Budget budget;
  config_budget(cfg, &budget);  // validated with the configuration
  pl->record_step = pl->step;
  if (budget.kind == BUDGET_FLOPS && pl->step >= 0 &&
      flops_budget_steps(cfg, &pl->layout, objective, &pl->opt, &total_steps) != 0)
    return -1;
  if (budget.kind == BUDGET_SECONDS) {
    total_steps = INT_MAX;
    pl->length_unknown = 1;
    if (pl->record_step == PLAN_LAST_STEP) pl->record_step = 0;
  }
  pl->total_steps = total_steps;
  if (pl->record_step == PLAN_LAST_STEP)
    pl->step = pl->record_step = pl->total_steps - 1;
  else if (pl->record_step >= pl->total_steps)
    return tl_fail("step %ld is past the end of the run (%ld steps; steps count from 0)",
                   pl->record_step, pl->total_steps);
  return 0;
}

// MEM_DATA as the trainer holds it: the datasets, and every local replica's loader buffers (one
// replica's process under mpi).
static void plan_data_bytes(const Plan *pl, int processes_replicas, PlanTotals *t) {
  const Config *cfg = pl->cfg;
  const RunLayout *L = &pl->layout;
  const int S = cfg->data.image_size, C = cfg->data.channels;
  const int streamed = strcmp(cfg->data.format, "idx") != 0 && cfg->data.stream;
  t->dataset_bytes = dataset_bytes(L->n_train, S, S, C, streamed) +
                     dataset_bytes(pl->n_test, S, S, C, pl->test_streamed);
  if (pl->own_eval_set) t->dataset_bytes += dataset_bytes(pl->n_bank, S, S, C, pl->bank_streamed);
  const ViewRecipe views = replica_views(cfg, L->def, NULL, NULL);
  for (int rank = 0; rank < processes_replicas; rank++) {
    const RunShard shard = run_layout_shard(L, rank);
    t->loader_bytes += loader_buffer_bytes(L->n_train, shard.local, &views, C);
  }
}

// The ledger record of the planned step: rank 0's counts, the process's memory, the schedules'
// values and every replica's FLOPs so far; what only training measures is NaN.
static LedgerRecord plan_record(const Plan *pl, MemSnapshot mem, const PlanTotals *t) {
  const Config *cfg = pl->cfg;
  const RunLayout *L = &pl->layout;
  LedgerRecord r = pl->rec;
  r.step = pl->record_step < 0 ? 0 : pl->record_step;
  r.epoch = (int)(r.step / L->steps_per_epoch);
  r.objective = L->def->name;
  r.replicas = L->world;
  r.lr = lr_at_step(config_lr(cfg), (int)r.step, cfg->optim.warmup_steps, (int)pl->total_steps,
                    cfg->optim.schedule);
  r.loss = NAN;
  run_fill_memory(&r, mem);
  const ViewRecipe views = replica_views(cfg, L->def, NULL, NULL);
  int sizes[LEDGER_MAX_VIEW_GROUPS], counts[LEDGER_MAX_VIEW_GROUPS];
  for (int g = 0; g < views.n_groups; g++)
    sizes[g] = views.group[g].aug.out_size, counts[g] = views.group[g].count;
  ledger_view_groups_finish(&r, views.n_groups, sizes, counts, pl->encoder_act_bytes);
  r.data_bytes = t->dataset_bytes + t->loader_bytes;
  // The first encoder evaluation follows the first evaluation period (or comes before step 0);
  // it can leave a larger scratchpad behind.
  long first_eval_after = config_eval_period_steps(cfg, L->steps_per_epoch);
  r.eval_bytes = pl->opt.knn_at_start || r.step >= first_eval_after ? pl->eval_after_first
                                                                    : pl->eval_before_first;
  if (L->def->plan) L->def->plan(cfg, r.step, L->global_batch, &r);
  // Every replica's FLOPs so far, accumulated step by step as the trainer does (the same sum of
  // the same numbers, so the same bits).
  const RunShard rank0 = run_layout_shard(L, 0);
  const double per_step = run_step_flops(&rank0, &r);
  r.flops_total = 0;
  for (long s = 0; s <= r.step; s++) r.flops_total += per_step;
  r.data_ms = r.forward_ms = r.backward_ms = r.comm_ms = r.optimizer_ms = r.step_ms = NAN;
  r.train_seconds = NAN;
  r.images_per_s = NAN;
  r.peak_rss_bytes = 0;
  return r;
}

// What the plan was drawn from and its memory totals (t holds the data bytes already).
static void plan_totals(const Plan *pl, const LedgerRecord *r, MemSnapshot mem, PlanTotals *t) {
  const Config *cfg = pl->cfg;
  const RunLayout *L = &pl->layout;
  t->grad_buckets = pl->grad_buckets;
  memcpy(t->grad_bucket_floats, pl->grad_bucket_floats, sizeof t->grad_bucket_floats);
  memcpy(t->grad_bucket_ready, pl->grad_bucket_ready, sizeof t->grad_bucket_ready);
  t->n_train = L->n_train;
  t->n_test = pl->n_test;
  t->image_size = cfg->data.image_size;
  t->channels = cfg->data.channels;
  t->world = L->world;
  t->global_batch = L->global_batch;
  t->local_batch = run_layout_shard(L, 0).local;
  t->steps_per_epoch = L->steps_per_epoch;
  t->total_steps = pl->length_unknown ? 0 : pl->total_steps;
  t->param_count = pl->param_count;
  const char *slash = strrchr(cfg->model.file, '/');
  snprintf(t->backbone, sizeof t->backbone, "%.63s", slash ? slash + 1 : cfg->model.file);
  char *dot = strrchr(t->backbone, '.');
  if (dot && strcmp(dot, ".ini") == 0) *dot = 0;
  t->patches_per_image = backbone_patch_count(&cfg->model.spec, cfg->data.image_size);
  for (int c = 0; c < MEM_NCAT; c++) t->category_bytes[c] = run_memory_category(mem, c);
  t->category_bytes[MEM_DATA] = r->data_bytes;
  t->category_bytes[MEM_EVAL] = pl->eval_after_first;
  t->eval_peak_bytes = pl->eval_peak;
  for (int c = 0; c < MEM_NCAT; c++) t->total_bytes += c == MEM_EVAL ? 0 : t->category_bytes[c];
  t->total_bytes += t->eval_peak_bytes;
  t->process_bytes = process_baseline_bytes();
  t->total_bytes += t->process_bytes;
}

int plan_build(const Config *cfg, const char *objective, long step, const PlanOptions *opt,
               LedgerRecord *out, PlanTotals *totals) {
  static const PlanOptions defaults;
  Plan *pl = calloc(1, sizeof *pl);
  if (!pl) TL_DIE("out of memory");
  pl->cfg = cfg;
  pl->opt = opt ? *opt : defaults;
  pl->step = step;
  int rc = -1;
  const ObjectiveDef *def = NULL;
  if (config_validate(cfg) != 0 || !(def = run_objective(objective)) ||
      run_layout_init(&pl->layout, cfg, def, cfg->parallel.replicas) != 0 || plan_images(pl) != 0 ||
      run_layout_set_shards(&pl->layout, cfg) != 0 || plan_length(pl, objective) != 0)
    goto out;
  plan_replicas(pl);
  if (pl->failed) goto out;
  // The process's memory: every local replica, or one replica's under mpi (its own process).
  const int mpi = strcmp(cfg->parallel.backend, "mpi") == 0;
  MemSnapshot *mem = mpi ? &pl->rank0 : &pl->stepped;
  PlanTotals t = {.timed_step_ms = NAN, .timed_step_range_ms = {NAN, NAN}};
  plan_data_bytes(pl, mpi ? 1 : pl->layout.world, &t);
  const LedgerRecord r = plan_record(pl, *mem, &t);
  plan_totals(pl, &r, *mem, &t);
  if (out) *out = r;
  if (totals) *totals = t;
  rc = 0;
out:
  free(pl);
  return rc;
}

int plan_time_steps(const Config *cfg, const char *objective, int steps, double *ms_per_step,
                    double range_ms[2]) {
  const ObjectiveDef *def = objective_find(objective);
  if (!def) return tl_fail("unknown objective '%s'", objective);
  if (cfg->parallel.replicas > 1 || strcmp(cfg->parallel.backend, "local") != 0)
    return tl_fail(
        "a timed step is one replica's (parallel.replicas = %d, backend %s); time one replica, or "
        "predict several from a run with --from RUN --nodes N --link RATE",
        cfg->parallel.replicas, cfg->parallel.backend);
  if (config_validate(cfg) != 0) return -1;
  LocalGroup *group = comm_local_group_create(1);
  Comm *comm = comm_local_rank(group, 0);
  const int batch_size = cfg->train.batch_size;
  RunLayout layout;
  (void)run_layout_init(&layout, cfg, def, 1);  // a batch of at least one (validated)
  const ReplicaSpec spec = {.cfg = cfg, .layout = &layout, .rank = 0, .total_steps = 1000};
  Replica r;
  int rc = -1;
  double *ms = malloc(sizeof(double) * (size_t)steps);
  if (!ms) TL_DIE("out of memory");
  if (replica_build(&r, &spec, comm) == 0) {
    const ViewRecipe views = replica_views(cfg, def, NULL, NULL);
    const size_t floats = (size_t)batch_size * view_recipe_floats(&views, cfg->data.channels);
    Batch batch = {.n = batch_size};
    batch.views = tl_alloc(sizeof(float) * floats, MEM_DATA, COMP_OTHER);
    batch.indices = tl_alloc(sizeof(int) * (size_t)batch_size, MEM_DATA, COMP_OTHER);
    batch.labels = tl_alloc(sizeof(int) * (size_t)batch_size, MEM_DATA, COMP_OTHER);
    batch_set_groups(&batch, &views, cfg->data.channels);
    // Normalized views are about standard normal; the values change no op's time.
    Rng rng = rng_stream(cfg->train.seed, RNG_AUGMENT, 0, 0);
    for (size_t i = 0; i < floats; i++) batch.views[i] = rng_normal(&rng);
    for (int i = 0; i < batch_size; i++) batch.indices[i] = i, batch.labels[i] = 0;
    // One step first: it creates the primitives (JIT) and faults the buffers in, as a run's first.
    for (int s = -1; s < steps; s++) {
      LedgerRecord rec = {0};
      StepTimes t = {0};
      batch.global_step = s + 1;
      const double start = now_ms();
      replica_forward_backward(&r, &batch, &rec);
      replica_update(&r, &batch, 0.0f, &rec, &t);
      if (s >= 0) ms[s] = now_ms() - start;
    }
    // The median: one slow step (another process, a page fault) does not move it.
    for (int i = 1; i < steps; i++)
      for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
        const double x = ms[j];
        ms[j] = ms[j - 1], ms[j - 1] = x;
      }
    *ms_per_step = steps % 2 ? ms[steps / 2] : (ms[steps / 2 - 1] + ms[steps / 2]) / 2;
    if (range_ms) range_ms[0] = ms[0], range_ms[1] = ms[steps - 1];
    tl_free(batch.views);
    tl_free(batch.indices);
    tl_free(batch.labels);
    rc = 0;
  }
  replica_destroy(&r);
  free(ms);
  comm_destroy(comm);
  comm_local_group_destroy(group);
  return rc;
}

const char *plan_budget_key(const char *objective) {
  const ObjectiveDef *def = objective_find(objective);
  return def && def->budget_key ? def->budget_key : "train.batch_size";
}

// Plans cfg with key = value; *fits says whether its total is within the budget.
static int probe(const Config *cfg, const char *objective, const char *key, long value,
                 size_t budget, const PlanOptions *opt, Config *with, int *fits, size_t *total) {
  *with = *cfg;
  char assignment[96];
  snprintf(assignment, sizeof assignment, "%s=%ld", key, value);
  if (config_set(with, assignment) != 0) return -1;
  PlanTotals t;
  if (plan_build(with, objective, -1, opt, NULL, &t) != 0) return -1;
  *fits = t.total_bytes <= budget;
  *total = t.total_bytes;
  return 0;
}

int plan_fit_budget(const Config *cfg, const char *objective, size_t budget_bytes,
                    const PlanOptions *opt, Config *fitted, long *value) {
  const char *key = plan_budget_key(objective);
  // An objective's own key (a queue's size) or the batch.
  const int own_key = strcmp(key, "train.batch_size") != 0;
  PlanTotals t;
  if (plan_build(cfg, objective, -1, opt, NULL, &t) != 0) return -1;
  // Two images per replica: batch statistics (BatchNorm's, VICReg's) need two samples; the queue
  // is capped by its config range.
  const long smallest = own_key ? 1 : 2L * cfg->parallel.replicas;
  const long largest = own_key ? 1L << 24 : t.n_train;
  Config *with = malloc(sizeof *with);
  if (!with) TL_DIE("out of memory");
  int fits, rc = -1;
  size_t total;
  long lo, hi = -1;  // lo fits; hi does not (-1: none found yet)
  if (probe(cfg, objective, key, smallest, budget_bytes, opt, with, &fits, &total) != 0) goto out;
  if (!fits) {
    char need[32], have[32];
    format_bytes((double)total, need, sizeof need);
    format_bytes((double)budget_bytes, have, sizeof have);
    tl_fail("even %s = %ld plans %s, more than the budget of %s", key, smallest, need, have);
    goto out;
  }
  // Memory grows with either key, nearly in proportion, so the boundary is found by secant
  // steps from two plans and then checked from both sides; bisection takes over whenever an
  // interpolation fails to halve the interval (a primitive that changes algorithm with size).
  lo = smallest;
  double f_lo = (double)total, x_prev = (double)smallest, f_prev = f_lo, f_hi = 0;
  char current[32];
  if (config_get(cfg, key, current, sizeof current) != 0) goto out;
  long start = strtol(current, NULL, 10);
  long next = start > lo ? (start < largest ? start : largest) : (lo < largest ? lo + 1 : lo);
  while (hi < 0 && next > lo) {
    if (probe(cfg, objective, key, next, budget_bytes, opt, with, &fits, &total) != 0) goto out;
    if (!fits) {
      hi = next, f_hi = (double)total;
      break;
    }
    x_prev = (double)lo, f_prev = f_lo;
    lo = next, f_lo = (double)total;
    // Extrapolate along the last two fitting plans, at most 4 times further each round.
    double slope = (f_lo - f_prev) / ((double)lo - x_prev);
    double guess = slope > 0 ? (double)lo + ((double)budget_bytes - f_lo) / slope : 4.0 * lo;
    next = guess > 4.0 * lo ? 4 * lo : (long)guess;
    if (next <= lo) next = lo + 1;
    if (next > largest) next = largest;
  }
  int bisect = 0;
  while (hi > lo + 1) {
    long width = hi - lo;
    long mid = bisect ? lo + width / 2
                      : lo + (long)(((double)budget_bytes - f_lo) / (f_hi - f_lo) * (double)width);
    if (mid <= lo) mid = lo + 1;
    if (mid >= hi) mid = hi - 1;
    if (probe(cfg, objective, key, mid, budget_bytes, opt, with, &fits, &total) != 0) goto out;
    if (fits)
      lo = mid, f_lo = (double)total;
    else
      hi = mid, f_hi = (double)total;
    bisect = hi - lo > width / 2;
  }
  if (probe(cfg, objective, key, lo, budget_bytes, opt, fitted, &fits, &total) != 0) goto out;
  *value = lo;
  rc = 0;
out:
  free(with);
  return rc;
}

int plan_parse_size(const char *text, size_t *bytes) {
  static const struct {
    const char *unit;
    double scale;
  } units[] = {{"", 1},         {"b", 1},    {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
               {"tib", 0x1p40}, {"kb", 1e3}, {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  char *end;
  double v = strtod(text, &end);
  if (end == text || !(v >= 0))
    return tl_fail("--memory-budget '%s': expected a size such as 2GiB, 512MiB or 4000000000",
                   text);
  while (isspace((unsigned char)*end)) end++;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcasecmp(end, units[i].unit) == 0) {
      double b = v * units[i].scale;
      if (b >= 0x1p63) return tl_fail("--memory-budget '%s': too large", text);
      *bytes = (size_t)b;
      return 0;
    }
  return tl_fail("--memory-budget '%s': unknown unit '%s' (KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                 text, end);
}

enum { LABEL_WIDTH = 30, COLUMN_WIDTH = 17 };

static void print_row(FILE *f, const char *label, int n, char cells[][48]) {
  fprintf(f, "  %-*s", LABEL_WIDTH, label);
  for (int j = 0; j < n; j++) fprintf(f, "%*s", COLUMN_WIDTH, cells[j]);
  fputc('\n', f);
}

// A plan's row of memory totals, by name.
static double total_row(const PlanTotals *t, int row) {
  switch (row) {
    case 0:
      return (double)t->dataset_bytes;
    case 1:
      return (double)t->loader_bytes;
    case 2:
      return (double)t->category_bytes[MEM_EVAL];
    case 3:
      return (double)t->eval_peak_bytes;
    case 4:
      return (double)t->process_bytes;
    default:
      return (double)t->total_bytes;
  }
}

// The rows of group g's fields that only some objectives declare (moco's queue, mae's patches):
// each once, in the order the columns declare them; "-" where a column's objective has none.
static void print_own_fields(FILE *f, const LedgerRecord *recs, int n, LedgerGroup g,
                             char cells[][48]) {
  for (int j = 0; j < n; j++)
    for (int k = 0; recs[j].own_fields && k < recs[j].own_fields->n; k++) {
      const LedgerFieldInfo *fi = &recs[j].own_fields->field[k];
      int shown = 0;  // by an earlier column
      for (int i = 0; i < j && !shown; i++)
        shown = ledger_own_find(recs[i].own_fields, fi->name) >= 0;
      if (fi->group != g || shown) continue;
      for (int i = 0; i < n; i++) {
        if (ledger_own_find(recs[i].own_fields, fi->name) < 0)
          snprintf(cells[i], 48, "-");
        else if (fi->measured_only)
          snprintf(cells[i], 48, "measured only");
        else
          ledger_format_value(fi->unit, ledger_value(&recs[i], fi->name), cells[i], 48);
      }
      print_row(f, fi->name, n, cells);
    }
}

// The rows that say what a column plans: backbone, parameters, data, batch, steps, patches.
static void print_configuration(FILE *f, int n, const PlanTotals *totals, char cells[][48]) {
  fprintf(f, "%s\n", "Configuration");
  for (int j = 0; j < n; j++) snprintf(cells[j], sizeof cells[j], "%.47s", totals[j].backbone);
  print_row(f, "backbone", n, cells);
  for (int j = 0; j < n; j++) snprintf(cells[j], sizeof cells[j], "%zu", totals[j].param_count);
  print_row(f, "parameters", n, cells);
  for (int j = 0; j < n; j++)
    snprintf(cells[j], sizeof cells[j], "%d/%d", totals[j].n_train, totals[j].n_test);
  print_row(f, "images (train/test)", n, cells);
  for (int j = 0; j < n; j++)
    snprintf(cells[j], sizeof cells[j], "%d (%d)", totals[j].global_batch, totals[j].local_batch);
  print_row(f, "batch (rank 0's shard)", n, cells);
  for (int j = 0; j < n; j++)
    if (totals[j].total_steps)
      snprintf(cells[j], sizeof cells[j], "%ld (%d/epoch)", totals[j].total_steps,
               totals[j].steps_per_epoch);
    else
      snprintf(cells[j], sizeof cells[j], "timed at the start (%d/epoch)",
               totals[j].steps_per_epoch);
  print_row(f, "steps in the run", n, cells);
  int any_vit = 0;
  for (int j = 0; j < n; j++) any_vit |= totals[j].patches_per_image > 0;
  if (any_vit) {
    for (int j = 0; j < n; j++)
      if (totals[j].patches_per_image)
        snprintf(cells[j], sizeof cells[j], "%d", totals[j].patches_per_image);
      else
        snprintf(cells[j], sizeof cells[j], "-");
    print_row(f, "patches per image", n, cells);
  }
}

// The ledger's fields group by group (the four questions, cost), then the names of the time
// fields, which only a run measures.
static void print_ledger_groups(FILE *f, int n, const LedgerRecord *recs, char cells[][48]) {
  const int nf = ledger_field_count();
  for (int g = 0; g < LEDGER_TIME; g++) {
    fprintf(f, "%s\n", ledger_group_title((LedgerGroup)g));
    for (int i = 0; i < nf; i++) {
      const LedgerFieldInfo *fi = ledger_field_info(i);
      if (fi->group != (LedgerGroup)g || fi->unit == UNIT_TEXT) continue;
      int nonzero = 0;
      for (int j = 0; j < n; j++) {
        double v = ledger_field_value(&recs[j], i);
        if (fi->measured_only && v != 0) v = NAN;
        nonzero |= v != 0;
        if (fi->measured_only && isnan(v))
          snprintf(cells[j], sizeof cells[j], "measured only");
        else
          ledger_format_value(fi->unit, v, cells[j], sizeof cells[j]);
      }
      // A quantity that is 0 for every column (a CNN's decoder FLOPs) is left out.
      if (nonzero) print_row(f, fi->name, n, cells);
    }
    print_own_fields(f, recs, n, (LedgerGroup)g, cells);
  }
  fprintf(f, "%s: ", ledger_group_title(LEDGER_TIME));
  for (int i = 0, first = 1; i < nf; i++)
    if (ledger_field_info(i)->group == LEDGER_TIME) {
      fprintf(f, "%s%s", first ? "" : ", ", ledger_field_info(i)->name);
      first = 0;
    }
  fputc('\n', f);
}

// What memory the run holds in all, and whether it fits this machine.
static void print_memory_totals(FILE *f, int n, const PlanTotals *totals, char cells[][48]) {
  fprintf(f, "Memory totals\n");
  static const char *const total_names[] = {
      "dataset (train + test)", "loader buffers",          "evaluation (kNN monitor)",
      "evaluation at its peak", "process (code, kernels)", "planned peak (all memory)"};
  for (int row = 0; row < 6; row++) {
    for (int j = 0; j < n; j++) format_bytes(total_row(&totals[j], row), cells[j], 48);
    print_row(f, total_names[row], n, cells);
  }
  // A plan of any size is arithmetic; whether it can run here is the machine's memory.
  const double machine = tl_machine_memory_bytes();
  char have[32], label[64];
  format_bytes(machine, have, sizeof have);
  snprintf(label, sizeof label, "fits in memory (%s)", have);
  for (int j = 0; j < n; j++) {
    char need[32];
    format_bytes((double)totals[j].total_bytes, need, sizeof need);
    if ((double)totals[j].total_bytes <= machine)
      snprintf(cells[j], 48, "yes");
    else
      snprintf(cells[j], 48, "no (%s)", need);
  }
  print_row(f, label, n, cells);
}

// A timed probe's pace and the run's steps at it, when any column was timed.
static void print_timed(FILE *f, int n, const PlanTotals *totals, char cells[][48]) {
  int any_timed = 0;
  for (int j = 0; j < n; j++) any_timed |= !isnan(totals[j].timed_step_ms);
  if (any_timed) {
    fprintf(f, "Time on this machine (timed: 5 steps on random views, one replica)\n");
    for (int j = 0; j < n; j++)
      if (isnan(totals[j].timed_step_ms))
        snprintf(cells[j], 48, "-");
      else
        snprintf(cells[j], 48, "%.1f (%.1f-%.1f)", totals[j].timed_step_ms,
                 totals[j].timed_step_range_ms[0], totals[j].timed_step_range_ms[1]);
    print_row(f, "ms per step (median, range)", n, cells);
    for (int j = 0; j < n; j++) {
      const double steps = (double)totals[j].total_steps / 1e3;
      char mid[14], lo[14], hi[14];
      format_quantity(QTY_SECONDS, totals[j].timed_step_ms * steps, mid, sizeof mid);
      format_quantity(QTY_SECONDS, totals[j].timed_step_range_ms[0] * steps, lo, sizeof lo);
      format_quantity(QTY_SECONDS, totals[j].timed_step_range_ms[1] * steps, hi, sizeof hi);
      if (isnan(totals[j].timed_step_ms))
        snprintf(cells[j], 48, "-");
      else if (!totals[j].total_steps)
        snprintf(cells[j], 48, "the time budget");
      else
        snprintf(cells[j], 48, "%s (%s-%s)", mid, lo, hi);
    }
    print_row(f, "the run's steps at that pace", n, cells);
    fprintf(f,
            "(the range is the probe's fastest and slowest step; evaluations and the first\n"
            "step's setup come on top, and another load on this machine slows every step)\n");
  }
}

void plan_print_table(FILE *f, int n, const char *const *names, const LedgerRecord *recs,
                      const PlanTotals *totals) {
  char(*cells)[48] = calloc((size_t)n, sizeof *cells);
  if (!cells) TL_DIE("out of memory");
  for (int j = 0; j < n; j++) snprintf(cells[j], sizeof cells[j], "%s", names[j]);
  print_row(f, "", n, cells);
  print_configuration(f, n, totals, cells);
  print_ledger_groups(f, n, recs, cells);
  print_memory_totals(f, n, totals, cells);
  print_timed(f, n, totals, cells);
  free(cells);
}

void plan_print_json(FILE *f, const LedgerRecord *rec, const PlanTotals *t) {
  fputc('{', f);
  ledger_write_json_members(f, rec, 1);
  fprintf(
      f,
      ",\"planned_total_bytes\":%zu,\"planned_eval_peak_bytes\":%zu,"
      "\"planned_process_bytes\":%zu,\"planned_dataset_bytes\":%zu,\"planned_loader_bytes\":%zu,"
      "\"planned_activation_grad_bytes\":%zu,\"planned_queue_bytes\":%zu,"
      "\"param_count\":%zu,\"n_train\":%d,\"n_test\":%d,\"global_batch\":%d,"
      "\"local_batch\":%d,\"steps_per_epoch\":%d,",
      t->total_bytes, t->eval_peak_bytes, t->process_bytes, t->dataset_bytes, t->loader_bytes,
      t->category_bytes[MEM_ACT_GRAD], t->category_bytes[MEM_QUEUE], t->param_count, t->n_train,
      t->n_test, t->global_batch, t->local_batch, t->steps_per_epoch);
  // null: a time budget's length, which training times.
  if (t->total_steps)
    fprintf(f, "\"total_steps\":%ld,", t->total_steps);
  else
    fprintf(f, "\"total_steps\":null,");
  fprintf(f, "\"patches_per_image\":%d,", t->patches_per_image);
  // A timed probe's (--time), null without one; the run's time is null while its length is not
  // known (a time budget's is the budget).
  if (isnan(t->timed_step_ms))
    fputs("\"timed_step_ms\":null,\"timed_run_seconds\":null}\n", f);
  else if (t->total_steps)
    fprintf(f,
            "\"timed_step_ms\":%.3f,\"timed_step_range_ms\":[%.3f,%.3f],"
            "\"timed_run_seconds\":%.1f,\"timed_run_seconds_range\":[%.1f,%.1f]}\n",
            t->timed_step_ms, t->timed_step_range_ms[0], t->timed_step_range_ms[1],
            t->timed_step_ms * t->total_steps / 1e3,
            t->timed_step_range_ms[0] * t->total_steps / 1e3,
            t->timed_step_range_ms[1] * t->total_steps / 1e3);
  else
    fprintf(f, "\"timed_step_ms\":%.3f,\"timed_run_seconds\":null}\n", t->timed_step_ms);
}

int plan_column(FILE *f, Config *cfg, const char *objective, const PlanRequest *req,
                LedgerRecord *rec, PlanTotals *totals) {
  if (req->fit_budget) {
    static Config fitted;
    long value;
    if (plan_fit_budget(cfg, objective, req->budget_bytes, &req->options, &fitted, &value) != 0)
      return -1;
    *cfg = fitted;
    char have[32];
    format_bytes((double)req->budget_bytes, have, sizeof have);
    if (!req->json)
      fprintf(f, "%s: the largest %s within %s is %ld\n", objective, plan_budget_key(objective),
              have, value);
  }
  if (plan_build(cfg, objective, req->step, &req->options, rec, totals) != 0) return -1;
  if (req->timed) {
    if (!req->json) {
      fprintf(f, "%s: timing 5 steps here...\n", objective);
      fflush(f);
    }
    if (plan_time_steps(cfg, objective, 5, &totals->timed_step_ms, totals->timed_step_range_ms) !=
        0)
      return -1;
  }
  const double encoded = ledger_value(rec, "patches_encoded");
  if (!req->json && req->fit_budget && !isnan(encoded))
    fprintf(f, "%s: %g of %d patches encoded per image\n", objective, encoded / totals->local_batch,
            totals->patches_per_image);
  return 0;
}

void plan_print_columns(FILE *f, int n, const char *const *names, const LedgerRecord *recs,
                        const PlanTotals *totals, int json) {
  if (json) {
    for (int j = 0; j < n; j++) plan_print_json(f, &recs[j], &totals[j]);
    return;
  }
  for (int j = 1; j < n; j++)
    if (strcmp(totals[j].backbone, totals[0].backbone) != 0) {
      fprintf(f,
              "note: the columns use different backbones (each objective's own recipe); pass\n"
              "      --config FILE to compare them on one backbone and dataset\n");
      break;
    }
  int same_step = 1;
  for (int j = 1; j < n; j++) same_step &= recs[j].step == recs[0].step;
  if (same_step)
    fprintf(f, "tally plan: step %ld (epoch %d)", recs[0].step, recs[0].epoch);
  else
    fprintf(f, "tally plan: each column's last step");
  fprintf(f, ", %d replica%s\n", totals[0].world, totals[0].world == 1 ? "" : "s");
  plan_print_table(f, n, names, recs, totals);
}
