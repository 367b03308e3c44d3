#include "run/run_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/exec_ctx.h"
#include "ledger/bytes.h"
#include "train/checkpoint.h"
#include "encoder/export.h"
#include "plan/plan.h"

// --data PATH: the training data is PATH — a folder of images (ImageFolder, with or without class
// subfolders) or an IDX file — and no longer the recipe's dataset: its name and its test set go
// (the kNN monitor then asks for data.test, or --no-knn).
static int apply_data_path(Config *cfg, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return tl_fail("--data %s: %s", path, strerror(errno));
  char set[CONFIG_PATH_MAX + 32];
  int rc = config_set(cfg, S_ISDIR(st.st_mode) ? "data.format=imagefolder" : "data.format=idx");
  if (rc == 0) rc = config_set(cfg, "data.dataset=");
  if (rc == 0 && snprintf(set, sizeof set, "data.train=%s", path) >= (int)sizeof set)
    return tl_fail("--data: a path of %zu characters is too long", strlen(path));
  if (rc == 0) rc = config_set(cfg, set);
  if (rc == 0) rc = config_set(cfg, "data.test=");
  return rc;
}

// train.precision = auto: bf16 where oneDNN runs it natively (AVX512-BF16 or AMX), fp32 elsewhere.
// The run's config.ini records what it resolved to, so a resumed run keeps its precision wherever
// it resumes.
static int resolve_precision(Config *cfg) {
  if (strcmp(cfg->train.precision, "auto") != 0) return 0;
  return config_set(cfg, cpu_has_native_bf16() ? "train.precision=bf16" : "train.precision=fp32");
}

int run_config_load(const char *objective, const ConfigArgs *a, Config *cfg) {
  const char *config_path = a->config_path;
  config_defaults(cfg);
  char default_name[256], default_path[CONFIG_PATH_MAX];
  snprintf(default_name, sizeof default_name, "configs/%s.ini", objective);
  config_resolve_path(default_name, default_path, sizeof default_path);
  if (!config_path && access(default_path, R_OK) == 0) config_path = default_path;
  int rc = config_path ? config_load(cfg, config_path) : config_load_model(cfg, cfg->model.file);
  if (rc == 0 && a->data_path) rc = apply_data_path(cfg, a->data_path);
  if (rc == 0 && a->batch_set[0]) rc = config_set(cfg, a->batch_set);
  if (rc == 0 && a->lr_set[0]) rc = config_set(cfg, a->lr_set);
  for (int i = 0; rc == 0 && i < a->n_sets; i++) rc = config_set(cfg, a->sets[i]);
  // --epochs alone means "train for epochs", so it clears a step count from the recipe.
  if (rc == 0 && a->epochs_set[0] && !a->steps_set[0]) rc = config_set(cfg, "train.steps=0");
  if (rc == 0 && a->epochs_set[0]) rc = config_set(cfg, a->epochs_set);
  if (rc == 0 && a->steps_set[0]) rc = config_set(cfg, a->steps_set);
  if (rc == 0 && a->budget_set[0]) rc = config_set(cfg, a->budget_set);
  if (rc == 0) rc = resolve_precision(cfg);
  if (rc == 0) rc = config_validate(cfg);
  return rc;
}

// Keys a resumed run may change: none of them changes the model, the objective, the data or
// the optimization of the steps already taken (train.recompute changes only what is kept between
// forward and backward, not a value). train.precision and train.conv_algorithm are among them
// because they only change how a step multiplies: bf16 lives only inside a step (the parameters
// and the optimizer and objective state a checkpoint holds are f32 in either precision), and
// Winograd computes the same convolution.
static int resume_may_set(const char *assignment) {
  static const char *const allowed[] = {"train.steps=",
                                        "train.epochs=",
                                        "train.precision=",
                                        "train.recompute=",
                                        "train.conv_algorithm=",
                                        "train.log_every=",
                                        "train.checkpoint_every=",
                                        "eval.",
                                        "mae.png_every=",
                                        "ledger.every=",
                                        "parallel.checksum_every=",
                                        "parallel.bucket_kib=",
                                        "parallel.timeout=",
                                        "parallel.replicas=",
                                        "parallel.backend="};
  for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++)
    if (strncmp(assignment, allowed[i], strlen(allowed[i])) == 0) return 1;
  return 0;
}

int run_config_resume(const char *dir, const ConfigArgs *ca, Config *cfg, char *objective,
                      size_t objective_cap, char *ckpt_path, size_t ckpt_cap, TrainOptions *opt) {
  snprintf(ckpt_path, ckpt_cap, "%s/%s", dir, CHECKPOINT_FILE);
  StFile f;
  if (checkpoint_read(&f, ckpt_path) != 0 || checkpoint_config(&f, ckpt_path, cfg) != 0) return 1;
  const char *name = st_get_meta(&f, "objective");
  snprintf(objective, objective_cap, "%s", name ? name : "");
  opt->start_step = checkpoint_step(&f);
  const char *no_knn = st_get_meta(&f, "no_knn");
  if (no_knn && strcmp(no_knn, "1") == 0) opt->no_knn = 1;
  // What the run has spent, and the length a time or FLOP budget fixed.
  const char *spent_s = st_get_meta(&f, "train_seconds"), *spent_f = st_get_meta(&f, "flops_total");
  const char *total = st_get_meta(&f, "total_steps");
  opt->spent_seconds = spent_s ? strtod(spent_s, NULL) : 0;
  opt->spent_flops = spent_f ? strtod(spent_f, NULL) : 0;
  // Checkpoints from before the ledger was tied to them carry no record: nothing to check.
  const char *ledger_step = st_get_meta(&f, "ledger_last_step");
  const char *ledger_crc = st_get_meta(&f, "ledger_last_crc");
  opt->ledger_last_step = ledger_step && ledger_crc ? strtol(ledger_step, NULL, 10) : -1;
  opt->ledger_last_crc = ledger_crc ? strtoul(ledger_crc, NULL, 10) : 0;
  const char *csv_crc = st_get_meta(&f, "ledger_csv_crc");
  opt->ledger_csv_crc = csv_crc ? (long long)strtoul(csv_crc, NULL, 10) : -1;
  const char *eval_bytes = st_get_meta(&f, "eval_bytes"), *eval_crc = st_get_meta(&f, "eval_crc");
  opt->eval_bytes = eval_bytes && eval_crc ? strtoll(eval_bytes, NULL, 10) : -1;
  opt->eval_crc = eval_crc ? strtoul(eval_crc, NULL, 10) : 0;
  const char *threads = st_get_meta(&f, "threads_per_replica");
  opt->checkpoint_threads = threads ? atoi(threads) : 0;
  const char *loss = st_get_meta(&f, "loss");
  opt->last_loss = loss ? strtod(loss, NULL) : NAN;
  Budget budget;
  if (total && config_budget(cfg, &budget) == 0 &&
      (budget.kind == BUDGET_SECONDS || budget.kind == BUDGET_FLOPS))
    opt->frozen_total_steps = strtol(total, NULL, 10);
  st_free(&f);
  if (opt->start_step < 0) {
    tl_fail("%s: holds no step", ckpt_path);
    return 1;
  }
  const char *sets[258];
  int n = 0;
  for (int i = 0; i < ca->n_sets; i++) sets[n++] = ca->sets[i];
  if (ca->epochs_set[0] && !ca->steps_set[0]) sets[n++] = "train.steps=0";
  if (ca->epochs_set[0]) sets[n++] = ca->epochs_set;
  if (ca->steps_set[0]) sets[n++] = ca->steps_set;
  for (int i = 0; i < n; i++) {
    if (!resume_may_set(sets[i])) {
      tl_fail(
          "--set %s: a resumed run keeps its model, objective, data and optimizer; start a new "
          "run to change it",
          sets[i]);
      return 2;
    }
    if (config_set(cfg, sets[i]) != 0) return 1;
  }
  return resolve_precision(cfg) != 0 || config_validate(cfg) != 0;
}

int run_fits_in_memory(const Config *cfg, const char *objective, TrainOptions *opt, int check) {
  if (strcmp(cfg->parallel.backend, "local") != 0) return 1;
  PlanOptions po = {.no_knn = opt->no_knn, .knn_at_start = opt->knn_at_start};
  PlanTotals t;
  if (plan_build(cfg, objective, -1, &po, NULL, &t) != 0) return 1;
  opt->planned_peak_bytes = t.total_bytes;
  const double machine = tl_machine_memory_bytes();
  if (!check || (double)t.total_bytes <= machine) return 1;
  char need[32], have[32];
  format_bytes((double)t.total_bytes, need, sizeof need);
  format_bytes(machine, have, sizeof have);
  tl_fail(
      "this run needs %s of memory at its peak (tally plan shows where it goes); this machine "
      "has %s. Lower train.batch_size (or the model's size), or start it anyway with "
      "--no-memory-check",
      need, have);
  return 0;
}

int run_budget_fits_steps(const Config *cfg, const char *objective, const TrainOptions *opt) {
  Budget budget;
  if (opt->resume_path || config_budget(cfg, &budget) != 0 || budget.kind != BUDGET_FLOPS) return 1;
  PlanOptions po = {.no_knn = 1};
  PlanTotals t;
  return plan_build(cfg, objective, 0, &po, NULL, &t) == 0;
}
