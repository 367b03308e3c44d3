#include "eval/linear_probe.h"

#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "ops/matmul.h"

const double linear_probe_lambdas[LINEAR_PROBE_N_LAMBDAS] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1};

enum {
  LBFGS_MEMORY = 10,  // curvature pairs kept
  MAX_HALVINGS = 30,  // line search gives up below 2^-30 of the first step
  // Rows are summed in this many fixed blocks whose partial sums are added in block order, so the
  // loss and bias gradient do not depend on the thread count.
  SUM_BLOCKS = 64,
  MIN_TRAIN_ROWS = 10,  // the validation tenth must hold at least one row
};
static const double armijo_c1 = 1e-4;
// A dimension with a smaller std is constant up to rounding: it keeps scale 1 (as sklearn's
// StandardScaler does) rather than turning that rounding into huge feature values.
static const double std_floor = 1e-6;
// Stream for the validation split's shuffle (the loader's streams have c = 0).
static const uint64_t split_stream = 0x70726f6265;  // "probe"

typedef struct {
  int max_iter;
  double grad_tol;  // stop when max |grad| < grad_tol * max(1, |loss|)
} FitBudget;

// The search only has to rank lambdas, so its fits stop earlier than the final one. On
// Fashion-MNIST pixels, 3e-4 instead of 1e-4 moved no validation accuracy by more than 0.003 (the
// 6000 validation rows' standard error is 0.0045) and saved a third of the probe's time. A side
// effect: from the warm start, the smallest lambdas' fits may stop at once, tie with a larger
// lambda, and lose the tie.
static const FitBudget search_budget = {.max_iter = 100, .grad_tol = 3e-4};
static const FitBudget final_budget = {.max_iter = 300, .grad_tol = 1e-5};

typedef struct {
  int iterations;
  int converged;
} FitOutcome;

static size_t param_count(int d, int n_classes) { return (size_t)n_classes * ((size_t)d + 1); }

static double *alloc_doubles(size_t n) {
  return tl_alloc(sizeof(double) * n, MEM_EVAL, COMP_OTHER);
}
static float *alloc_floats(size_t n) { return tl_alloc(sizeof(float) * n, MEM_EVAL, COMP_OTHER); }

// Vectorised (the simd reduction may reorder the sum): the Cholesky factorisation and the
// triangular solves are made of these.
static double dot(const double *a, const double *b, size_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static double max_abs(const double *a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
  return m;
}

// ---- scores and loss ---------------------------------------------------------------------------

// X W^T for one fixed set of rows, its matmul built once for that row count. W is held (K, d):
// the gradient product is then (P - Y)^T X, which reads X row-major and measured 2x faster than
// X^T (P - Y) (10 ms vs 19 ms for 60000 x 784 on 2 cores).
typedef struct {
  const float *x;  // (n, d)
  int n, d, n_classes;
  Matmul product;  // (n, d) x (d, K), W (K, d) read transposed
  float *weights;  // (K, d), float copy of W for the matmul
  float *scores;   // (n, K)
} Scores;

static void scores_init(Scores *s, ExecCtx *ctx, const float *x, int n, int d, int n_classes) {
  *s = (Scores){.x = x, .n = n, .d = d, .n_classes = n_classes};
  matmul_init(&s->product, ctx, n, d, n_classes, 0, 1, COMP_OTHER, 0);
  s->weights = alloc_floats((size_t)n_classes * d);
  s->scores = alloc_floats((size_t)n * n_classes);
}

// scores = X W^T, without the bias.
static void scores_run(Scores *s, ExecCtx *ctx, const double *params) {
  const size_t kd = (size_t)s->n_classes * s->d;
  for (size_t i = 0; i < kd; i++) s->weights[i] = (float)params[i];
  matmul_run(&s->product, ctx, s->x, s->weights, s->scores);
}

static void scores_destroy(Scores *s) {
  matmul_destroy(&s->product);
  tl_free(s->weights);
  tl_free(s->scores);
}

// Fraction of rows whose highest score W x + b (the lowest class on ties) is their label.
static double top1(Scores *s, ExecCtx *ctx, const int *labels, const double *params) {
  const int K = s->n_classes;
  const double *bias = params + (size_t)K * s->d;
  scores_run(s, ctx, params);
  long correct = 0;
  for (int i = 0; i < s->n; i++) {
    const float *row = s->scores + (size_t)i * K;
    int best = 0;
    for (int k = 1; k < K; k++)
      if (row[k] + bias[k] > row[best] + bias[best]) best = k;
    correct += best == labels[i];
  }
  return (double)correct / s->n;
}

// The loss over one fixed set of rows with its two products built once.
typedef struct {
  Scores forward;
  const int *labels;    // (n)
  Matmul grad_product;  // (K, n) x (n, d): residual^T X
  float *grad_weights;  // (K, d)
  double *block_sums;   // (SUM_BLOCKS, 1 + K): each block's loss sum, then its bias gradient
} Objective;

static void objective_init(Objective *o, ExecCtx *ctx, const float *x, const int *labels, int n,
                           int d, int n_classes) {
  scores_init(&o->forward, ctx, x, n, d, n_classes);
  o->labels = labels;
  matmul_init(&o->grad_product, ctx, n_classes, n, d, 1, 0, COMP_OTHER, 0);
  o->grad_weights = alloc_floats((size_t)n_classes * d);
  o->block_sums = alloc_doubles((size_t)SUM_BLOCKS * (1 + n_classes));
}

static void objective_destroy(Objective *o) {
  scores_destroy(&o->forward);
  matmul_destroy(&o->grad_product);
  tl_free(o->grad_weights);
  tl_free(o->block_sums);
}

// Cross-entropy of rows [lo, hi) whose scores (K each) get the bias added; each row's scores are
// overwritten by its residual (softmax - onehot) / n. sums (1 + K) receives the loss sum and the
// residuals' column sums (the bias gradient).
static void softmax_block(float *scores, const int *labels, int lo, int hi, int K,
                          const double *bias, double inv_n, double *sums) {
  memset(sums, 0, sizeof(double) * (size_t)(1 + K));
  for (int i = lo; i < hi; i++) {
    float *row = scores + (size_t)i * K;
    double z_max = -INFINITY;
    for (int k = 0; k < K; k++) z_max = fmax(z_max, row[k] + bias[k]);
    const double z_label = row[labels[i]] + bias[labels[i]];
    double exp_sum = 0;
    for (int k = 0; k < K; k++) {
      row[k] = expf((float)(row[k] + bias[k] - z_max));  // float: the scores are float anyway
      exp_sum += row[k];
    }
    sums[0] += z_max + log(exp_sum) - z_label;
    for (int k = 0; k < K; k++) {
      double residual = (row[k] / exp_sum - (k == labels[i])) * inv_n;
      row[k] = (float)residual;
      sums[1 + k] += residual;
    }
  }
}

// Loss at params (K * d + K) and its gradient into grad.
static double objective_eval(Objective *o, ExecCtx *ctx, double lambda, const double *params,
                             double *grad) {
  Scores *f = &o->forward;
  const int n = f->n, K = f->n_classes;
  const size_t kd = (size_t)K * f->d;
  scores_run(f, ctx, params);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < SUM_BLOCKS; b++)
    softmax_block(f->scores, o->labels, (int)((long)n * b / SUM_BLOCKS),
                  (int)((long)n * (b + 1) / SUM_BLOCKS), K, params + kd, 1.0 / n,
                  o->block_sums + (size_t)b * (1 + K));
  matmul_run(&o->grad_product, ctx, f->scores, f->x, o->grad_weights);

  double loss_sum = 0;
  memset(grad + kd, 0, sizeof(double) * (size_t)K);
  for (int b = 0; b < SUM_BLOCKS; b++) {
    const double *sums = o->block_sums + (size_t)b * (1 + K);
    loss_sum += sums[0];
    for (int k = 0; k < K; k++) grad[kd + k] += sums[1 + k];
  }
  for (size_t i = 0; i < kd; i++) grad[i] = o->grad_weights[i] + lambda * params[i];
  return loss_sum / n + 0.5 * lambda * dot(params, params, kd);
}

// ---- preconditioner ----------------------------------------------------------------------------

// L-BFGS's starting inverse Hessian. Boehning's bound puts the softmax loss's Hessian below
// (1/2)(I - 11^T / K) (x) E[x x^T], x = (features, 1); so for each class (E[x x^T] / 2 + lambda)^-1
// undoes the correlations between features that make plain L-BFGS crawl (standardised
// Fashion-MNIST pixels, lambda 1e-2: max |grad| still 5e-5 after 300 iterations without it, 1e-5
// after 87 with it). Weights and bias of one class are one vector (d + 1) here; classes are
// treated alike.
//
// Its (d + 1)^2 doubles, twice, and a Cholesky factorization of d^3 / 3 multiply-adds per lambda
// are cheap for encoder features (a few hundred) but not for raw pixels of photos: 64 x 64 RGB
// is d = 12288, 2.4 GB and minutes per lambda. Above PRECONDITIONER_MAX_DIM features L-BFGS runs
// unpreconditioned (the features are standardized, so the moment's diagonal is about 1 anyway):
// memory stays that of the features, at the cost of more iterations within the same budget.
enum { PRECONDITIONER_MAX_DIM = 1024 };

typedef struct {
  int d;           // features
  int size;        // d + 1; 0: none (identity), above PRECONDITIONER_MAX_DIM features
  double *moment;  // (d + 1, d + 1) E[x x^T] over the rows
  double *factor;  // (d + 1, d + 1) lower Cholesky factor of moment / 2 + lambda on the weights
  double *work;    // (K, d + 1) one class's vector per row while it is solved
} Preconditioner;

// moment = E[x x^T] of the rows x (n, d) extended by a trailing 1: X^T X / n by oneDNN, the
// means (the bias's row and column) in double.
static void preconditioner_init(Preconditioner *p, ExecCtx *ctx, const float *x, int n, int d,
                                int n_classes) {
  memset(p, 0, sizeof *p);
  p->d = d;
  if (d > PRECONDITIONER_MAX_DIM) return;
  const int m = d + 1;
  p->size = m;
  p->moment = alloc_doubles((size_t)m * m);
  p->factor = alloc_doubles((size_t)m * m);
  p->work = alloc_doubles((size_t)n_classes * m);
  float *gram = alloc_floats((size_t)d * d);
  Matmul product;
  matmul_init(&product, ctx, d, n, d, 1, 0, COMP_OTHER, 0);
  matmul_run(&product, ctx, x, x, gram);
  matmul_destroy(&product);
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++) p->moment[(size_t)i * m + j] = gram[(size_t)i * d + j] / (double)n;
  tl_free(gram);
  double *mean = p->moment + (size_t)d * m;  // the last row
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++) mean[j] += x[(size_t)i * d + j];
  for (int j = 0; j < d; j++) {
    mean[j] /= n;
    p->moment[(size_t)j * m + d] = mean[j];
  }
  mean[d] = 1;
}

static void preconditioner_destroy(Preconditioner *p) {
  tl_free(p->moment);
  tl_free(p->factor);
  tl_free(p->work);
}

// factor = Cholesky factor of moment / 2 + ridge on the weights' diagonal. The ridge is lambda,
// floored so that the factor exists at lambda = 0 with collinear features.
static void preconditioner_set_lambda(Preconditioner *p, double lambda) {
  const int m = p->size;
  if (m == 0) return;
  double trace = 0;
  for (int j = 0; j + 1 < m; j++) trace += p->moment[(size_t)j * m + j];
  const double ridge = fmax(lambda, 1e-6 * fmax(trace / (2.0 * (m - 1)), 1.0));
  double *a = p->factor;
  for (size_t i = 0; i < (size_t)m * m; i++) a[i] = 0.5 * p->moment[i];
  for (int j = 0; j + 1 < m; j++) a[(size_t)j * m + j] += ridge;
  // Column by column (Cholesky-Crout). Every pivot is at least the ridge in exact arithmetic, but
  // the Gram matrix, summed in float, may be slightly indefinite along collinear features.
  for (int j = 0; j < m; j++) {
    double *row_j = a + (size_t)j * m;
    row_j[j] = sqrt(fmax(row_j[j] - dot(row_j, row_j, (size_t)j), ridge));
    for (int i = j + 1; i < m; i++) {
      double *row_i = a + (size_t)i * m;
      row_i[j] = (row_i[j] - dot(row_i, row_j, (size_t)j)) / row_j[j];
    }
  }
}

// z = M^-1 q for params-shaped vectors (K * d + K; z may be q): a pair of triangular solves with
// the factor L (L L^T = M) for all classes at once, so each row of L is read once per solve.
static void precondition(const Preconditioner *p, int n_classes, const double *q, double *z) {
  const int m = p->size, d = m - 1;
  if (m == 0) {  // the identity
    if (z != q) memcpy(z, q, sizeof(double) * param_count(p->d, n_classes));
    return;
  }
  const double *L = p->factor;
  for (int k = 0; k < n_classes; k++) {
    double *v = p->work + (size_t)k * m;
    memcpy(v, q + (size_t)k * d, sizeof(double) * (size_t)d);
    v[d] = q[(size_t)n_classes * d + k];
  }
  for (int i = 0; i < m; i++) {  // L u = v
    const double *row = L + (size_t)i * m;
    for (int k = 0; k < n_classes; k++) {
      double *v = p->work + (size_t)k * m;
      v[i] = (v[i] - dot(row, v, (size_t)i)) / row[i];
    }
  }
  for (int i = m - 1; i >= 0; i--) {  // L^T z = u, one column of L^T (row of L) at a time
    const double *row = L + (size_t)i * m;
    for (int k = 0; k < n_classes; k++) {
      double *v = p->work + (size_t)k * m;
      const double v_i = v[i] /= row[i];
      for (int j = 0; j < i; j++) v[j] -= row[j] * v_i;
    }
  }
  for (int k = 0; k < n_classes; k++) {
    const double *v = p->work + (size_t)k * m;
    memcpy(z + (size_t)k * d, v, sizeof(double) * (size_t)d);
    z[(size_t)n_classes * d + k] = v[d];
  }
}

// ---- L-BFGS ------------------------------------------------------------------------------------

typedef struct {
  size_t size;               // parameters
  int n_classes;             // (for the preconditioner's layout)
  int count, newest;         // pairs stored (<= LBFGS_MEMORY), slot of the newest
  double *s, *y;             // (LBFGS_MEMORY, size): parameter and gradient changes
  double rho[LBFGS_MEMORY];  // 1 / (y . s)
  double gamma;              // s.y / y.M^-1 y of the newest pair: the scale of H0 = gamma M^-1
  double *scratch;           // (size)
} LbfgsHistory;

// Stores the pair unless its curvature y . s is not clearly positive (possible with an Armijo-only
// line search): such a pair would make the inverse-Hessian estimate indefinite.
static void history_push(LbfgsHistory *h, const Preconditioner *p, const double *s,
                         const double *y) {
  const double sy = dot(s, y, h->size), ss = dot(s, s, h->size), yy = dot(y, y, h->size);
  if (!(sy > 1e-10 * sqrt(ss * yy))) return;
  h->newest = (h->newest + 1) % LBFGS_MEMORY;
  if (h->count < LBFGS_MEMORY) h->count++;
  memcpy(h->s + h->newest * h->size, s, sizeof(double) * h->size);
  memcpy(h->y + h->newest * h->size, y, sizeof(double) * h->size);
  h->rho[h->newest] = 1.0 / sy;
  precondition(p, h->n_classes, y, h->scratch);
  h->gamma = sy / dot(y, h->scratch, h->size);
}

// dir = -H grad by the two-loop recursion (Nocedal & Wright, algorithm 7.4) with H0 = gamma M^-1;
// dir = -M^-1 grad when no pair is stored.
static void history_direction(const LbfgsHistory *h, const Preconditioner *p, const double *grad,
                              double *dir) {
  const size_t n = h->size;
  double alpha[LBFGS_MEMORY];
  for (size_t j = 0; j < n; j++) dir[j] = -grad[j];
  for (int m = 0; m < h->count; m++) {  // newest to oldest
    const int i = (h->newest - m + LBFGS_MEMORY) % LBFGS_MEMORY;
    const double *s = h->s + i * n, *y = h->y + i * n;
    alpha[i] = h->rho[i] * dot(s, dir, n);
    for (size_t j = 0; j < n; j++) dir[j] -= alpha[i] * y[j];
  }
  precondition(p, h->n_classes, dir, dir);
  if (h->count)
    for (size_t j = 0; j < n; j++) dir[j] *= h->gamma;
  for (int m = h->count - 1; m >= 0; m--) {  // oldest to newest
    const int i = (h->newest - m + LBFGS_MEMORY) % LBFGS_MEMORY;
    const double *s = h->s + i * n, *y = h->y + i * n;
    const double beta = h->rho[i] * dot(y, dir, n);
    for (size_t j = 0; j < n; j++) dir[j] += (alpha[i] - beta) * s[j];
  }
}

// One point of the search: parameters, loss there and its gradient.
typedef struct {
  double *params, *grad;
  double loss;
} Point;

// Backtracking from step 1 until the Armijo condition f(x + t dir) <= f(x) + c1 t grad.dir holds;
// the accepted point goes to `trial`. Returns 0 when no step down to 2^-MAX_HALVINGS is accepted.
static int armijo_search(Objective *o, ExecCtx *ctx, double lambda, const Point *at,
                         const double *dir, Point *trial) {
  const size_t n = param_count(o->forward.d, o->forward.n_classes);
  const double slope = dot(at->grad, dir, n);
  double step = 1;
  for (int halving = 0; halving < MAX_HALVINGS; halving++, step *= 0.5) {
    for (size_t j = 0; j < n; j++) trial->params[j] = at->params[j] + step * dir[j];
    trial->loss = objective_eval(o, ctx, lambda, trial->params, trial->grad);
    if (trial->loss <= at->loss + armijo_c1 * step * slope) return 1;
  }
  return 0;
}

static void history_init(LbfgsHistory *h, size_t size, int n_classes) {
  *h = (LbfgsHistory){.size = size, .n_classes = n_classes, .newest = LBFGS_MEMORY - 1};
  h->s = alloc_doubles(LBFGS_MEMORY * size);
  h->y = alloc_doubles(LBFGS_MEMORY * size);
  h->scratch = alloc_doubles(size);
}

static void history_destroy(LbfgsHistory *h) {
  tl_free(h->s);
  tl_free(h->y);
  tl_free(h->scratch);
}

// Minimises the objective from params (in place).
static FitOutcome lbfgs_minimize(Objective *o, Preconditioner *p, ExecCtx *ctx, double lambda,
                                 FitBudget budget, double *params) {
  preconditioner_set_lambda(p, lambda);
  const size_t n = param_count(o->forward.d, o->forward.n_classes);
  LbfgsHistory h;
  history_init(&h, n, o->forward.n_classes);
  // dir, then the accepted step's parameter and gradient changes (n each)
  double *dir = alloc_doubles(n), *param_change = alloc_doubles(n), *grad_change = alloc_doubles(n);
  Point at = {params, alloc_doubles(n), 0}, trial = {alloc_doubles(n), alloc_doubles(n), 0};
  at.loss = objective_eval(o, ctx, lambda, at.params, at.grad);

  FitOutcome out = {0, 0};
  for (;;) {
    out.converged = max_abs(at.grad, n) < budget.grad_tol * fmax(1.0, fabs(at.loss));
    if (out.converged || out.iterations == budget.max_iter) break;
    history_direction(&h, p, at.grad, dir);
    if (!(dot(at.grad, dir, n) < 0)) {  // rounding broke the estimate: restart without pairs
      h.count = 0;
      history_direction(&h, p, at.grad, dir);
    }
    if (!armijo_search(o, ctx, lambda, &at, dir, &trial)) break;
    for (size_t j = 0; j < n; j++) {
      param_change[j] = trial.params[j] - at.params[j];
      grad_change[j] = trial.grad[j] - at.grad[j];
    }
    history_push(&h, p, param_change, grad_change);
    memcpy(at.params, trial.params, sizeof(double) * n);
    memcpy(at.grad, trial.grad, sizeof(double) * n);
    at.loss = trial.loss;
    out.iterations++;
  }
  history_destroy(&h);
  tl_free(dir);
  tl_free(param_change);
  tl_free(grad_change);
  tl_free(at.grad);
  tl_free(trial.params);
  tl_free(trial.grad);
  return out;
}

// ---- input checks ------------------------------------------------------------------------------

static int check_sizes(int n, int d, int n_classes, const char *which) {
  if (n <= 0 || d <= 0 || n_classes <= 0)
    return tl_fail("linear probe: sizes must be positive (n_%s %d, d %d, n_classes %d)", which, n,
                   d, n_classes);
  return 0;
}

static int check_labels(const int *labels, int n, int n_classes, const char *which) {
  for (int i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= n_classes)
      return tl_fail("linear probe: %s label %d at row %d is outside [0, %d)", which, labels[i], i,
                     n_classes);
  return 0;
}

static int check_finite(const float *x, int n, int d, const char *which) {
  for (size_t i = 0; i < (size_t)n * d; i++)
    if (!isfinite(x[i]))
      return tl_fail("linear probe: %s feature (row %zu, dim %zu) is not finite", which, i / d,
                     i % d);
  return 0;
}

static int check_rows(const float *x, const int *labels, int n, int d, int n_classes,
                      const char *which) {
  if (check_sizes(n, d, n_classes, which) < 0) return -1;
  if (check_labels(labels, n, n_classes, which) < 0) return -1;
  return check_finite(x, n, d, which);
}

static int check_lambda(double lambda) {
  if (!(lambda >= 0 && isfinite(lambda)))
    return tl_fail("linear probe: lambda %g must be finite and >= 0", lambda);
  return 0;
}

// ---- the pieces, public ------------------------------------------------------------------------

int linear_probe_loss_grad(const float *x, const int *labels, int n, int d, int n_classes,
                           double lambda, const double *params, ExecCtx *ctx, double *loss,
                           double *grad) {
  if (check_rows(x, labels, n, d, n_classes, "rows") < 0 || check_lambda(lambda) < 0) return -1;
  Objective o;
  objective_init(&o, ctx, x, labels, n, d, n_classes);
  *loss = objective_eval(&o, ctx, lambda, params, grad);
  objective_destroy(&o);
  return 0;
}

int linear_probe_fit(const float *x, const int *labels, int n, int d, int n_classes, double lambda,
                     int max_iter, double grad_tol, ExecCtx *ctx, double *params, int *converged) {
  if (check_rows(x, labels, n, d, n_classes, "rows") < 0 || check_lambda(lambda) < 0) return -1;
  if (max_iter < 1) return tl_fail("linear probe: max_iter %d must be positive", max_iter);
  Objective o;
  objective_init(&o, ctx, x, labels, n, d, n_classes);
  Preconditioner p;
  preconditioner_init(&p, ctx, x, n, d, n_classes);
  FitOutcome fit = lbfgs_minimize(&o, &p, ctx, lambda, (FitBudget){max_iter, grad_tol}, params);
  preconditioner_destroy(&p);
  objective_destroy(&o);
  if (converged) *converged = fit.converged;
  return fit.iterations;
}

// ---- the probe ---------------------------------------------------------------------------------

// Per-dimension mean and 1 / std (population std) of the rows, accumulated in double.
static void feature_stats(const float *x, int n, int d, double *mean, double *inv_std) {
  memset(mean, 0, sizeof(double) * (size_t)d);
  memset(inv_std, 0, sizeof(double) * (size_t)d);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++) mean[j] += x[(size_t)i * d + j];
  for (int j = 0; j < d; j++) mean[j] /= n;
  double *var = inv_std;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++) {
      const double centred = x[(size_t)i * d + j] - mean[j];
      var[j] += centred * centred;
    }
  for (int j = 0; j < d; j++) {
    const double std = sqrt(var[j] / n);
    inv_std[j] = std > std_floor ? 1.0 / std : 1.0;
  }
}

// dst row i = standardised src row order[i] (row i when order is NULL).
static void standardize_rows(float *dst, const float *src, const int *order, int n, int d,
                             const double *mean, const double *inv_std) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    const float *x = src + (size_t)(order ? order[i] : i) * d;
    for (int j = 0; j < d; j++) dst[(size_t)i * d + j] = (float)((x[j] - mean[j]) * inv_std[j]);
  }
}

// A seeded permutation of the rows (Fisher-Yates), so the validation tenth taken from its end is
// a random sample even when the rows arrive sorted by class.
static int *shuffled_rows(int n, uint64_t seed) {
  int *order = tl_alloc(sizeof(int) * (size_t)n, MEM_EVAL, COMP_OTHER);
  for (int i = 0; i < n; i++) order[i] = i;
  Rng r = rng_stream(seed, RNG_SHUFFLE, 0, split_stream);
  for (int i = n - 1; i > 0; i--) {
    const int j = (int)rng_below(&r, (uint32_t)i + 1);
    const int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  return order;
}

// Fits every lambda on the first n_fit rows of x, largest first, each starting from the previous
// solution, and scores it on the n_val rows after them. The best validation accuracy (the larger
// lambda on ties, as it comes first) sets out->lambda and out->val_top1, its solution best_params.
static void search_lambda(const float *x /*(n_fit + n_val, d)*/, const int *labels, int n_fit,
                          int n_val, int d, int n_classes, Preconditioner *p, ExecCtx *ctx,
                          double *best_params, LinearProbeResult *out) {
  const size_t n_params = param_count(d, n_classes);
  Objective fit;
  objective_init(&fit, ctx, x, labels, n_fit, d, n_classes);
  Scores val;
  scores_init(&val, ctx, x + (size_t)n_fit * d, n_val, d, n_classes);
  double *params = alloc_doubles(n_params);
  out->val_top1 = -1;
  for (int i = LINEAR_PROBE_N_LAMBDAS - 1; i >= 0; i--) {
    lbfgs_minimize(&fit, p, ctx, linear_probe_lambdas[i], search_budget, params);
    const double accuracy = top1(&val, ctx, labels + n_fit, params);
    out->val_top1_by_lambda[i] = accuracy;
    if (accuracy > out->val_top1) {
      out->val_top1 = accuracy;
      out->lambda = linear_probe_lambdas[i];
      memcpy(best_params, params, sizeof(double) * n_params);
    }
  }
  tl_free(params);
  scores_destroy(&val);
  objective_destroy(&fit);
}

// Refits on all training rows from the chosen lambda's solution, then scores the test rows.
static void final_fit(const float *x_train, const int *y_train, int n_train, const float *x_test,
                      const int *y_test, int n_test, int d, int n_classes, Preconditioner *p,
                      ExecCtx *ctx, double *params, LinearProbeResult *out) {
  Objective all;
  objective_init(&all, ctx, x_train, y_train, n_train, d, n_classes);
  const FitOutcome fit = lbfgs_minimize(&all, p, ctx, out->lambda, final_budget, params);
  objective_destroy(&all);
  out->iterations = fit.iterations;
  out->converged = fit.converged;
  Scores test;
  scores_init(&test, ctx, x_test, n_test, d, n_classes);
  out->test_top1 = top1(&test, ctx, y_test, params);
  scores_destroy(&test);
}

int linear_probe(const float *train_feat, const int *train_labels, int n_train,
                 const float *test_feat, const int *test_labels, int n_test, int d, int n_classes,
                 uint64_t seed, ExecCtx *ctx, LinearProbeResult *out) {
  const double start_ms = now_ms();
  if (check_rows(train_feat, train_labels, n_train, d, n_classes, "train") < 0) return -1;
  if (check_rows(test_feat, test_labels, n_test, d, n_classes, "test") < 0) return -1;
  if (n_train < MIN_TRAIN_ROWS)
    return tl_fail("linear probe: n_train %d is too small to hold out a validation tenth (need %d)",
                   n_train, MIN_TRAIN_ROWS);
  memset(out, 0, sizeof *out);

  // x_train (n_train, d): standardised rows in shuffled order, the validation tenth last.
  double *mean = alloc_doubles((size_t)d), *inv_std = alloc_doubles((size_t)d);
  feature_stats(train_feat, n_train, d, mean, inv_std);
  int *order = shuffled_rows(n_train, seed);
  float *x_train = alloc_floats((size_t)n_train * d), *x_test = alloc_floats((size_t)n_test * d);
  int *y_train = tl_alloc(sizeof(int) * (size_t)n_train, MEM_EVAL, COMP_OTHER);
  for (int i = 0; i < n_train; i++) y_train[i] = train_labels[order[i]];
  standardize_rows(x_train, train_feat, order, n_train, d, mean, inv_std);
  standardize_rows(x_test, test_feat, NULL, n_test, d, mean, inv_std);

  // One preconditioner from all training rows serves the search and the final fit.
  Preconditioner p;
  preconditioner_init(&p, ctx, x_train, n_train, d, n_classes);
  const int n_val = n_train / 10;
  double *params = alloc_doubles(param_count(d, n_classes));
  search_lambda(x_train, y_train, n_train - n_val, n_val, d, n_classes, &p, ctx, params, out);
  final_fit(x_train, y_train, n_train, x_test, test_labels, n_test, d, n_classes, &p, ctx, params,
            out);

  tl_free(params);
  preconditioner_destroy(&p);
  tl_free(y_train);
  tl_free(x_test);
  tl_free(x_train);
  tl_free(order);
  tl_free(inv_std);
  tl_free(mean);
  out->seconds = (now_ms() - start_ms) / 1e3;
  return 0;
}
