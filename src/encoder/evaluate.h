// `tally eval`: how good a trained encoder's features are on a labeled dataset — weighted kNN
// (k = 200, or the smallest class's size when smaller, and 20, cosine, as the training monitor)
// and a linear probe on frozen features — next to the same measures on raw pixels, the baseline
// a representation must beat.
#pragma once
#include <stdio.h>

#include "eval/monitor.h"
#include "encoder/features.h"

typedef struct {
  int knn, linear;  // which measures to run
  int baseline;     // 1: each also on raw pixels
  int quiet;        // no progress lines
} EvalOptions;

typedef struct {
  int n_train, n_test, n_classes, feature_dim;
  // The measures as the training monitor takes them (eval/monitor.h), so both write one eval.jsonl
  // line: kNN top-1 at k = knn_k (eval.knn_k, at most the smallest class's training images; 0
  // without kNN) and at 20, the linear probe, and on the encoder the label-free quality of the
  // training set's embeddings (eval/quality.h) and the whole evaluation's seconds. NaN: not taken.
  KnnResult encoder, raw_pixels;
  double linear_lambda, linear_lambda_raw_pixels;  // the probes' chosen L2 strengths
} EvalResult;

// Encodes e's configured training set (the kNN memory bank, the probe's training rows) and test
// set — [eval] train and test when the run's monitor had a set of its own, else [data]'s — and
// scores them. Measures not asked for are NaN. -1 with tl_last_error() on bad data
// (missing files, a test class the training set does not have).
int evaluate_encoder(FeatureEncoder *e, const EvalOptions *opt, EvalResult *r);

// Records r in the run folder `dir`'s eval.jsonl as one more evaluation of its encoder after
// `step` steps, in the training monitor's format marked "source":"tally eval", so `tally report`
// shows it beside the monitor's. Under the folder's lock (a training run holds it for as long as
// it lives: then nothing is written), by writing the file whole again beside it and renaming it
// into place (io/atomic_file.h): a crash leaves the old file or the new one, and a cut-off last
// line (a killed run's) is dropped rather than joined to the record. 1 (tl_last_error() set)
// when a run holds the folder, -1 with tl_last_error() when the record cannot be written.
int evaluate_record(const char *dir, long step, const EvalResult *r);

// r as `tally eval` prints it to f: a table of the encoder's measures beside the raw pixels', the
// label-free ones and a warning when the embeddings have collapsed; with `json`, one JSON object
// (knn_top1, linear_top1, rankme, embedding_std, collapsed, seconds, ...).
void evaluate_print(FILE *f, const FeatureEncoder *enc, const EvalResult *r, int json);
