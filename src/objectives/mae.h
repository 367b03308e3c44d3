// MAE's masking, exposed for tests and for the reconstruction grid.
#pragma once
#include <stdint.h>

#include "objectives/objective.h"

// MAE's random_masking for one image: per-patch noise from (seed, step, image index), argsort,
// keep the first n_keep patches. keep (n_keep) receives the kept patch indices in noise order;
// masked (n_patches) receives 1 for masked patches and 0 for visible ones.
void mae_random_mask(uint64_t seed, long step, int image_index, int n_patches, int n_keep,
                     int *keep, unsigned char *masked);
int mae_keep_count(int n_patches, float mask_ratio);

// MAE's loss: the mean over masked patches of the per-patch mean squared error. pred is
// (n_images, rows_per_image, dim) with patch p of image i at row first_row + p (the decoder's
// cls row, if any, comes first); target is (n_images, n_patches, dim) and, with norm_pix, is
// first normalized per patch by its own mean and unbiased variance, in place. dpred (pred's
// layout) receives d(sum / n_masked)/dpred, zero on visible patches. Returns the sum of the
// masked patches' errors; *n_masked receives their count.
double mae_masked_mse(const float *pred, int rows_per_image, int first_row, float *target,
                      const unsigned char *masked, int n_images, int n_patches, int dim,
                      int norm_pix, float *dpred, long *n_masked);

// The visible patch indices of the last step, (local_batch, n_keep), and n_keep.
const int *mae_last_keep(const Objective *o, int *n_keep);
// Tokens the encoder processed per image in the last step (cls included).
int mae_encoder_tokens(const Objective *o);
