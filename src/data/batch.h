// What one step trains on: this replica's shard of the global batch, as the loader delivers it
// (or, for a plan, a stand-in of the same size).
#pragma once
#include "data/views.h"

// One view group's part of a batch: `count` views of each sample, `size` pixels a side.
typedef struct {
  int count, size;
  float *views;  // (count, n, size, size, C), inside Batch.views
} BatchGroup;

typedef struct {
  int global_step;  // step this batch belongs to
  int epoch;        // epoch it was drawn from
  int n;            // samples in this replica's shard
  int n_views;      // views per sample, over every group
  // Every group's views, group after group, each view-major: (count, n, size, size, C), so view
  // 0 of all samples comes first. Groups of one size are one contiguous block.
  float *views;
  int n_groups;
  BatchGroup group[VIEW_MAX_GROUPS];
  int *indices;  // (n) dataset indices
  int *labels;   // (n)
} Batch;

// Points the groups of a batch of n samples at their parts of `views` (laid out as above).
static inline void batch_set_groups(Batch *b, const ViewRecipe *r, int channels) {
  b->n_views = view_recipe_count(r);
  b->n_groups = r->n_groups;
  float *at = b->views;
  for (int g = 0; g < r->n_groups; g++) {
    const int side = r->group[g].aug.out_size;
    b->group[g] = (BatchGroup){r->group[g].count, side, at};
    if (at) at += (size_t)r->group[g].count * b->n * side * side * channels;
  }
}
