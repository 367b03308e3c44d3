#include "run/run_state.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "io/atomic_file.h"
#include "train/checkpoint.h"
#include "encoder/export.h"

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
int run_save_checkpoint(ReplicaState *r, long steps_done) {
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
  snprintf(text, sizeof text, "%d", run_threads_per_replica(run->layout.world));
  st_set_meta(&s, "threads_per_replica", text);
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
  snprintf(text, sizeof text, "%lu", run->ledger_csv_crc);
  st_set_meta(&s, "ledger_csv_crc", text);
  snprintf(text, sizeof text, "%lld", run->eval_bytes);
  st_set_meta(&s, "eval_bytes", text);
  snprintf(text, sizeof text, "%lu", run->eval_crc);
  st_set_meta(&s, "eval_crc", text);
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
int run_restore_checkpoint(ReplicaState *r, const char *path) {
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
int run_init_from_file(ReplicaState *r, const char *path) {
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
