// The linear probe: multinomial logistic regression trained to convergence on frozen features,
// the standard measure of how linearly separable a representation's classes are.
//   loss(W, b) = (1/n) sum_i -log softmax(W x_i + b)[y_i] + (lambda / 2) ||W||^2   (b unpenalised)
// Full batch, deterministic L-BFGS, preconditioned by the features' second moment (one (d, d) Gram
// product per call, one O(d^3) Cholesky factorisation per lambda: fine up to a few thousand d).
// Features are standardised per dimension with the training rows' mean and std; lambda is chosen
// on a held-out tenth of the training rows, then the probe is refitted on all of them and scored
// on the test rows. The products with the features run as oneDNN matmuls; their FLOPs are added to
// ctx->flops_forward[COMP_OTHER]. Memory (MEM_EVAL): standardised copies of the training and test
// rows, and two (d + 1, d + 1) double matrices.
// K = n_classes, d = feature dimension.
#pragma once
#include <stdint.h>

#include "core/exec_ctx.h"

// The L2 strengths searched, smallest first. The search runs largest first, each fit warm-started
// from the previous one, and a tie in validation accuracy keeps the larger lambda.
enum { LINEAR_PROBE_N_LAMBDAS = 6 };
extern const double linear_probe_lambdas[LINEAR_PROBE_N_LAMBDAS];

typedef struct {
  double test_top1;  // accuracy on the test rows, in [0, 1]
  double val_top1;   // validation accuracy of the chosen lambda (the best of the search)
  double lambda;     // chosen L2 strength
  double val_top1_by_lambda[LINEAR_PROBE_N_LAMBDAS];  // same order as linear_probe_lambdas
  int iterations;  // L-BFGS iterations of the final fit on all training rows
  int converged;   // the final fit met its gradient test (else it stopped at its budget)
  double seconds;  // wall time of the whole call
} LinearProbeResult;

// The whole probe in one call; the callers' arrays are not modified. Returns 0, or -1 with
// tl_last_error() set on bad input: non-positive sizes, n_train < 10 (no validation tenth),
// a label outside [0, n_classes), a non-finite feature. The seed fixes the validation split.
int linear_probe(const float *train_feat /*(n_train, d)*/, const int *train_labels, int n_train,
                 const float *test_feat /*(n_test, d)*/, const int *test_labels, int n_test, int d,
                 int n_classes, uint64_t seed, ExecCtx *ctx, LinearProbeResult *out);

// The pieces, on features used as given (no standardisation). Parameters are one vector
// params (K * d + K): W (K, d) row-major, then b (K).

// The loss above into *loss and its gradient into grad (K * d + K). Returns 0 or -1 (bad sizes or
// labels, lambda < 0).
int linear_probe_loss_grad(const float *x /*(n, d)*/, const int *labels, int n, int d,
                           int n_classes, double lambda, const double *params, ExecCtx *ctx,
                           double *loss, double *grad);

// Minimises the loss by L-BFGS starting from params (zeros: a cold start), which receive the
// result; the preconditioner is built from x. Stops when max |grad| < grad_tol * max(1, |loss|)
// (*converged = 1), after max_iter iterations, or when the line search can make no more progress
// (both *converged = 0). Returns the iterations taken, or -1 with tl_last_error() set (as
// linear_probe_loss_grad, or max_iter < 1).
int linear_probe_fit(const float *x /*(n, d)*/, const int *labels, int n, int d, int n_classes,
                     double lambda, int max_iter, double grad_tol, ExecCtx *ctx, double *params,
                     int *converged);
