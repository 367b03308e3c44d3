// The compare's verdict and intervals on results made by hand: a collapsed encoder that scores
// highest is not recommended, every measure is named (kNN with its k), being below raw pixels is
// said, two seeds are said to be too few, and an accuracy's interval stays inside [0, 1].
// cmocka needs these first, in this order.
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <string.h>

#include "compare/compare_results.h"

static void put(SeedStats *s, double a, double b) {
  s->values[0] = a, s->values[1] = b, s->n_values = 2;
}

// The digits compare, in numbers: mae's probe is the highest (97.8%) but both its seeds
// collapsed; inbatch and byol are below, and every kNN is about 25 points under the pixels'.
static void make_cells(CompareSpec *spec, CompareCell *cells) {
  memset(spec, 0, sizeof *spec);
  memset(cells, 0, sizeof *cells * 3);
  spec->n_objectives = 3, spec->n_budgets = 1, spec->n_seeds = 2;
  spec->objectives[0] = "inbatch", spec->objectives[1] = "mae", spec->objectives[2] = "byol";
  spec->budgets[0] = "3TFLOP";
  const double linear[3][2] = {{0.950, 0.972}, {0.978, 0.978}, {0.930, 0.990}};
  const double knn[3][2] = {{0.71, 0.69}, {0.67, 0.68}, {0.70, 0.69}};
  for (int o = 0; o < 3; o++) {
    CompareCell *c = &cells[o];
    c->objective = spec->objectives[o], c->budget = spec->budgets[0];
    put(&c->m[M_LINEAR], linear[o][0], linear[o][1]);
    put(&c->m[M_KNN], knn[o][0], knn[o][1]);
    put(&c->m[M_KNN_K], 20, 20);
    put(&c->m[M_COLLAPSED], o == 1, o == 1);
    c->m[M_LINEAR_RAW].values[0] = 0.958, c->m[M_LINEAR_RAW].n_values = 1;
    c->m[M_KNN_RAW].values[0] = 0.947, c->m[M_KNN_RAW].n_values = 1;
    for (int m = 0; m < N_MEASURES; m++) seed_stats(&c->m[m], m == M_LINEAR || m == M_KNN);
  }
}

static void test_collapsed_never_recommended(void **state) {
  (void)state;
  CompareSpec spec;
  CompareCell cells[3];
  make_cells(&spec, cells);
  char v[COMPARE_VERDICT_MAX];
  compare_verdict(&spec, cells, 0, v, sizeof v);
  assert_null(strstr(v, "mae scores best"));
  assert_non_null(strstr(v, "mae collapsed in 2 of 2 seeds"));
  assert_non_null(strstr(v, "By the linear probe: inbatch scores best"));
  assert_non_null(strstr(v, "mae scores higher but collapsed"));
  assert_non_null(strstr(v, "By kNN (cosine, k = 20): inbatch scores best"));
  assert_non_null(strstr(v, "Every objective is below raw pixels (94.7%) by kNN"));
  assert_non_null(strstr(v, "Two seeds give intervals too wide"));
}

// byol's seeds 0.93 and 0.99: Student's t at one degree of freedom (12.7) on the raw scale gives
// 0.96 -/+ 0.38, far past 100%; on the logit scale the interval stays inside (0, 1) and holds the
// mean.
static void test_intervals_inside_0_1(void **state) {
  (void)state;
  CompareSpec spec;
  CompareCell cells[3];
  make_cells(&spec, cells);
  const SeedStats *s = &cells[2].m[M_LINEAR];
  assert_true(s->n == 2 && fabs(s->mean - 0.96) < 1e-12);
  assert_true(s->lo > 0 && s->hi < 1 && s->lo <= s->mean && s->mean <= s->hi);
  // By hand: logits of 0.93 and 0.99 are 2.5867 and 4.5951; mean 3.5909, s 1.4202, half
  // 12.7062 * 1.4202 / sqrt 2 = 12.760; expit(3.5909 - 12.760) = 1.04e-4.
  assert_true(fabs(s->lo - 1.04e-4) < 0.02e-4);
  assert_true(s->hi > 0.9999999 && s->hi < 1);
  // Every value equal: a zero-width interval at the value.
  const SeedStats *m = &cells[1].m[M_LINEAR];
  assert_true(fabs(m->lo - 0.978) < 1e-9 && fabs(m->hi - 0.978) < 1e-9);
}

// Every objective collapsed: the verdict recommends none.
static void test_all_collapsed(void **state) {
  (void)state;
  CompareSpec spec;
  CompareCell cells[3];
  make_cells(&spec, cells);
  for (int o = 0; o < 3; o++) {
    put(&cells[o].m[M_COLLAPSED], 1, 0);
    seed_stats(&cells[o].m[M_COLLAPSED], 0);
  }
  char v[COMPARE_VERDICT_MAX];
  compare_verdict(&spec, cells, 0, v, sizeof v);
  assert_null(strstr(v, "scores best"));
  assert_non_null(strstr(v, "every objective's encoder collapsed; none is recommended"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collapsed_never_recommended),
      cmocka_unit_test(test_intervals_inside_0_1),
      cmocka_unit_test(test_all_collapsed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
