// The SimCLR family of views, following torchvision's RandomResizedCrop, RandomHorizontalFlip,
// ColorJitter and RandomGrayscale, on float images in [0, 1] (HWC).
#include "data/augment.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stddef.h>

#include "core/error.h"

enum { CROP_ATTEMPTS = 10 };

// ITU-R 601 luma, the weights torchvision's rgb_to_grayscale uses.
static const float luma_weights[3] = {0.2989f, 0.587f, 0.114f};

static float clamp_unit(float v) { return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v; }

static float luminance(const float *px, int c) {
  if (c == 1) return px[0];
  return luma_weights[0] * px[0] + luma_weights[1] * px[1] + luma_weights[2] * px[2];
}

// A box of random area fraction and log-uniform aspect ratio; after CROP_ATTEMPTS boxes that do
// not fit, the centred box closest to the ratio range (torchvision's get_params).
CropBox augment_crop_box(int img_h, int img_w, const AugmentParams *p, Rng *rng) {
  const float area = (float)img_h * (float)img_w;
  const float log_ratio_min = logf(p->crop_ratio_min), log_ratio_max = logf(p->crop_ratio_max);
  for (int attempt = 0; attempt < CROP_ATTEMPTS; attempt++) {
    float target_area = area * rng_uniform_range(rng, p->crop_scale_min, p->crop_scale_max);
    float ratio = expf(rng_uniform_range(rng, log_ratio_min, log_ratio_max));
    int w = (int)lrintf(sqrtf(target_area * ratio));
    int h = (int)lrintf(sqrtf(target_area / ratio));
    if (w > 0 && w <= img_w && h > 0 && h <= img_h) {
      int y0 = (int)rng_below(rng, (uint32_t)(img_h - h + 1));
      int x0 = (int)rng_below(rng, (uint32_t)(img_w - w + 1));
      return (CropBox){y0, x0, h, w};
    }
  }
  float img_ratio = (float)img_w / (float)img_h;
  int w = img_w, h = img_h;
  if (img_ratio < p->crop_ratio_min)
    h = (int)lrintf((float)w / p->crop_ratio_min);
  else if (img_ratio > p->crop_ratio_max)
    w = (int)lrintf((float)h * p->crop_ratio_max);
  if (h < 1) h = 1;
  if (w < 1) w = 1;
  return (CropBox){(img_h - h) / 2, (img_w - w) / 2, h, w};
}

static void to_unit(float *out, size_t n_values) {
  for (size_t i = 0; i < n_values; i++) out[i] = clamp_unit(out[i] / 255.0f);
}

static void normalize(float *img, int n_pixels, int c, const AugmentParams *p) {
  for (int i = 0; i < n_pixels; i++)
    for (int ch = 0; ch < c; ch++) img[i * c + ch] = (img[i * c + ch] - p->mean[ch]) / p->std[ch];
}

static void flip_horizontal(float *img, int size, int c) {
  for (int y = 0; y < size; y++) {
    float *row = img + (size_t)y * size * c;
    for (int l = 0, r = size - 1; l < r; l++, r--)
      for (int ch = 0; ch < c; ch++) {
        float t = row[l * c + ch];
        row[l * c + ch] = row[r * c + ch];
        row[r * c + ch] = t;
      }
  }
}

// img <- clamp(factor * img + (1 - factor) * reference), where the reference is 0 (brightness),
// the mean luminance of the image (contrast) or each pixel's own luminance (saturation).
typedef enum { JITTER_BRIGHTNESS, JITTER_CONTRAST, JITTER_SATURATION } JitterKind;

static void jitter(float *img, int n_pixels, int c, JitterKind kind, float factor) {
  float image_mean = 0;
  if (kind == JITTER_CONTRAST) {
    double sum = 0;
    for (int i = 0; i < n_pixels; i++) sum += luminance(img + (size_t)i * c, c);
    image_mean = (float)(sum / n_pixels);
  }
  for (int i = 0; i < n_pixels; i++) {
    float *px = img + (size_t)i * c;
    float reference = kind == JITTER_BRIGHTNESS ? 0.0f
                      : kind == JITTER_CONTRAST ? image_mean
                                                : luminance(px, c);
    for (int ch = 0; ch < c; ch++)
      px[ch] = clamp_unit(factor * px[ch] + (1.0f - factor) * reference);
  }
}

static void to_grayscale(float *img, int n_pixels) {
  for (int i = 0; i < n_pixels; i++) {
    float *px = img + (size_t)i * 3;
    px[0] = px[1] = px[2] = luminance(px, 3);
  }
}

// Colour jitter in a random order of its operations, each factor uniform in [1-s, 1+s].
static void color_jitter(float *img, int n_pixels, int c, float strength, Rng *rng) {
  JitterKind order[3] = {JITTER_BRIGHTNESS, JITTER_CONTRAST, JITTER_SATURATION};
  const int n_kinds = c == 3 ? 3 : 2;  // saturation means nothing on gray images
  for (int k = n_kinds - 1; k > 0; k--) {
    int j = (int)rng_below(rng, (uint32_t)(k + 1));
    JitterKind t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  float lo = 1.0f - strength > 0.0f ? 1.0f - strength : 0.0f;
  for (int k = 0; k < n_kinds; k++)
    jitter(img, n_pixels, c, order[k], rng_uniform_range(rng, lo, 1.0f + strength));
}

static void solarize(float *img, size_t n_values) {
  for (size_t i = 0; i < n_values; i++)
    if (img[i] >= 0.5f) img[i] = 1.0f - img[i];
}

int augment_blur_kernel(int size) {
  int k = size / 10 / 2 * 2 + 1;
  return k < 3 ? 3 : k;
}

static int reflect(int i, int n) {
  if (n == 1) return 0;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
  return i;
}

// One 1-D pass along a line of n pixels (c values each, `stride` values apart), reflecting at
// the ends; `line` holds a copy of the input line.
static void blur_line(float *img, int n, int c, size_t stride, const float *w, int r, float *line) {
  for (int i = 0; i < n; i++)
    for (int ch = 0; ch < c; ch++) line[i * c + ch] = img[(size_t)i * stride + ch];
  for (int i = 0; i < n; i++)
    for (int ch = 0; ch < c; ch++) {
      float acc = 0;
      for (int k = -r; k <= r; k++) acc += w[k + r] * line[reflect(i + k, n) * c + ch];
      img[(size_t)i * stride + ch] = acc;
    }
}

void gaussian_blur(float *img, int size, int c, int kernel, float sigma) {
  enum { MAX_SIDE = 4096, MAX_KERNEL = MAX_SIDE / 10 + 1, MAX_LINE = MAX_SIDE * 3 };
  TL_ASSERT(kernel % 2 == 1 && kernel <= MAX_KERNEL && sigma > 0 && size * c <= MAX_LINE);
  const int r = kernel / 2;
  float w[MAX_KERNEL], line[MAX_LINE];
  float sum = 0;
  for (int k = -r; k <= r; k++) sum += w[k + r] = expf(-0.5f * (float)(k * k) / (sigma * sigma));
  for (int k = 0; k < kernel; k++) w[k] /= sum;
  for (int y = 0; y < size; y++) blur_line(img + (size_t)y * size * c, size, c, c, w, r, line);
  for (int x = 0; x < size; x++)
    blur_line(img + (size_t)x * c, size, c, (size_t)size * c, w, r, line);
}

void augment_render(const Image *img, CropBox box, const AugmentParams *p, Rng *rng, float *out) {
  const int size = p->out_size, n_pixels = size * size, c = img->c;
  image_crop_resize(img, box, size, size, out);
  to_unit(out, (size_t)n_pixels * c);
  if (rng_uniform(rng) < p->flip_prob) flip_horizontal(out, size, c);
  if (rng_uniform(rng) < p->jitter_prob) color_jitter(out, n_pixels, c, p->jitter_strength, rng);
  if (c == 3 && rng_uniform(rng) < p->grayscale_prob) to_grayscale(out, n_pixels);
  // Drawn only when enabled, so recipes without them see the same views as before they existed.
  if (p->blur_prob > 0 && rng_uniform(rng) < p->blur_prob) {
    float sigma = rng_uniform_range(rng, 0.1f, 2.0f);
    gaussian_blur(out, size, c, augment_blur_kernel(size), sigma);
  }
  if (p->solarize_prob > 0 && rng_uniform(rng) < p->solarize_prob)
    solarize(out, (size_t)n_pixels * c);
  normalize(out, n_pixels, c, p);
}

int augment_reduction(const Dataset *ds, int index, const CropBox *boxes, int n_boxes,
                      int out_size) {
  if (dataset_max_reduction(ds, index) == 1) return 1;
  int r = 8;
  for (int k = 0; k < n_boxes; k++) {
    const int rk = image_reduction_for(boxes[k].h, boxes[k].w, out_size, out_size);
    if (rk < r) r = rk;
  }
  return r;
}

int augment_view(const Dataset *ds, int index, const AugmentParams *p, Rng *rng, float *out) {
  TL_ASSERT(p->crop_ratio_min > 0 && p->crop_ratio_max >= p->crop_ratio_min);
  int h, w;
  dataset_source_size(ds, index, &h, &w);
  const CropBox box = augment_crop_box(h, w, p, rng);
  Image img;
  if (dataset_image(ds, index, augment_reduction(ds, index, &box, 1, p->out_size), &img) != 0)
    return -1;
  augment_render(&img, box, p, rng, out);
  image_free(&img);
  return 0;
}

int eval_view(const Dataset *ds, int index, const AugmentParams *p, float *out) {
  if (dataset_eval_pixels(ds, index, p->out_size, out) != 0) return -1;
  to_unit(out, (size_t)p->out_size * p->out_size * ds->c);
  normalize(out, p->out_size * p->out_size, ds->c, p);
  return 0;
}

// Image i of a batch is index[i], or start + i when index is NULL.
static int views_of(const Dataset *ds, int start, const int *index, int count,
                    const AugmentParams *p, float *out) {
  const size_t floats = (size_t)p->out_size * p->out_size * ds->c;
  int first_failed = INT_MAX;
  char error[1024];
#pragma omp parallel for schedule(static)
  for (int i = 0; i < count; i++)
    if (eval_view(ds, index ? index[i] : start + i, p, out + (size_t)i * floats) != 0) {
#pragma omp critical(eval_views_error)
      if (i < first_failed) {
        first_failed = i;
        snprintf(error, sizeof error, "%s", tl_last_error());
      }
    }
  return first_failed == INT_MAX ? 0 : tl_fail("%s", error);
}

int eval_views(const Dataset *ds, int start, int count, const AugmentParams *p, float *out) {
  return views_of(ds, start, NULL, count, p, out);
}

int eval_views_at(const Dataset *ds, const int *index, int count, const AugmentParams *p,
                  float *out) {
  return views_of(ds, 0, index, count, p, out);
}
