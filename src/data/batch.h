// What one step trains on: this replica's shard of the global batch, as the loader delivers it
// (or, for a plan, a stand-in of the same size).
#pragma once

typedef struct {
  int global_step;  // step this batch belongs to
  int epoch;        // epoch it was drawn from
  int n;            // samples in this replica's shard
  int n_views;      // views per sample
  float *views;     // (n_views, n, S, S, C): view-major, so view 0 of all samples comes first
  int *indices;     // (n) dataset indices
  int *labels;      // (n)
} Batch;
