#include "encoder/embed.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/regular_file.h"
#include "encoder/features.h"

// Which image each row of an embedding is: one line per row, the image's file (ImageFolder) or
// DATA:INDEX (the index in an IDX file), control bytes written as \xNN so a line is a row.
static int write_rows(const char *path, const Dataset *ds, const char *data) {
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  for (int i = 0; i < ds->n; i++) {
    const char *name = ds->files ? ds->files[i] : data;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
      if (*c < 0x20 || *c == 0x7f || *c == '\\')
        fprintf(a.f, "\\x%02x", *c);
      else
        fputc(*c, a.f);
    if (ds->files)
      fputc('\n', a.f);
    else
      fprintf(a.f, ":%d\n", i);
  }
  return atomic_commit(&a);
}

int embed_write(const char *src, const char *data, int limit, const char *out) {
  // Both outputs are checked before anything is written: a refused labels file must not leave
  // embeddings without their labels.
  char labels_path[4200], rows_path[4200];
  size_t stem =
      strlen(out) > 4 && !strcmp(out + strlen(out) - 4, ".npy") ? strlen(out) - 4 : strlen(out);
  snprintf(labels_path, sizeof labels_path, "%.*s.labels.npy", (int)stem, out);
  snprintf(rows_path, sizeof rows_path, "%.*s.rows.txt", (int)stem, out);
  if (output_path_check(out) != 0 || output_path_check(labels_path) != 0 ||
      output_path_check(rows_path) != 0)
    return -1;
  static FeatureEncoder enc;
  Dataset ds = {0};
  if (feature_encoder_open(&enc, src, NULL, 0) != 0) return -1;
  printf("reading %s...\n", data);
  int rc = feature_dataset_load(&enc, &ds, data, limit, !strcmp(enc.cfg.data.labels, "none"));
  if (rc == 0) {
    const int D = feature_encoder_dim(&enc);
    printf("encoding %d images...\n", ds.n);
    float *feat = tl_alloc(sizeof(float) * (size_t)ds.n * D, MEM_EVAL, COMP_OTHER);
    rc = feature_encoder_run(&enc, &ds, ds.n, feat);
    if (rc == 0) rc = npy_write_f32(out, feat, (size_t)ds.n, (size_t)D);
    tl_free(feat);
    if (rc == 0) rc = write_rows(rows_path, &ds, data);
    if (rc == 0 && ds.n_classes > 0) {
      int64_t *labels = tl_alloc(sizeof(int64_t) * (size_t)ds.n, MEM_EVAL, COMP_OTHER);
      for (int i = 0; i < ds.n; i++) labels[i] = ds.labels[i];
      rc = npy_write_i64(labels_path, labels, (size_t)ds.n);
      tl_free(labels);
    }
    if (rc == 0)
      printf(
          "%d embeddings of dimension %d written to %s, the image of each row, in order, to %s\n",
          ds.n, D, out, rows_path);
  }
  dataset_free(&ds);
  feature_encoder_close(&enc);
  return rc ? -1 : 0;
}
