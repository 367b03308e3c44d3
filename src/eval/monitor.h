// The kNN monitor: encodes the training set (memory bank) and the test set with an inference
// copy of the online backbone (running BatchNorm statistics, parameters shared, not copied) and
// reports weighted kNN top-1, plus the same on raw pixels as a baseline.
#pragma once
#include "config.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "nn/backbone.h"

typedef struct {
  const Config *cfg;
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
} KnnMonitor;

typedef struct {
  double top1;         // k = eval.knn_k
  double top1_k20;     // k = 20, for comparison with published monitors
  double linear_top1;  // linear probe (eval.linear = 1), else NaN
  double seconds;
} KnnResult;

// `params` is the online ParamSet; its first backbone_param_count floats are the backbone's.
void knn_monitor_init(KnnMonitor *m, const Config *cfg, const Dataset *train, const Dataset *test,
                      const AugmentParams *aug, float *params);
KnnResult knn_monitor_run(KnnMonitor *m);
// kNN on normalized raw pixels (the baseline a representation must beat).
KnnResult knn_monitor_raw_pixels(KnnMonitor *m);
void knn_monitor_destroy(KnnMonitor *m);
