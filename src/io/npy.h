// NumPy .npy files (format 1.0, little-endian, C order), for features other tools read with
// numpy.load. Written atomically (io/atomic_file.h).
#pragma once
#include <stddef.h>
#include <stdint.h>

// (rows, cols) float32. -1 with tl_last_error() on failure.
int npy_write_f32(const char *path, const float *data, size_t rows, size_t cols);
// (n,) int64.
int npy_write_i64(const char *path, const int64_t *data, size_t n);
