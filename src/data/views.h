// The views an objective trains on, declared as groups: each group is `count` views of every
// image at its own size and augmentation (SimCLR and MoCo: one group of 2; MAE: one of 1; DINO's
// multi-crop: 2 global crops and several small local ones; BYOL's asymmetric pair: two groups of
// 1). The loader prepares them, a Batch carries them, the plan sizes them.
#pragma once
#include <stddef.h>

#include "data/augment.h"

enum { VIEW_MAX_GROUPS = 4 };

typedef struct {
  int count;          // views of each image
  AugmentParams aug;  // its augmentation; aug.out_size is the group's side in pixels
} ViewGroup;

typedef struct {
  int n_groups;
  ViewGroup group[VIEW_MAX_GROUPS];
} ViewRecipe;

// One group of `count` views under `aug`.
static inline ViewRecipe view_recipe_single(const AugmentParams *aug, int count) {
  ViewRecipe r = {.n_groups = 1};
  r.group[0] = (ViewGroup){.count = count, .aug = *aug};
  return r;
}

// Views of one image over every group.
static inline int view_recipe_count(const ViewRecipe *r) {
  int n = 0;
  for (int g = 0; g < r->n_groups; g++) n += r->group[g].count;
  return n;
}

// Floats of one image's views over every group, at `channels`.
static inline size_t view_recipe_floats(const ViewRecipe *r, int channels) {
  size_t n = 0;
  for (int g = 0; g < r->n_groups; g++) {
    const size_t side = (size_t)r->group[g].aug.out_size;
    n += (size_t)r->group[g].count * side * side * (size_t)channels;
  }
  return n;
}
