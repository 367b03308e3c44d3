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

// The visible patch indices of the last step, (local_batch, n_keep), and n_keep.
const int *mae_last_keep(const Objective *o, int *n_keep);
// Tokens the encoder processed per image in the last step (cls included).
int mae_encoder_tokens(const Objective *o);
