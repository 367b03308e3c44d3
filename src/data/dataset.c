#include "data/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>

#include "core/alloc.h"
#include "core/error.h"

void dataset_free(Dataset *ds) {
  tl_free(ds->pixels);
  tl_free(ds->source_h);
  tl_free(ds->source_w);
  tl_free(ds->source_id);
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

size_t dataset_bytes(int n, int h, int w, int c, int streaming) {
  if (streaming) return (sizeof(int) + 2 * sizeof(uint16_t) + sizeof(FileIdentity)) * (size_t)n;
  return (size_t)n * h * w * c + sizeof(int) * (size_t)n;
}

void dataset_source_size(const Dataset *ds, int index, int *h, int *w) {
  if (ds->pixels) {
    *h = ds->h;
    *w = ds->w;
  } else {
    *h = ds->source_h[index];
    *w = ds->source_w[index];
  }
}

int dataset_max_reduction(const Dataset *ds, int index) {
  if (ds->pixels) return 1;
  const char *dot = strrchr(ds->files[index], '.');
  return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg")) ? 8 : 1;
}

int dataset_image(const Dataset *ds, int index, int reduction, Image *img) {
  TL_ASSERT(index >= 0 && index < ds->n);
  if (ds->pixels) {
    *img =
        (Image){ds->pixels + (size_t)index * ds->h * ds->w * ds->c, ds->h, ds->w, ds->c, 0, 1, {0}};
    return 0;
  }
  if (dataset_max_reduction(ds, index) == 1) reduction = 1;
  if (image_decode(ds->files[index], ds->c, reduction, DECODER_DEFAULT, img) != 0) return -1;
  const FileIdentity *listed = &ds->source_id[index];
  if (!file_identity_equal(&img->id, listed)) {
    const char *what = img->id.ino != listed->ino || img->id.dev != listed->dev ? "inode"
                       : img->id.bytes != listed->bytes                         ? "size in bytes"
                                                        : "modification time";
    tl_fail("%s: changed during the run (its %s is not the listed file's: replaced or rewritten)",
            ds->files[index], what);
    image_free(img);
    return -1;
  }
  const int h = ds->source_h[index], w = ds->source_w[index];
  if (img->h != image_reduced_side(h, reduction) || img->w != image_reduced_side(w, reduction)) {
    tl_fail("%s: now %dx%d pixels, %dx%d when the run started (changed during the run)",
            ds->files[index], img->w * reduction, img->h * reduction, w, h);
    image_free(img);
    return -1;
  }
  img->reduction = reduction;
  return 0;
}

void image_crop_resize(const Image *img, CropBox box, int out_h, int out_w, float *out) {
  // A reduced decode's pixel i covers the source's [i r, (i + 1) r): the box scales by 1/r.
  const float r = (float)img->reduction;
  float y0 = (float)box.y0 / r, x0 = (float)box.x0 / r, h = (float)box.h / r, w = (float)box.w / r;
  if (y0 + h > (float)img->h) h = (float)img->h - y0;
  if (x0 + w > (float)img->w) w = (float)img->w - x0;
  image_resample_box(img->pixels, img->h, img->w, img->c, y0, x0, h, w, out, out_h, out_w);
}

CropBox eval_crop_box(int h, int w) {
  const int side = h < w ? h : w;
  return (CropBox){(h - side) / 2, (w - side) / 2, side, side};
}

int dataset_eval_pixels(const Dataset *ds, int index, int out_size, float *out) {
  int h, w;
  dataset_source_size(ds, index, &h, &w);
  const CropBox box = eval_crop_box(h, w);
  const int reduction = dataset_max_reduction(ds, index) > 1
                            ? image_reduction_for(box.h, box.w, out_size, out_size)
                            : 1;
  Image img;
  if (dataset_image(ds, index, reduction, &img) != 0) return -1;
  image_crop_resize(&img, box, out_size, out_size, out);
  image_free(&img);
  return 0;
}

// Streamed: the evaluation views of an even sample, each image's sums kept apart and added in
// image order.
static int sampled_channel_stats(const Dataset *ds, float *mean, float *std) {
  const int m = ds->n < DATASET_STATS_SAMPLE ? ds->n : DATASET_STATS_SAMPLE, c = ds->c;
  const size_t values = (size_t)ds->h * ds->w * c;
  double *sums = calloc((size_t)m * c * 2, sizeof *sums);
  if (!sums) TL_DIE("out of memory");
  int first_failed = INT_MAX;
  char *first_error = NULL;
#pragma omp parallel
  {
    float *px = malloc(sizeof *px * values);
    if (!px) TL_DIE("out of memory");
#pragma omp for schedule(dynamic)
    for (int k = 0; k < m; k++) {
      const int index = (int)((long long)k * ds->n / m);
      if (dataset_eval_pixels(ds, index, ds->h, px) != 0) {
#pragma omp critical(dataset_stats_error)
        if (k < first_failed) {
          first_failed = k;
          free(first_error);
          if (!(first_error = strdup(tl_last_error()))) TL_DIE("out of memory");
        }
        continue;
      }
      double *s = sums + (size_t)k * c * 2;
      for (size_t i = 0; i < values; i++) {
        double v = fmin(fmax(px[i] / 255.0, 0.0), 1.0);
        s[2 * (i % c)] += v;
        s[2 * (i % c) + 1] += v * v;
      }
    }
    free(px);
  }
  if (first_failed != INT_MAX) {
    tl_fail("%s", first_error);
    free(first_error);
    free(sums);
    return -1;
  }
  const double count = (double)m * ds->h * ds->w;
  for (int ch = 0; ch < c; ch++) {
    double sum = 0, sum_sq = 0;
    for (int k = 0; k < m; k++) {
      sum += sums[((size_t)k * c + ch) * 2];
      sum_sq += sums[((size_t)k * c + ch) * 2 + 1];
    }
    double mu = sum / count, var = sum_sq / count - mu * mu;
    mean[ch] = (float)mu;
    std[ch] = (float)sqrt(var > 0 ? var : 0);
  }
  free(sums);
  return 0;
}

int dataset_channel_stats(const Dataset *ds, float *mean, float *std) {
  if (!ds->pixels) return sampled_channel_stats(ds, mean, std);
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
  return 0;
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

// Along an axis of `len` pixels, the crop [crop_start, crop_start + crop_len) (fractional when a
// box chosen on the source is mapped onto a reduced decode).
static Taps axis_taps(int o, int out_len, float crop_start, float crop_len, int len) {
  Taps t;
  float scale = crop_len / (float)out_len;
  float half_width = scale > 1.0f ? scale : 1.0f;
  t.inv_half_width = 1.0f / half_width;
  t.centre = crop_start + ((float)o + 0.5f) * scale;
  int lo = (int)floorf(t.centre - half_width - 0.5f) + 1;
  int hi = (int)ceilf(t.centre + half_width - 0.5f);
  // Clamping to the crop (not the image) is what makes this equal to crop-then-resize.
  const int first = (int)floorf(crop_start), end = (int)ceilf(crop_start + crop_len);
  t.lo = lo > first ? lo : first;
  t.hi = hi < end ? hi : end;
  if (t.lo < 0) t.lo = 0;
  if (t.hi > len) t.hi = len;
  t.weight_sum = 0;
  for (int i = t.lo; i < t.hi; i++) t.weight_sum += tap_weight(&t, i);
  if (!(t.weight_sum > 0)) {  // a sliver of a pixel: its nearest pixel
    t.lo = (int)t.centre < len ? (int)t.centre : len - 1;
    t.hi = t.lo + 1;
    t.inv_half_width = 0;
    t.weight_sum = 1;
  }
  return t;
}

void image_resample_box(const uint8_t *src, int h, int w, int c, float y0, float x0, float crop_h,
                        float crop_w, float *out, int out_h, int out_w) {
  const float slack = 1e-3f;  // a box mapped from another size may overshoot by a rounding
  TL_ASSERT(y0 >= 0 && x0 >= 0 && crop_h > 0 && crop_w > 0 && y0 + crop_h <= h + slack &&
            x0 + crop_w <= w + slack);
  // Column taps are shared by every row: computed once per chunk of columns, kept on the stack.
  enum { COLUMN_CHUNK = 64 };
  Taps column_taps[COLUMN_CHUNK];
  for (int ox0 = 0; ox0 < out_w; ox0 += COLUMN_CHUNK) {
    const int n_cols = out_w - ox0 < COLUMN_CHUNK ? out_w - ox0 : COLUMN_CHUNK;
    for (int k = 0; k < n_cols; k++) column_taps[k] = axis_taps(ox0 + k, out_w, x0, crop_w, w);
    for (int oy = 0; oy < out_h; oy++) {
      const Taps ty = axis_taps(oy, out_h, y0, crop_h, h);
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

void image_resample_bilinear(const uint8_t *src, int h, int w, int c, int y0, int x0, int crop_h,
                             int crop_w, float *out, int out_h, int out_w) {
  TL_ASSERT(y0 >= 0 && x0 >= 0 && crop_h > 0 && crop_w > 0 && y0 + crop_h <= h && x0 + crop_w <= w);
  image_resample_box(src, h, w, c, (float)y0, (float)x0, (float)crop_h, (float)crop_w, out, out_h,
                     out_w);
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
