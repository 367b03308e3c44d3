#include "io/npy.h"

#include <stdio.h>
#include <string.h>

#include "io/atomic_file.h"

// Magic, version 1.0, header length, then a Python dict literal padded with spaces so the data
// starts on a 64-byte boundary, ending in a newline.
static int write_npy(const char *path, const char *descr, const char *shape, const void *data,
                     size_t bytes) {
  char dict[256];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                   descr, shape);
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  unsigned short header_len = (unsigned short)((size_t)n + pad + 1);
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  fwrite("\x93NUMPY\x01\x00", 1, 8, a.f);
  unsigned char len_le[2] = {(unsigned char)(header_len & 0xff), (unsigned char)(header_len >> 8)};
  fwrite(len_le, 1, 2, a.f);
  fwrite(dict, 1, (size_t)n, a.f);
  for (size_t i = 0; i < pad; i++) fputc(' ', a.f);
  fputc('\n', a.f);
  fwrite(data, 1, bytes, a.f);
  return atomic_commit(&a);
}

int npy_write_f32(const char *path, const float *data, size_t rows, size_t cols) {
  char shape[64];
  snprintf(shape, sizeof shape, "(%zu, %zu)", rows, cols);
  return write_npy(path, "<f4", shape, data, rows * cols * sizeof(float));
}

int npy_write_i64(const char *path, const int64_t *data, size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "(%zu,)", n);
  return write_npy(path, "<i8", shape, data, n * sizeof(int64_t));
}
