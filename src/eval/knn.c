#include "eval/knn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/l2norm.h"
#include "ops/matmul.h"

// Test rows per similarity block: the block's (rows, n_train) similarities stay a few tens of MB
// for a 60k bank while each matmul is still large enough to run near peak.
enum { KNN_BLOCK_ROWS = 256 };

typedef struct {
  float sim;
  int index;  // row of the training bank
} Neighbor;

// A total order, so selection does not depend on scan order when similarities tie: higher
// similarity first, then the lower bank index.
static int better(Neighbor a, Neighbor b) {
  return a.sim > b.sim || (a.sim == b.sim && a.index < b.index);
}

// Heap whose root is the worst neighbour kept, so a candidate is compared with the root only.
static void sift_down(Neighbor *heap, int n, int i) {
  for (;;) {
    int worst = i, left = 2 * i + 1, right = left + 1;
    if (left < n && better(heap[worst], heap[left])) worst = left;
    if (right < n && better(heap[worst], heap[right])) worst = right;
    if (worst == i) return;
    Neighbor t = heap[i];
    heap[i] = heap[worst];
    heap[worst] = t;
    i = worst;
  }
}

// best (k) receives the k most similar of sims (n), most similar first; requires k <= n.
static void select_top_k(const float *sims, int n, int k, Neighbor *best) {
  for (int j = 0; j < k; j++) best[j] = (Neighbor){sims[j], j};
  for (int i = k / 2 - 1; i >= 0; i--) sift_down(best, k, i);
  // Later candidates have larger indices, so one that only ties the worst kept never enters.
  for (int j = k; j < n; j++) {
    if (sims[j] > best[0].sim) {
      best[0] = (Neighbor){sims[j], j};
      sift_down(best, k, 0);
    }
  }
  // Heap sort: moving the worst to the back each time leaves the best at the front.
  for (int left = k; left > 1; left--) {
    Neighbor t = best[0];
    best[0] = best[left - 1];
    best[left - 1] = t;
    sift_down(best, left - 1, 0);
  }
}

// Class with the largest sum of exp(sim / temperature) over the first k neighbours (lowest class
// on ties). Weights are taken relative to the best similarity, which scales every class's sum by
// the same factor and keeps exp finite for small temperatures.
static int vote(const Neighbor *best, int k, const int *train_labels, int n_classes,
                float temperature, double *scores /*(n_classes)*/) {
  memset(scores, 0, sizeof(double) * (size_t)n_classes);
  for (int i = 0; i < k; i++)
    scores[train_labels[best[i].index]] += exp(((double)best[i].sim - best[0].sim) / temperature);
  int arg = 0;
  for (int c = 1; c < n_classes; c++)
    if (scores[c] > scores[arg]) arg = c;
  return arg;
}

static int check_labels(const int *labels, int n, int n_classes, const char *which) {
  for (int i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= n_classes)
      return tl_fail("knn: %s label %d at row %d is outside [0, %d)", which, labels[i], i,
                     n_classes);
  return 0;
}

static int check_args(const int *train_labels, int n_train, const int *test_labels, int n_test,
                      int d, int n_classes, const int *ks, int n_k, float temperature) {
  if (n_train <= 0 || n_test <= 0 || d <= 0 || n_classes <= 0)
    return tl_fail("knn: sizes must be positive (n_train %d, n_test %d, d %d, n_classes %d)",
                   n_train, n_test, d, n_classes);
  if (n_k <= 0) return tl_fail("knn: no k given");
  for (int i = 0; i < n_k; i++)
    if (ks[i] <= 0) return tl_fail("knn: k = %d must be positive", ks[i]);
  if (!(temperature > 0)) return tl_fail("knn: temperature %g must be positive", temperature);
  if (check_labels(train_labels, n_train, n_classes, "train") < 0) return -1;
  return check_labels(test_labels, n_test, n_classes, "test");
}

static int block_rows(int n_test) { return n_test < KNN_BLOCK_ROWS ? n_test : KNN_BLOCK_ROWS; }

size_t knn_eval_bytes(int n_train, int n_test, int d) {
  size_t block = (size_t)block_rows(n_test);
  return sizeof(float) * ((size_t)n_train * d + block * d + block * (size_t)n_train);
}

// A call's primitives: the bank's rows normalized; a block of test rows normalized and compared
// with the bank, in the full block's shape and in the last, shorter block's (tail_rows, 0: none).
// The normalizations write into the call's buffers, their norms into the similarity rows, unused
// until the block's comparison (block * n_train floats, at least a bank's or a block's norms).
typedef struct {
  L2Norm bank, block, tail;
  Matmul full, tail_sims;
  int tail_rows;
} KnnPrimitives;

static void knn_primitives_init(KnnPrimitives *k, ExecCtx *ctx, int n_train, int n_test, int d) {
  const int block = block_rows(n_test);
  const Builder b = {.ctx = ctx, .mode = OP_INFER, .component = COMP_OTHER};
  k->tail_rows = n_test % block;
  l2norm_init_unowned(&k->bank, &b, n_train, d);
  l2norm_init_unowned(&k->block, &b, block, d);
  matmul_init(&k->full, ctx, block, d, n_train, 0, 1, COMP_OTHER, 0);
  if (!k->tail_rows) return;
  l2norm_init_unowned(&k->tail, &b, k->tail_rows, d);
  matmul_init(&k->tail_sims, ctx, k->tail_rows, d, n_train, 0, 1, COMP_OTHER, 0);
}

static void knn_primitives_destroy(KnnPrimitives *k) {
  l2norm_destroy(&k->bank);
  l2norm_destroy(&k->block);
  matmul_destroy(&k->full);
  if (!k->tail_rows) return;
  l2norm_destroy(&k->tail);
  matmul_destroy(&k->tail_sims);
}

void knn_reserve_scratchpad(ExecCtx *ctx, int n_train, int n_test, int d) {
  KnnPrimitives k;
  knn_primitives_init(&k, ctx, n_train, n_test, d);
  knn_primitives_destroy(&k);
}

int knn_top1_multi(const float *train_feat, const int *train_labels, int n_train,
                   const float *test_feat, const int *test_labels, int n_test, int d, int n_classes,
                   const int *ks, int n_k, float temperature, ExecCtx *ctx, double *accuracy,
                   int *predictions) {
  if (check_args(train_labels, n_train, test_labels, n_test, d, n_classes, ks, n_k, temperature))
    return -1;
  int k_max = 0;
  for (int i = 0; i < n_k; i++) k_max = ks[i] > k_max ? ks[i] : k_max;
  if (k_max > n_train) k_max = n_train;

  const int block = block_rows(n_test);
  // bank (n_train, d), queries (block, d), sims (block, n_train)
  float *bank = tl_alloc(sizeof(float) * (size_t)n_train * d, MEM_EVAL, COMP_OTHER);
  float *queries = tl_alloc(sizeof(float) * (size_t)block * d, MEM_EVAL, COMP_OTHER);
  float *sims = tl_alloc(sizeof(float) * (size_t)block * n_train, MEM_EVAL, COMP_OTHER);
  KnnPrimitives prims;
  knn_primitives_init(&prims, ctx, n_train, n_test, d);
  l2norm_forward_to(&prims.bank, ctx, train_feat, bank, sims);

  long *correct = calloc((size_t)n_k, sizeof *correct);
  if (!correct) TL_DIE("out of memory");
  for (int start = 0; start < n_test; start += block) {
    const int rows = n_test - start < block ? n_test - start : block;
    const int full = rows == block;
    l2norm_forward_to(full ? &prims.block : &prims.tail, ctx, test_feat + (size_t)start * d,
                      queries, sims);
    matmul_run(full ? &prims.full : &prims.tail_sims, ctx, queries, bank, sims);
#pragma omp parallel
    {
      // Per-thread selection scratch: k_max neighbours and one score per class.
      Neighbor *best = malloc(sizeof(Neighbor) * (size_t)k_max);
      double *scores = malloc(sizeof(double) * (size_t)n_classes);
      if (!best || !scores) TL_DIE("out of memory");
#pragma omp for schedule(static)
      for (int r = 0; r < rows; r++) {
        select_top_k(sims + (size_t)r * n_train, n_train, k_max, best);
        for (int i = 0; i < n_k; i++) {
          int k = ks[i] < k_max ? ks[i] : k_max;
          int pred = vote(best, k, train_labels, n_classes, temperature, scores);
          if (predictions) predictions[(size_t)i * n_test + start + r] = pred;
          if (pred == test_labels[start + r]) {
#pragma omp atomic
            correct[i]++;
          }
        }
      }
      free(best);
      free(scores);
    }
  }
  for (int i = 0; i < n_k; i++) accuracy[i] = (double)correct[i] / n_test;

  free(correct);
  knn_primitives_destroy(&prims);
  tl_free(sims);
  tl_free(queries);
  tl_free(bank);
  return 0;
}

int knn_k_for_bank(int k, const int *train_labels, int n_train, int n_classes) {
  int *count = calloc((size_t)(n_classes > 0 ? n_classes : 1), sizeof *count);
  if (!count) TL_DIE("out of memory");
  for (int i = 0; i < n_train; i++)
    if (train_labels[i] >= 0 && train_labels[i] < n_classes) count[train_labels[i]]++;
  int smallest = 0;
  for (int c = 0; c < n_classes; c++)
    if (count[c] > 0 && (smallest == 0 || count[c] < smallest)) smallest = count[c];
  free(count);
  if (smallest > 0) {
    const int cap = smallest / 10 > 20 ? smallest / 10 : smallest < 20 ? smallest : 20;
    if (k > cap) k = cap;
  }
  return k > 0 ? k : 1;
}

double knn_top1(const float *train_feat, const int *train_labels, int n_train,
                const float *test_feat, const int *test_labels, int n_test, int d, int n_classes,
                int k, float temperature, ExecCtx *ctx) {
  double accuracy;
  if (knn_top1_multi(train_feat, train_labels, n_train, test_feat, test_labels, n_test, d,
                     n_classes, &k, 1, temperature, ctx, &accuracy, NULL) < 0)
    return -1;
  return accuracy;
}
