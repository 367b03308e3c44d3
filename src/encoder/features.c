#include "encoder/features.h"

#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "train/checkpoint.h"
#include "encoder/export.h"

// Per-channel values from a tensor (checkpoint) or comma-separated metadata (export).
static int read_channels(const StFile *f, const char *tensor, const char *meta, int c, float *out) {
  const StTensor *t = st_find(f, tensor);
  if (t && t->dtype == ST_F32 && t->bytes == sizeof(float) * (size_t)c) {
    memcpy(out, t->data, t->bytes);
    return 0;
  }
  const char *text = st_get_meta(f, meta);
  for (int i = 0; text && i < c; i++) {
    char *end;
    out[i] = strtof(text, &end);
    if (end == text) return -1;
    text = *end == ',' ? end + 1 : end;
  }
  return text ? 0 : -1;
}

static int load_weights(FeatureEncoder *e, const StFile *f) {
  const ModelSpec *spec = &e->cfg.model.spec;
  for (int i = 0; i < e->ps.n_entries; i++) {
    const ParamEntry *p = &e->ps.entries[i];
    int found = weights_find(f, p, spec, e->cfg.data.channels, e->ps.data + p->offset, e->source);
    if (found < 0) return -1;
    if (!found) return tl_fail("%s: has no tensor for %s", e->source, p->name);
  }
  return 0;
}

int feature_encoder_open(FeatureEncoder *e, const char *src, const char *const *sets, int n_sets) {
  memset(e, 0, sizeof *e);
  checkpoint_path_of(src, e->source, sizeof e->source);
  StFile f;
  if (st_read(&f, e->source, 0) != 0) return -1;
  int rc = checkpoint_config(&f, e->source, &e->cfg);
  for (int i = 0; rc == 0 && i < n_sets; i++) rc = config_set(&e->cfg, sets[i]);
  const char *objective = st_get_meta(&f, "objective");
  snprintf(e->objective, sizeof e->objective, "%s", objective ? objective : "");
  const char *step = st_get_meta(&f, "step");
  e->step = step ? strtol(step, NULL, 10) : -1;
  const char *crc = st_get_meta(&f, "crc32");
  snprintf(e->crc32, sizeof e->crc32, "%s", crc ? crc : "");
  const Config *cfg = &e->cfg;
  const int S = cfg->data.image_size, C = cfg->data.channels;
  e->norm.out_size = S;
  if (rc == 0 && (read_channels(&f, "data.mean", "input_mean", C, e->norm.mean) != 0 ||
                  read_channels(&f, "data.std", "input_std", C, e->norm.std) != 0))
    rc = tl_fail("%s: does not say how inputs were normalized", e->source);
  if (rc == 0) {
    const int batch = cfg->eval.batch_size;
    e->batch = batch;
    tl_alloc_scope_begin(MEM_EVAL);
    exec_ctx_init(&e->ctx);
    e->ctx.scratchpad_category = MEM_EVAL;
    paramset_alloc_nograd(&e->ps, backbone_param_count(&cfg->model.spec, S, C), 0, MEM_EVAL);
    Builder b = {.ctx = &e->ctx, .params = &e->ps, .mode = OP_INFER};
    e->encoder = backbone_create(&cfg->model.spec, &b, batch, S, C);
    backbone_set_input_normalization(e->encoder, e->norm.mean, e->norm.std);
    e->images = tl_alloc(sizeof(float) * (size_t)batch * S * S * C, MEM_EVAL, COMP_OTHER);
    tl_alloc_scope_end();
    rc = load_weights(e, &f);
    if (rc != 0) feature_encoder_close(e);
  }
  st_free(&f);
  return rc;
}

int feature_encoder_dim(const FeatureEncoder *e) { return e->encoder->feature_dim; }

int feature_encoder_run(FeatureEncoder *e, const Dataset *ds, int n, float *feat) {
  const int S = e->cfg.data.image_size, C = e->cfg.data.channels, D = e->encoder->feature_dim;
  const size_t image_floats = (size_t)S * S * C;
  for (int start = 0; start < n; start += e->batch) {
    int count = n - start < e->batch ? n - start : e->batch;
    if (eval_views(ds, start, count, &e->norm, e->images) != 0) return -1;
    // The last partial batch is zero-padded (inference: rows do not interact).
    if (count < e->batch)
      memset(e->images + count * image_floats, 0,
             (size_t)(e->batch - count) * image_floats * sizeof(float));
    e->encoder->forward(e->encoder, &e->ctx, e->images);
    memcpy(feat + (size_t)start * D, e->encoder->feature, sizeof(float) * (size_t)count * D);
  }
  for (size_t i = 0; i < (size_t)n * D; i++)
    if (!isfinite(feat[i]))
      return tl_fail("%s: the encoder's feature %zu of image %zu is %g (a diverged encoder)",
                     e->source, i % D, i / D, feat[i]);
  return 0;
}

void feature_encoder_close(FeatureEncoder *e) {
  if (e->encoder) e->encoder->destroy(e->encoder);
  tl_free(e->images);
  paramset_free(&e->ps);
  exec_ctx_destroy(&e->ctx);
  e->encoder = NULL;
  e->images = NULL;
}

int dataset_load_path(const Config *cfg, Dataset *ds, const char *path, int limit, int unlabeled) {
  struct stat st;
  if (stat(path, &st) != 0) return tl_fail("%s: does not exist", path);
  const int S = cfg->data.image_size;
  int rc = S_ISDIR(st.st_mode) ? dataset_load_imagefolder(ds, path, S, cfg->data.channels, limit,
                                                          (cfg->data.stream ? DATASET_STREAM : 0) |
                                                              (unlabeled ? DATASET_UNLABELED : 0))
                               : dataset_load_idx(ds, path, cfg->data.channels, limit);
  if (rc != 0) return -1;
  if (ds->h != S || ds->w != S) {
    int h = ds->h, w = ds->w;
    dataset_free(ds);
    return tl_fail("%s: images are %dx%d, the encoder was trained on %dx%d", path, h, w, S, S);
  }
  return 0;
}

int feature_dataset_load(const FeatureEncoder *e, Dataset *ds, const char *path, int limit,
                         int unlabeled) {
  return dataset_load_path(&e->cfg, ds, path, limit, unlabeled);
}
