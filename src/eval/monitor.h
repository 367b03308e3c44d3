// The kNN monitor: encodes the training set (memory bank) and the test set with an inference
// copy of the online backbone (running BatchNorm statistics, parameters shared, not copied) and
// reports weighted kNN top-1, plus the same on raw pixels as a baseline.
#pragma once
#include <signal.h>
#include <stdint.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "nn/backbone.h"

// What the monitor needs of a run: the encoder and the evaluation settings ([eval]).
typedef struct {
  const ModelSpec *spec;  // the backbone the monitor builds for inference
  int image_size, channels;
  int batch;        // images per inference forward
  int train_limit;  // memory bank: the first N training images; 0 = all
  int k;            // neighbours that vote (k = 20 is reported too)
  float temperature;
  int linear;     // also fit a linear probe at each evaluation
  uint64_t seed;  // the probe's validation split
} MonitorSettings;

typedef struct {
  MonitorSettings set;
  const Dataset *train, *test;
  const AugmentParams *aug;
  int n_train, n_test;  // images used (memory bank may be limited by eval.knn_train_limit)
  int batch;            // images per inference forward
  DnnlCtx ctx;          // its own context, so evaluation never disturbs training's counters
  ParamSet bound;       // bound to the online backbone's parameters
  Backbone *encoder;    // OP_INFER, N = batch
  float *images;        // (batch, S, S, C) MEM_EVAL
  float *train_feat;    // (n_train, D) MEM_EVAL
  float *test_feat;     // (n_test, D) MEM_EVAL
  // When set and nonzero (a stop signal), an evaluation ends between batches, cancelled.
  volatile sig_atomic_t *cancel;
} KnnMonitor;

typedef struct {
  double top1;         // k = eval.knn_k
  double top1_k20;     // k = 20, for comparison with published monitors
  double linear_top1;  // linear probe (eval.linear = 1), else NaN
  double seconds;
  int cancelled;  // *cancel ended it: no result
  int failed;     // an image could not be decoded (tl_last_error() names it): no result
} KnnResult;

// `params` is the online ParamSet; its first backbone_param_count floats are the backbone's.
void knn_monitor_init(KnnMonitor *m, const MonitorSettings *set, const Dataset *train,
                      const Dataset *test, const AugmentParams *aug, float *params);
KnnResult knn_monitor_run(KnnMonitor *m);
// kNN on normalized raw pixels (the baseline a representation must beat).
KnnResult knn_monitor_raw_pixels(KnnMonitor *m);
void knn_monitor_destroy(KnnMonitor *m);
