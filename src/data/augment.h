// Views of images as float tensors: the SSL augmentations (random resized crop, flip,
// brightness/contrast jitter, colour jitter / random grayscale for RGB, optional solarization and
// Gaussian blur), and the plain evaluation transform. All randomness comes from a counter-based
// stream keyed by (seed, step, sample index, view), so a view is the same whichever thread or
// replica makes it.
#pragma once
#include <stdint.h>

#include "core/rng.h"
#include "data/dataset.h"

typedef struct {
  int out_size;                          // output is out_size x out_size
  float crop_scale_min, crop_scale_max;  // fraction of the image area
  float crop_ratio_min, crop_ratio_max;  // aspect ratio range, 3/4 .. 4/3
  float flip_prob;
  float jitter_strength;  // brightness and contrast factors in [1-s, 1+s]
  float jitter_prob;
  float grayscale_prob;   // RGB only
  float solarize_prob;    // x -> 1 - x where x >= 0.5 (BYOL's solarization)
  float blur_prob;        // Gaussian blur, sigma uniform in [0.1, 2] px (augment_blur_kernel)
  float mean[3], std[3];  // normalization applied last
} AugmentParams;

// One augmented view of image `index`, written as (out_size, out_size, c) floats (HWC): the crop
// box chosen in the source image's own coordinates, only the box resized to out_size. -1 with
// tl_last_error() when a streamed image cannot be decoded.
int augment_view(const Dataset *ds, int index, const AugmentParams *p, Rng *rng, float *out);

// augment_view in its two halves, so one decode serves several views of an image: the random
// resized crop box in an h x w source (the view's first draws from rng), then the view rendered
// from the decoded image with the draws that follow.
CropBox augment_crop_box(int h, int w, const AugmentParams *p, Rng *rng);
void augment_render(const Image *img, CropBox box, const AugmentParams *p, Rng *rng, float *out);
// The reduction to decode image `index` at for these boxes: the largest that keeps every box at
// least out_size a side (1 unless it is a streamed JPEG).
int augment_reduction(const Dataset *ds, int index, const CropBox *boxes, int n_boxes,
                      int out_size);

// SimCLR's blur kernel side for an image side: 10% of it, odd, at least 3.
int augment_blur_kernel(int size);
// Separable Gaussian blur of an (size, size, c) image in place, reflecting at the borders
// (torchvision's gaussian_blur); kernel <= 410, size * c <= 4096 * 3 (the largest image_size).
void gaussian_blur(float *img, int size, int c, int kernel, float sigma);

// The evaluation transform: the centred square of the short side resized to out_size (bilinear,
// antialiased when shrinking; torchvision's Resize then CenterCrop), normalized. (HWC floats.)
// -1 with tl_last_error() when a streamed image cannot be decoded.
int eval_view(const Dataset *ds, int index, const AugmentParams *p, float *out);
// eval_view of images start .. start + count - 1 into out (count, out_size, out_size, c), in
// parallel; the error is the first failing image's.
int eval_views(const Dataset *ds, int start, int count, const AugmentParams *p, float *out);
// The same for the images index[0 .. count - 1].
int eval_views_at(const Dataset *ds, const int *index, int count, const AugmentParams *p,
                  float *out);
