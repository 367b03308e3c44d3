#include "data/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

void dataset_free(Dataset *ds) {
  tl_free(ds->pixels);
  tl_free(ds->labels);
  if (ds->class_names) {
    for (int k = 0; k < ds->n_classes; k++) free(ds->class_names[k]);
    free(ds->class_names);
  }
  if (ds->files) {
    for (int i = 0; i < ds->n; i++) free(ds->files[i]);
    free(ds->files);
  }
  memset(ds, 0, sizeof *ds);
}

size_t dataset_bytes(int n, int h, int w, int c) {
  return (size_t)n * h * w * c + sizeof(int) * (size_t)n;
}

void dataset_channel_stats(const Dataset *ds, float *mean, float *std) {
  const size_t pixels_per_channel = (size_t)ds->n * ds->h * ds->w;
  for (int ch = 0; ch < ds->c; ch++) {
    // Doubles: 60k x 784 values summed in float would lose the low digits of the variance.
    double sum = 0, sum_sq = 0;
#pragma omp parallel for reduction(+ : sum, sum_sq)
    for (size_t i = 0; i < pixels_per_channel; i++) {
      double v = ds->pixels[i * ds->c + ch] / 255.0;
      sum += v;
      sum_sq += v * v;
    }
    double m = pixels_per_channel ? sum / pixels_per_channel : 0;
    double var = pixels_per_channel ? sum_sq / pixels_per_channel - m * m : 0;
    mean[ch] = (float)m;
    std[ch] = (float)sqrt(var > 0 ? var : 0);
  }
}

// The source pixels one output coordinate draws from along one axis, with the triangle filter
// that weighs them. Pixel i covers [i, i+1), so its centre is i + 0.5.
typedef struct {
  int lo, hi;            // source range [lo, hi), inside the crop
  float centre;          // where the output pixel's centre falls in source coordinates
  float inv_half_width;  // the triangle reaches 1 pixel when enlarging, `scale` when shrinking
  float weight_sum;
} Taps;

static float tap_weight(const Taps *t, int i) {
  float d = fabsf((float)i + 0.5f - t->centre) * t->inv_half_width;
  return d < 1.0f ? 1.0f - d : 0.0f;
}

static Taps axis_taps(int o, int out_len, int crop_start, int crop_len) {
  Taps t;
  float scale = (float)crop_len / (float)out_len;
  float half_width = scale > 1.0f ? scale : 1.0f;
  t.inv_half_width = 1.0f / half_width;
  t.centre = (float)crop_start + ((float)o + 0.5f) * scale;
  int lo = (int)floorf(t.centre - half_width - 0.5f) + 1;
  int hi = (int)ceilf(t.centre + half_width - 0.5f);
  // Clamping to the crop (not the image) is what makes this equal to crop-then-resize.
  t.lo = lo > crop_start ? lo : crop_start;
  t.hi = hi < crop_start + crop_len ? hi : crop_start + crop_len;
  t.weight_sum = 0;
  for (int i = t.lo; i < t.hi; i++) t.weight_sum += tap_weight(&t, i);
  return t;
}

void image_resample_bilinear(const uint8_t *src, int h, int w, int c, int y0, int x0, int crop_h,
                             int crop_w, float *out, int out_h, int out_w) {
  TL_ASSERT(y0 >= 0 && x0 >= 0 && crop_h > 0 && crop_w > 0 && y0 + crop_h <= h && x0 + crop_w <= w);
  // Column taps are shared by every row: computed once per chunk of columns, kept on the stack.
  enum { COLUMN_CHUNK = 64 };
  Taps column_taps[COLUMN_CHUNK];
  for (int ox0 = 0; ox0 < out_w; ox0 += COLUMN_CHUNK) {
    const int n_cols = out_w - ox0 < COLUMN_CHUNK ? out_w - ox0 : COLUMN_CHUNK;
    for (int k = 0; k < n_cols; k++) column_taps[k] = axis_taps(ox0 + k, out_w, x0, crop_w);
    for (int oy = 0; oy < out_h; oy++) {
      const Taps ty = axis_taps(oy, out_h, y0, crop_h);
      for (int k = 0; k < n_cols; k++) {
        const Taps *tx = &column_taps[k];
        float *o = out + ((size_t)oy * out_w + ox0 + k) * c;
        for (int ch = 0; ch < c; ch++) o[ch] = 0;
        for (int y = ty.lo; y < ty.hi; y++) {
          const float wy = tap_weight(&ty, y);
          const uint8_t *row = src + (size_t)y * w * c;
          for (int x = tx->lo; x < tx->hi; x++) {
            const float wxy = wy * tap_weight(tx, x);
            for (int ch = 0; ch < c; ch++) o[ch] += wxy * (float)row[x * c + ch];
          }
        }
        const float norm = ty.weight_sum * tx->weight_sum;
        for (int ch = 0; ch < c; ch++) o[ch] /= norm;
      }
    }
  }
}

// Test classes are scored against the training classes: ImageFolder classes are matched by
// name (a test set may hold a subset), IDX labels must lie among the training labels.
int dataset_align_test_labels(const Dataset *train, Dataset *test, const char *test_path) {
  if (train->n_classes <= 0) return tl_fail("%s: has no class labels to evaluate with", test_path);
  if (train->class_names && test->class_names) {
    int map[4096];
    if (test->n_classes > 4096) return tl_fail("%s: more than 4096 classes", test_path);
    for (int c = 0; c < test->n_classes; c++) {
      map[c] = -1;
      for (int t = 0; t < train->n_classes; t++)
        if (strcmp(test->class_names[c], train->class_names[t]) == 0) map[c] = t;
      if (map[c] < 0)
        return tl_fail("%s: class '%s' is not among the training set's classes", test_path,
                       test->class_names[c]);
    }
    for (int i = 0; i < test->n; i++) test->labels[i] = map[test->labels[i]];
    return 0;
  }
  for (int i = 0; i < test->n; i++)
    if (test->labels[i] < 0 || test->labels[i] >= train->n_classes)
      return tl_fail("%s: image %d has label %d; the training set's labels are 0..%d", test_path, i,
                     test->labels[i], train->n_classes - 1);
  return 0;
}
