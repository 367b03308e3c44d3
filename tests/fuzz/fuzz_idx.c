// libFuzzer harness: an IDX images file and the labels file beside it, plain or gzip
// (dataset_idx_peek, dataset_load_idx), as `tally train` reads Fashion-MNIST.
// Input: one options byte, then the images file's bytes, then the labels file's bytes, which
// start at the first labels magic (00 00 08 01); without one there is no labels file.
//   options bit 0: the harness gzips the images file (else it is written as is, so a raw input
//                  can still be a gzip stream), bit 1: the same for the labels file,
//   bit 2: load as 3 channels, bits 3-4: limit 0 (all), 1, 2 or 5 images.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/dataset.h"
#include "fuzz_util.h"

static void write_maybe_gzip(const char *path, const uint8_t *data, size_t bytes, int gzip) {
  if (!gzip) {
    fuzz_write(path, data, bytes);
    return;
  }
  gzFile gz = gzopen(path, "wb");
  if (!gz || (bytes && gzwrite(gz, data, (unsigned)bytes) != (int)bytes) || gzclose(gz) != Z_OK)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options = data[0];
  static const int limits[] = {0, 1, 2, 5};
  const int channels = options & 4 ? 3 : 1, limit = limits[(options >> 3) & 3];
  data++, size--;

  static const uint8_t labels_magic[] = {0, 0, 8, 1};
  const uint8_t *labels = size > 1 ? memmem(data + 1, size - 1, labels_magic, 4) : NULL;
  const size_t images_bytes = labels ? (size_t)(labels - data) : size;

  // The labels file is named after the images file; zlib reads gzip and plain files alike, so the
  // .gz suffix only follows what the harness wrote.
  const char *suffix = options & 1 ? ".gz" : "";
  char images_path[600], labels_path[600], rel[64];
  snprintf(rel, sizeof rel, "idx/train-images-idx3-ubyte%s", suffix);
  fuzz_path(images_path, sizeof images_path, rel);
  snprintf(rel, sizeof rel, "idx/train-labels-idx1-ubyte%s", suffix);
  fuzz_path(labels_path, sizeof labels_path, rel);
  write_maybe_gzip(images_path, data, images_bytes, options & 1);
  if (labels)
    write_maybe_gzip(labels_path, labels, size - images_bytes, options & 2);
  else
    unlink(labels_path);

  int n, h, w;
  dataset_idx_peek(images_path, &n, &h, &w);
  Dataset ds;
  if (dataset_load_idx(&ds, images_path, channels, limit) == 0) {
    float mean[3], std[3];
    dataset_channel_stats(&ds, mean, std);  // touches every pixel the header promised
    if (ds.n < 1 || (limit && ds.n > limit) || ds.c != channels) abort();
    for (int i = 0; i < ds.n; i++)
      if (ds.labels[i] < 0 || ds.labels[i] >= ds.n_classes) abort();
    dataset_free(&ds);
  }
  return 0;
}
