#include "train/checkpoint.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

static int same_layout(const StTensor *a, const StTensor *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static void describe(const StTensor *t, char *buf, size_t n) {
  int w = snprintf(buf, n, "%s [", st_dtype_name(t->dtype));
  for (int d = 0; d < t->ndim && w > 0 && (size_t)w < n; d++)
    w += snprintf(buf + w, n - (size_t)w, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, "]");
}

int checkpoint_restore(const StFile *want, const StFile *have, const char *what) {
  for (int i = 0; i < want->n_tensors; i++) {
    const StTensor *w = &want->tensors[i];
    const StTensor *h = st_find(have, w->name);
    if (!h) return tl_fail("%s: has no tensor %s (a different model or objective?)", what, w->name);
    if (!same_layout(w, h)) {
      char a[96], b[96];
      describe(h, a, sizeof a);
      describe(w, b, sizeof b);
      return tl_fail("%s: tensor %s is %s, the model needs %s", what, w->name, a, b);
    }
  }
  for (int i = 0; i < want->n_tensors; i++) {
    const StTensor *w = &want->tensors[i];
    memcpy((void *)w->data, st_find(have, w->name)->data, w->bytes);
  }
  return 0;
}

int checkpoint_read(StFile *s, const char *path) {
  if (st_read(s, path, 0) != 0) return -1;
  const char *format = st_get_meta(s, "format");
  if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0) {
    // The message first: `format` points into the metadata st_free releases.
    tl_fail("%s: not a Tally checkpoint (format %s, expected %s)", path,
            format ? format : "missing", CHECKPOINT_FORMAT);
    st_free(s);
    return -1;
  }
  // A run continues only from state whose every byte is checked: its tensors' and its
  // metadata's (the configuration, the step, the budget spent).
  const char *missing = !st_get_meta(s, "crc32")            ? "crc32"
                        : !st_get_meta(s, "crc32_metadata") ? "crc32_metadata"
                                                            : NULL;
  if (missing) {
    tl_fail(
        "%s: has no %s checksum, so it cannot be checked (edited, or written by a Tally "
        "before checkpoints carried it): refused",
        path, missing);
    st_free(s);
    return -1;
  }
  return 0;
}

long checkpoint_step(const StFile *s) {
  const StTensor *t = st_find(s, "train.step");
  if (!t || t->dtype != ST_I64 || t->ndim != 0) return -1;
  int64_t step;
  memcpy(&step, t->data, sizeof step);
  return step >= 0 ? (long)step : -1;
}

void checkpoint_path_of(const char *src, char *out, size_t cap) {
  struct stat st;
  if (stat(src, &st) == 0 && S_ISDIR(st.st_mode))
    snprintf(out, cap, "%s/%s", src, CHECKPOINT_FILE);
  else
    snprintf(out, cap, "%s", src);
}
