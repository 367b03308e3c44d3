// The weighted kNN monitor (InstDisc / SimCLR / MoCo style): cosine similarity of each test
// feature to a bank of training features, the k most similar vote for their class with weight
// exp(sim / temperature), the heaviest class is the prediction. Callers' features are not
// modified: L2-normalized copies are made (MEM_EVAL).
#pragma once
#include <stddef.h>

#include "core/exec_ctx.h"

// Top-1 accuracy in [0, 1], or -1 with tl_last_error() set on bad input (non-positive sizes,
// k or temperature, a label outside [0, n_classes)). k larger than n_train is clamped to n_train.
// Rows are normalized (ops/l2norm.h) and similarities computed by oneDNN matmul in blocks of test
// rows; their FLOPs are added to ctx->flops_forward[COMP_OTHER].
double knn_top1(const float *train_feat /*(n_train, d)*/, const int *train_labels, int n_train,
                const float *test_feat /*(n_test, d)*/, const int *test_labels, int n_test, int d,
                int n_classes, int k, float temperature, ExecCtx *ctx);

// Several k in one pass (e.g. k = 200 and k = 20): the neighbours are selected once for the
// largest k. accuracy (n_k) receives one accuracy per k; predictions (n_k, n_test) may be NULL.
// Returns 0, or -1 with tl_last_error() set (same rules as knn_top1).
int knn_top1_multi(const float *train_feat /*(n_train, d)*/, const int *train_labels, int n_train,
                   const float *test_feat /*(n_test, d)*/, const int *test_labels, int n_test,
                   int d, int n_classes, const int *ks, int n_k, float temperature, ExecCtx *ctx,
                   double *accuracy, int *predictions);

// The k a vote on this bank uses: k, but at most a tenth of the training images of the bank's
// smallest class, and never fewer than 20 or that whole class when it is smaller (classes with
// none are not counted), at least 1. A query of a class with fewer images than k has at most that
// many neighbours of its own class among k, and a k near a class's size lets almost the whole
// class vote, distant images with the near. Measured on Fashion-MNIST (1,440 training images,
// 134 to 156 a class, an encoder trained 60 steps): kNN top-1 0.600 at k = 200, 0.638 at
// k = 134, 0.706 at k = 20; handwritten digits (about 143 a class): 0.731 at k = 133 against
// 0.892 at k = 20. With 6,000 a class (all of Fashion-MNIST) k = 200 stands.
int knn_k_for_bank(int k, const int *train_labels, int n_train, int n_classes);

// MEM_EVAL bytes a call holds at its peak (the normalized bank, one block of normalized test rows
// and its similarity rows); the oneDNN scratchpad is the context's (MEM_WORKSPACE).
size_t knn_eval_bytes(int n_train, int n_test, int d);
// Grows ctx's scratchpad as a call with these sizes would (its matmul primitives are created and
// destroyed), so `tally plan` sees the scratchpad an evaluation leaves behind.
void knn_reserve_scratchpad(ExecCtx *ctx, int n_train, int n_test, int d);
