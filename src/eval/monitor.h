// The kNN monitor: encodes the training set (memory bank) and the test set with an inference
// copy of the online backbone (running BatchNorm statistics, parameters shared, not copied) and
// reports weighted kNN top-1, plus the same on raw pixels as a baseline. At every evaluation it
// also measures what needs no labels (eval/quality.h) on a fixed sample of the training images;
// without a test set (unlabeled data) that is all it does.
#pragma once
#include <signal.h>
#include <stdio.h>
#include <stdint.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "eval/quality.h"
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
  uint64_t seed;  // the probe's validation split and the quality sample
} MonitorSettings;

// The label-free quality reads this many training images (all, when there are fewer): enough
// rows for the Gram matrix of a 512-wide feature, a few seconds of encoding at most.
enum { MONITOR_QUALITY_IMAGES = 1024 };

typedef struct {
  MonitorSettings set;
  const Dataset *train, *test;  // test NULL: no labels, no kNN
  const AugmentParams *aug;
  int labeled;          // a test set to vote on: kNN; else only the label-free quality
  int n_train, n_test;  // images used (memory bank may be limited by eval.knn_train_limit); 0
                        // unlabeled
  int batch;            // images per inference forward
  ExecCtx ctx;          // its own context, so evaluation never disturbs training's counters
  ParamSet bound;       // bound to the online backbone's parameters
  Backbone *encoder;    // OP_INFER, N = batch
  float *images;        // (batch, S, S, C) MEM_EVAL
  float *train_feat;    // (n_train, D) MEM_EVAL, NULL unlabeled
  float *test_feat;     // (n_test, D) MEM_EVAL, NULL unlabeled
  // The quality sample: MONITOR_QUALITY_IMAGES training images drawn from train.seed, the same
  // at every evaluation of a run (and of its resumption).
  int n_quality;
  int *quality_index;   // (n_quality) ascending, MEM_EVAL
  float *quality_feat;  // (n_quality, D) MEM_EVAL
  // When set and nonzero (a stop signal), an evaluation ends between batches, cancelled.
  volatile sig_atomic_t *cancel;
} KnnMonitor;

typedef struct {
  double top1;      // k = knn_k; NaN unlabeled
  double top1_k20;  // k = 20, for comparison with published monitors; NaN unlabeled
  int knn_k;        // eval.knn_k, at most the bank's smallest class (knn_k_for_bank); 0 unlabeled
  double linear_top1;        // linear probe (eval.linear = 1), else NaN
  EmbeddingQuality quality;  // on the quality sample (NaN for raw pixels, or when not finite)
  double seconds;
  int cancelled;  // *cancel ended it: no result
  int failed;     // an image could not be decoded (tl_last_error() names it): no result
} KnnResult;

// `params` is the online ParamSet; its first backbone_param_count floats are the backbone's.
// `test` NULL: unlabeled training data, the label-free quality only.
void knn_monitor_init(KnnMonitor *m, const MonitorSettings *set, const Dataset *train,
                      const Dataset *test, const AugmentParams *aug, float *params);
KnnResult knn_monitor_run(KnnMonitor *m);
// kNN on normalized raw pixels (the baseline a representation must beat); labeled only.
KnnResult knn_monitor_raw_pixels(KnnMonitor *m);
// For `tally plan`: grows the monitor's scratchpad as knn_monitor_run does and returns the
// MEM_EVAL bytes a run holds at its peak beyond what the monitor keeps.
size_t knn_monitor_reserve_run(KnnMonitor *m);
void knn_monitor_destroy(KnnMonitor *m);

// One line of a run's eval.jsonl, which `tally report` reads: {"step", "what" ("encoder" or
// "raw_pixels"), "source" (only when given: "tally eval"), "knn_top1", "knn_top1_k20", "knn_k"
// (null without labels), "linear_top1" (when measured), then, for the encoder, "rankme",
// "embedding_std", "embedding_std_reference", "collapsed"; and "seconds"}. The training monitor
// and `tally eval` both write through it.
void knn_result_write_line(FILE *f, long step, const char *what, const char *source,
                           const KnnResult *r);
