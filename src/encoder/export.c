#include "encoder/export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/counting.h"
#include "core/error.h"
#include "nn/backbone.h"
#include "train/checkpoint.h"

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Tally's name, or its family's PyTorch name (torchvision's ResNet names) unless `own_names`
// (exports written before the families named their parameters).
static TorchTensor torch_tensor_named(const ParamEntry *e, const ModelSpec *spec, int channels,
                                      int own_names) {
  TorchTensor t = {.ndim = e->ndim, .layout = TORCH_COPY};
  for (int d = 0; d < e->ndim; d++) t.shape[d] = e->shape[d];
  const BackboneDef *family = backbone_def(spec);
  if (own_names || !family->torch_name || !family->torch_name(e->name, t.name, sizeof t.name))
    snprintf(t.name, sizeof t.name, "%s", e->name);
  size_t n = strlen(t.name);
  if (ends_with(t.name, ".gamma")) {
    snprintf(t.name + n - strlen("gamma"), sizeof t.name - (n - strlen("gamma")), "weight");
  } else if (ends_with(t.name, ".beta")) {
    snprintf(t.name + n - strlen("beta"), sizeof t.name - (n - strlen("beta")), "bias");
  } else if (strcmp(e->name, "patch_embed.weight") == 0) {
    int P = spec->patch_size;
    snprintf(t.name, sizeof t.name, "patch_embed.proj.weight");
    t.ndim = 4;
    t.shape[1] = channels;
    t.shape[2] = t.shape[3] = P;
    t.layout = TORCH_PATCH_EMBED;
  } else if (strcmp(e->name, "patch_embed.bias") == 0) {
    snprintf(t.name, sizeof t.name, "patch_embed.proj.bias");
  } else if (strcmp(e->name, "cls_token") == 0) {
    t.ndim = 3;
    t.shape[0] = t.shape[1] = 1;
    t.shape[2] = (int64_t)e->count;
  }
  return t;
}

TorchTensor torch_tensor_for(const ParamEntry *e, const ModelSpec *spec, int channels) {
  return torch_tensor_named(e, spec, channels, 0);
}

// Tally's patch embedding flattens a patch as (py, px, c); a Conv2d weight is (D, c, py, px).
static void patch_embed_convert(const float *src, float *dst, int D, int P, int C, int to_torch) {
  for (int d = 0; d < D; d++)
    for (int c = 0; c < C; c++)
      for (int y = 0; y < P; y++)
        for (int x = 0; x < P; x++) {
          size_t tally = (size_t)d * P * P * C + ((size_t)y * P + x) * C + c;
          size_t torch = (((size_t)d * C + c) * P + y) * P + x;
          if (to_torch)
            dst[torch] = src[tally];
          else
            dst[tally] = src[torch];
        }
}

static int same_shape(const StTensor *f, int ndim, const int64_t *shape) {
  if (f->dtype != ST_F32 || f->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (f->shape[d] != shape[d]) return 0;
  return 1;
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
  int w = snprintf(buf, n, "[");
  for (int d = 0; d < ndim && w > 0 && (size_t)w < n; d++)
    w += snprintf(buf + w, n - (size_t)w, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, "]");
}

int weights_find(const StFile *f, const ParamEntry *e, const ModelSpec *spec, int channels,
                 float *out, const char *what) {
  char own[ST_NAME_MAX + 8];
  snprintf(own, sizeof own, "params.%s", e->name);
  TorchTensor tt = torch_tensor_for(e, spec, channels);
  const StTensor *t = strlen(own) < ST_NAME_MAX ? st_find(f, own) : NULL;
  int64_t own_shape[PARAM_MAX_DIMS];
  for (int d = 0; d < e->ndim; d++) own_shape[d] = e->shape[d];
  const int64_t *want = own_shape;
  int want_ndim = e->ndim, convert = 0;
  if (!t) {
    t = st_find(f, tt.name);
    // An export of format tally-export-1 named a ResNet's parameters as Tally does.
    if (!t) t = st_find(f, torch_tensor_named(e, spec, channels, 1).name);
    want = tt.shape;
    want_ndim = tt.ndim;
    convert = tt.layout == TORCH_PATCH_EMBED;
  }
  if (!t) return 0;
  if (!same_shape(t, want_ndim, want)) {
    char have[96], need[96];
    shape_text(t->ndim, t->shape, have, sizeof have);
    shape_text(want_ndim, want, need, sizeof need);
    return tl_fail("%s: tensor %s is %s %s, the model needs F32 %s", what, t->name,
                   st_dtype_name(t->dtype), have, need);
  }
  if (!convert) {
    memcpy(out, t->data, t->bytes);
    return 1;
  }
  float *tmp = malloc(t->bytes);
  if (!tmp) TL_DIE("out of memory");
  memcpy(tmp, t->data, t->bytes);
  patch_embed_convert(tmp, out, (int)tt.shape[0], spec->patch_size, channels, 0);
  free(tmp);
  return 1;
}

int checkpoint_config(const StFile *ckpt, const char *path, Config *cfg) {
  const char *recipe = st_get_meta(ckpt, "config"), *model = st_get_meta(ckpt, "model");
  if (!recipe || !model) return tl_fail("%s: holds no configuration", path);
  config_defaults(cfg);
  char name[4200];
  snprintf(name, sizeof name, "%s (its configuration)", path);
  if (config_load_text(cfg, name, recipe, model) != 0) return -1;
  return config_validate(cfg);
}

// The online parameters in a checkpoint, in the order they were taken: the backbone's come
// first, `backbone_floats` of them.
typedef struct {
  const StTensor **t;
  int n, n_backbone;
} Params;

static int checkpoint_params(const StFile *f, const Config *cfg, const char *what, Params *p) {
  size_t backbone_floats =
      backbone_param_count(&cfg->model.spec, cfg->data.image_size, cfg->data.channels);
  p->t = calloc((size_t)f->n_tensors + 1, sizeof *p->t);
  if (!p->t) TL_DIE("out of memory");
  p->n = p->n_backbone = 0;
  size_t floats = 0;
  for (int i = 0; i < f->n_tensors; i++) {
    const StTensor *t = &f->tensors[i];
    if (strncmp(t->name, "params.", 7) != 0) continue;
    if (t->dtype != ST_F32) return tl_fail("%s: %s is not F32", what, t->name);
    p->t[p->n++] = t;
    floats += t->bytes / sizeof(float);
    if (floats <= backbone_floats) p->n_backbone = p->n;
  }
  if (floats < backbone_floats)
    return tl_fail("%s: holds %zu parameters, fewer than the %zu of its backbone", what, floats,
                   backbone_floats);
  return 0;
}

// The checkpoint's backbone tensors are the ones its model builds, by name and shape, in order:
// an export is read by name into PyTorch's module tree, so a tensor of the right size under
// another name or shape would load as something else.
static int check_backbone_tensors(const Params *p, const Config *cfg, const char *what) {
  CountingPass pass;
  counting_begin(&pass, 0);
  Builder b = {.ctx = &pass.ctx, .params = &pass.ps, .mode = OP_INFER};
  Backbone *bb = backbone_create(&cfg->model.spec, &b, 2, cfg->data.image_size, cfg->data.channels);
  bb->destroy(bb);
  int rc = 0;
  if (pass.ps.n_entries != p->n_backbone)
    rc = tl_fail("%s: holds %d backbone tensors, its model builds %d", what, p->n_backbone,
                 pass.ps.n_entries);
  for (int i = 0; rc == 0 && i < p->n_backbone; i++) {
    const ParamEntry *e = &pass.ps.entries[i];
    const StTensor *t = p->t[i];
    int same = strcmp(t->name + 7, e->name) == 0 && t->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = t->shape[d] == e->shape[d];
    if (!same) rc = tl_fail("%s: tensor %s is not its model's %s", what, t->name, e->name);
  }
  counting_end(&pass);
  return rc;
}

int export_checkpoint(const char *ckpt, const char *out, int with_head) {
  StFile f;
  if (checkpoint_read(&f, ckpt) != 0) return -1;
  static Config cfg;
  Params p = {0};
  int rc = checkpoint_config(&f, ckpt, &cfg) == 0 && checkpoint_params(&f, &cfg, ckpt, &p) == 0 &&
                   check_backbone_tensors(&p, &cfg, ckpt) == 0
               ? 0
               : -1;
  StFile ex = {0};
  int n_out = with_head ? p.n : p.n_backbone;
  // Converted copies (and the BatchNorm counters) live until the file is written.
  float **owned = calloc((size_t)n_out + 1, sizeof *owned);
  int64_t *batches = calloc((size_t)n_out + 1, sizeof *batches);
  if (!owned || !batches) TL_DIE("out of memory");
  long steps = checkpoint_step(&f);
  for (int i = 0; rc == 0 && i < n_out; i++) {
    const StTensor *t = p.t[i];
    ParamEntry e = {.count = t->bytes / sizeof(float), .ndim = t->ndim};
    snprintf(e.name, sizeof e.name, "%s", t->name + 7);
    for (int d = 0; d < t->ndim; d++) e.shape[d] = (long)t->shape[d];
    TorchTensor tt = torch_tensor_for(&e, &cfg.model.spec, cfg.data.channels);
    size_t elems = 1;
    for (int d = 0; d < tt.ndim; d++) elems *= (size_t)tt.shape[d];
    if (elems * sizeof(float) != t->bytes) {
      rc = tl_fail("%s: tensor %s holds %zu floats, its model needs %zu", ckpt, t->name,
                   t->bytes / sizeof(float), elems);
      break;
    }
    owned[i] = malloc(t->bytes);
    if (!owned[i]) TL_DIE("out of memory");
    if (tt.layout == TORCH_PATCH_EMBED) {
      float *plain = malloc(t->bytes);
      if (!plain) TL_DIE("out of memory");
      memcpy(plain, t->data, t->bytes);
      patch_embed_convert(plain, owned[i], (int)tt.shape[0], cfg.model.spec.patch_size,
                          cfg.data.channels, 1);
      free(plain);
    } else {
      memcpy(owned[i], t->data, t->bytes);
    }
    st_add(&ex, tt.name, ST_F32, tt.ndim, tt.shape, owned[i]);
    if (ends_with(tt.name, ".running_var")) {
      // PyTorch's BatchNorm counts the batches it has seen; the steps trained stand for them.
      char name[ST_NAME_MAX];
      snprintf(name, sizeof name, "%.*snum_batches_tracked",
               (int)(strlen(tt.name) - strlen("running_var")), tt.name);
      batches[i] = steps > 0 ? steps : 0;
      st_add(&ex, name, ST_I64, 0, NULL, &batches[i]);
    }
  }
  if (rc == 0) {
    const char *keep[] = {"objective", "step", "config", "model"};
    for (size_t k = 0; k < sizeof keep / sizeof *keep; k++)
      if (st_get_meta(&f, keep[k])) st_set_meta(&ex, keep[k], st_get_meta(&f, keep[k]));
    st_set_meta(&ex, "format", EXPORT_FORMAT);
    st_set_meta(&ex, "backbone", cfg.model.spec.type);
    st_set_meta(&ex, "pool", backbone_def(&cfg.model.spec)->pool_name(&cfg.model.spec));
    // The input normalization the encoder expects: (x - mean) / std per channel, x in [0, 1].
    // It also fixes pad_to's frame, normalized black (0 - mean) / std, or 0 with the model's
    // pad_fill = mean: a loader of the export derives it from these two and the model, as
    // backbone_set_input_normalization does.
    const char *norm[] = {"data.mean", "data.std"};
    const char *meta[] = {"input_mean", "input_std"};
    for (int k = 0; k < 2; k++) {
      const StTensor *t = st_find(&f, norm[k]);
      if (!t || t->dtype != ST_F32) continue;
      char text[128] = "";
      for (size_t c = 0; c < t->bytes / sizeof(float); c++) {
        float v;
        memcpy(&v, (const char *)t->data + c * sizeof v, sizeof v);
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%.9g", c ? "," : "", v);
      }
      st_set_meta(&ex, meta[k], text);
    }
    rc = st_write(&ex, out);
  }
  for (int i = 0; i < n_out; i++) free(owned[i]);
  free(owned);
  free(batches);
  free(p.t);
  st_free(&ex);
  st_free(&f);
  return rc;
}

void export_default_path(const char *ckpt, char *out, size_t cap) {
  const char *slash = strrchr(ckpt, '/');
  const int dir_len = slash ? (int)(slash + 1 - ckpt) : 0;
  snprintf(out, cap, "%.*sencoder.safetensors", dir_len, ckpt);
}
