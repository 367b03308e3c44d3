// The kNN monitor on hand-checked 2-D cases and against a naive full-sort reference.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "eval/knn.h"

static ExecCtx ctx;

static int setup(void **state) {
  (void)state;
  exec_ctx_init(&ctx);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  exec_ctx_destroy(&ctx);
  return 0;
}

// ---- hand-checked cases ----------------------------------------------------------------------

static void test_obvious_2d(void **state) {
  (void)state;
  // (4, 2): two points near each axis; lengths differ so only directions may matter.
  const float train[] = {1.0f, 0.1f, 5.0f, -0.2f, 0.1f, 2.0f, -0.2f, 0.7f};
  const int train_labels[] = {0, 0, 1, 1};
  // (4, 2): the last test row's label is deliberately wrong, so accuracy is 3/4.
  const float test[] = {0.9f, 0.1f, 10.0f, 1.0f, 0.1f, 0.9f, 0.05f, 3.0f};
  const int test_labels[] = {0, 0, 1, 0};
  const float test_copy[8] = {0.9f, 0.1f, 10.0f, 1.0f, 0.1f, 0.9f, 0.05f, 3.0f};
  int k = 2, predictions[4];
  double acc;
  assert_int_equal(knn_top1_multi(train, train_labels, 4, test, test_labels, 4, 2, 2, &k, 1, 0.1f,
                                  &ctx, &acc, predictions),
                   0);
  assert_int_equal(predictions[0], 0);
  assert_int_equal(predictions[1], 0);
  assert_int_equal(predictions[2], 1);
  assert_int_equal(predictions[3], 1);
  assert_true(acc == 0.75);
  assert_memory_equal(test, test_copy, sizeof test_copy);
  assert_true(knn_top1(train, train_labels, 4, test, test_labels, 4, 2, 2, 2, 0.1f, &ctx) == 0.75);
}

// The query (1, 0) has one class-0 neighbour at similarity 1 and two class-1 neighbours at
// similarity 0.5 (60 degrees either side); a class-0 point at similarity -1 is outside k = 3.
//   t = 1:   class 0 weighs e^1 = 2.718, class 1 weighs 2 e^0.5 = 3.297   -> class 1 (majority)
//   t = 0.1: class 0 weighs e^10 = 22026, class 1 weighs 2 e^5 = 296.8    -> class 0
static void test_temperature_changes_vote(void **state) {
  (void)state;
  const float s = 0.8660254f;  // sin 60 degrees
  const float train[] = {1.0f, 0.0f, 0.5f, s, 0.5f, -s, -1.0f, 0.0f};
  const int train_labels[] = {0, 1, 1, 0};
  const float test[] = {1.0f, 0.0f};
  const int label0[] = {0}, label1[] = {1};
  assert_true(knn_top1(train, train_labels, 4, test, label1, 1, 2, 2, 3, 1.0f, &ctx) == 1.0);
  assert_true(knn_top1(train, train_labels, 4, test, label0, 1, 2, 2, 3, 0.1f, &ctx) == 1.0);
  assert_true(knn_top1(train, train_labels, 4, test, label0, 1, 2, 2, 3, 1.0f, &ctx) == 0.0);
}

// k beyond the bank uses the whole bank: three class-0 points outvote two closer class-1 points
// when the temperature makes the weights nearly equal.
static void test_k_clamped(void **state) {
  (void)state;
  const float train[] = {1.0f, 0.0f, 1.0f, 0.2f, 1.0f, -0.2f, 0.0f, 1.0f, 0.2f, 1.0f};
  const int train_labels[] = {0, 0, 0, 1, 1};
  const float test[] = {0.1f, 1.0f};
  const int label0[] = {0};
  assert_true(knn_top1(train, train_labels, 5, test, label0, 1, 2, 2, 50, 100.0f, &ctx) == 1.0);
  assert_true(knn_top1(train, train_labels, 5, test, label0, 1, 2, 2, 5, 100.0f, &ctx) == 1.0);
  // with k = 2 only the class-1 points are in reach
  assert_true(knn_top1(train, train_labels, 5, test, label0, 1, 2, 2, 2, 100.0f, &ctx) == 0.0);
}

// Equal similarities keep the lower bank index: with k = 1 of three identical points labelled
// {1, 0, 0} the neighbour is row 0 (class 1); with k = 2 the classes tie and the lower class wins.
static void test_ties(void **state) {
  (void)state;
  const float train[] = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f};
  const int train_labels[] = {1, 0, 0};
  const float test[] = {1.0f, 0.0f};
  // Separate calls: the selection runs for the largest k only.
  for (int k = 1; k <= 2; k++) {
    int prediction;
    double acc;
    assert_int_equal(knn_top1_multi(train, train_labels, 3, test, train_labels, 1, 2, 2, &k, 1,
                                    0.1f, &ctx, &acc, &prediction),
                     0);
    assert_int_equal(prediction, k == 1 ? 1 : 0);
  }
}

// k is capped by the bank's smallest class: labels 0 x5, 1 x2, 2 x6 and no class 3 (absent
// classes do not count) give k = 2 for any k above 2, and k itself below.
static void test_k_for_bank_smallest_class(void **state) {
  (void)state;
  const int labels[] = {0, 0, 1, 2, 0, 2, 2, 0, 1, 2, 2, 0, 2};
  assert_int_equal(knn_k_for_bank(200, labels, 13, 4), 2);
  assert_int_equal(knn_k_for_bank(3, labels, 13, 4), 2);
  assert_int_equal(knn_k_for_bank(2, labels, 13, 4), 2);
  assert_int_equal(knn_k_for_bank(1, labels, 13, 4), 1);
  // The first 7 rows only (a limited bank): class 1 has 1 image there.
  assert_int_equal(knn_k_for_bank(200, labels, 7, 4), 1);
}

// Past 20 a class, at most a tenth of the smallest votes: 150 a class (a small labeled set) give
// 20, 500 give 50, 6,000 (Fashion-MNIST's) leave 200; 15 a class give 15.
static void test_k_for_bank_a_tenth_of_the_class(void **state) {
  (void)state;
  enum { MAX = 3 * 6000 + 7 };
  int *labels = malloc(sizeof *labels * MAX);
  const int per_class[] = {150, 500, 6000, 15}, expected[] = {20, 50, 200, 15};
  for (int t = 0; t < 4; t++) {
    const int n = 3 * per_class[t] + 7;  // class 2 has 7 more: the smallest decides
    for (int i = 0; i < n; i++) labels[i] = i < 3 * per_class[t] ? i % 3 : 2;
    assert_int_equal(knn_k_for_bank(200, labels, n, 3), expected[t]);
    assert_int_equal(knn_k_for_bank(10, labels, n, 3), expected[t] < 10 ? expected[t] : 10);
  }
  free(labels);
}

// Why: the query's own class has 2 images, the nearest; 6 of another class lie farther. With
// nearly equal weights (temperature 100) k = 8 lets the 6 outvote the 2; the bank's k, 2, does
// not.
static void test_k_for_bank_lets_a_small_class_win(void **state) {
  (void)state;
  const float train[] = {1.0f, 0.05f, 1.0f, -0.05f, 1.0f, 0.6f, 1.0f, -0.6f,
                         1.0f, 0.7f,  1.0f, -0.7f,  1.0f, 0.8f, 1.0f, -0.8f};
  const int train_labels[] = {0, 0, 1, 1, 1, 1, 1, 1};
  const float test[] = {1.0f, 0.0f};
  const int label0[] = {0};
  assert_true(knn_top1(train, train_labels, 8, test, label0, 1, 2, 2, 8, 100.0f, &ctx) == 0.0);
  const int k = knn_k_for_bank(8, train_labels, 8, 2);
  assert_int_equal(k, 2);
  assert_true(knn_top1(train, train_labels, 8, test, label0, 1, 2, 2, k, 100.0f, &ctx) == 1.0);
}

static void test_bad_input(void **state) {
  (void)state;
  const float train[] = {1.0f, 0.0f, 0.0f, 1.0f};
  const int good[] = {0, 1}, bad[] = {0, 2};
  const float test[] = {1.0f, 0.0f};
  assert_true(knn_top1(train, bad, 2, test, good, 1, 2, 2, 1, 0.1f, &ctx) == -1);
  assert_non_null(strstr(tl_last_error(), "train label 2"));
  assert_true(knn_top1(train, good, 2, test, bad + 1, 1, 2, 2, 1, 0.1f, &ctx) == -1);
  assert_non_null(strstr(tl_last_error(), "test label"));
  assert_true(knn_top1(train, good, 2, test, good, 1, 2, 2, 0, 0.1f, &ctx) == -1);
  assert_true(knn_top1(train, good, 2, test, good, 1, 2, 2, 1, 0.0f, &ctx) == -1);
  assert_true(knn_top1(train, good, 0, test, good, 1, 2, 2, 1, 0.1f, &ctx) == -1);
}

// ---- random case against a naive reference --------------------------------------------------

enum { N_TRAIN = 700, N_TEST = 600, D = 16, N_CLASSES = 5 };  // 600 test rows: 2 blocks + a tail

typedef struct {
  double sim;
  int index;
} RefNeighbor;

static int ref_order(const void *a, const void *b) {
  const RefNeighbor *x = a, *y = b;
  if (x->sim != y->sim) return x->sim > y->sim ? -1 : 1;
  return x->index - y->index;
}

static void normalize_double(const float *x, double *out, int d) {
  double sq = 0;
  for (int j = 0; j < d; j++) sq += (double)x[j] * x[j];
  for (int j = 0; j < d; j++) out[j] = x[j] / sqrt(sq);
}

// Full sort of all similarities, exp(sim / t) votes without any rescaling. *ambiguous is set when
// float rounding could legitimately flip the answer: the k-th and (k+1)-th similarities nearly
// tie, or the two best class scores do.
static int ref_predict(const double *bank, const int *labels, const double *q, int k, double t,
                       int *ambiguous) {
  static RefNeighbor all[N_TRAIN];
  for (int i = 0; i < N_TRAIN; i++) {
    double s = 0;
    for (int j = 0; j < D; j++) s += bank[i * D + j] * q[j];
    all[i] = (RefNeighbor){s, i};
  }
  qsort(all, N_TRAIN, sizeof all[0], ref_order);
  double scores[N_CLASSES] = {0};
  for (int i = 0; i < k; i++) scores[labels[all[i].index]] += exp(all[i].sim / t);
  int best = 0, second = -1;
  for (int c = 1; c < N_CLASSES; c++)
    if (scores[c] > scores[best])
      second = best, best = c;
    else if (second < 0 || scores[c] > scores[second])
      second = c;
  *ambiguous = (k < N_TRAIN && all[k - 1].sim - all[k].sim < 1e-5) ||
               scores[best] - scores[second] < 1e-4 * scores[best];
  return best;
}

static void test_random_against_reference(void **state) {
  (void)state;
  static float train[N_TRAIN * D], test[N_TEST * D];
  static int train_labels[N_TRAIN], test_labels[N_TEST], predictions[2 * N_TEST];
  static double bank[N_TRAIN * D];
  float centers[N_CLASSES][D];
  Rng r = rng_stream(5, RNG_TEST, 0, 0);
  for (int c = 0; c < N_CLASSES; c++)
    for (int j = 0; j < D; j++) centers[c][j] = rng_normal(&r);
  // Overlapping classes (noise comparable to the centres) so that k and votes matter.
  for (int i = 0; i < N_TRAIN + N_TEST; i++) {
    int label = (int)rng_below(&r, N_CLASSES);
    float *x = i < N_TRAIN ? train + i * D : test + (i - N_TRAIN) * D;
    for (int j = 0; j < D; j++) x[j] = centers[label][j] + 1.2f * rng_normal(&r);
    if (i < N_TRAIN)
      train_labels[i] = label;
    else
      test_labels[i - N_TRAIN] = label;
  }
  for (int i = 0; i < N_TRAIN; i++) normalize_double(train + i * D, bank + i * D, D);

  const int ks[2] = {200, 20};
  const float t = 0.1f;
  double acc[2];
  size_t eval_before = tl_mem_live(MEM_EVAL);
  assert_int_equal(knn_top1_multi(train, train_labels, N_TRAIN, test, test_labels, N_TEST, D,
                                  N_CLASSES, ks, 2, t, &ctx, acc, predictions),
                   0);
  assert_int_equal(tl_mem_live(MEM_EVAL), eval_before);

  for (int ki = 0; ki < 2; ki++) {
    int ref_correct = 0, mismatches = 0, n_ambiguous = 0;
    for (int i = 0; i < N_TEST; i++) {
      double q[D];
      int ambiguous;
      normalize_double(test + i * D, q, D);
      int expected = ref_predict(bank, train_labels, q, ks[ki], t, &ambiguous);
      ref_correct += expected == test_labels[i];
      n_ambiguous += ambiguous;
      if (predictions[ki * N_TEST + i] != expected) {
        if (!ambiguous)
          fail_msg("k=%d row %d: predicted %d, reference %d", ks[ki], i,
                   predictions[ki * N_TEST + i], expected);
        mismatches++;
      }
    }
    assert_true(n_ambiguous < N_TEST / 50);
    assert_true(fabs(acc[ki] - (double)ref_correct / N_TEST) <= (double)mismatches / N_TEST);
    // The case is informative: well above chance, well below perfect.
    assert_true(acc[ki] > 0.4 && acc[ki] < 0.98);
  }
  // the single-k entry point agrees with the multi-k pass
  assert_true(knn_top1(train, train_labels, N_TRAIN, test, test_labels, N_TEST, D, N_CLASSES, 20, t,
                       &ctx) == acc[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_obvious_2d),
      cmocka_unit_test(test_temperature_changes_vote),
      cmocka_unit_test(test_k_clamped),
      cmocka_unit_test(test_ties),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_random_against_reference),
      cmocka_unit_test(test_k_for_bank_smallest_class),
      cmocka_unit_test(test_k_for_bank_a_tenth_of_the_class),
      cmocka_unit_test(test_k_for_bank_lets_a_small_class_win),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
