// Row-wise L2 normalization (ops/l2norm.h): forward against rows worked out by hand and against
// a reference in double written here, backward against central finite differences of
// L = sum(u * R) for a fixed random R (so dL/du = R), the floor on tiny rows, and the FLOP counts.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "op_test_util.h"
#include "ops/l2norm.h"

enum { ROWS = 6, D = 5 };

typedef struct {
  Env e;
  L2Norm l;
  float z[ROWS * D], r[ROWS * D];
} Case;

static void case_open(Case *c, OpMode mode, int need_din) {
  env_init(&c->e, 1, mode);
  c->e.b.component = COMP_LOSS;
  l2norm_init(&c->l, &c->e.b, ROWS, D, need_din);
  fill_uniform(c->z, ROWS * D, -2.0f, 2.0f, 1);
  fill_uniform(c->r, ROWS * D, -1.0f, 1.0f, 2);
}

static void case_close(Case *c) {
  l2norm_destroy(&c->l);
  env_destroy(&c->e);
}

// (3, 4) has length 5 and (0, 0, 2) length 2: their unit rows are (0.6, 0.8) and (0, 0, 1).
static void test_rows_by_hand(void **state) {
  (void)state;
  Env e;
  env_init(&e, 1, OP_INFER);
  L2Norm a, b;
  l2norm_init(&a, &e.b, 1, 2, 0);
  l2norm_init(&b, &e.b, 1, 3, 0);
  l2norm_forward(&a, &e.ctx, (const float[]){3, 4});
  l2norm_forward(&b, &e.ctx, (const float[]){0, 0, 2});
  assert_float_equal(a.norms[0], 5.0, 1e-6);
  assert_float_equal(a.out[0], 0.6, 1e-7);
  assert_float_equal(a.out[1], 0.8, 1e-7);
  assert_float_equal(b.norms[0], 2.0, 1e-6);
  assert_float_equal(b.out[0], 0.0, 0.0);
  assert_float_equal(b.out[2], 1.0, 1e-7);
  assert_null(a.din);
  l2norm_destroy(&a);
  l2norm_destroy(&b);
  env_destroy(&e);
}

// Every row against z / |z| in double; a zero row stays zero and a row shorter than 1e-12 is
// divided by 1e-12 (F.normalize's floor), not by its own length.
static void test_forward_against_reference(void **state) {
  (void)state;
  Case c;
  case_open(&c, OP_INFER, 0);
  for (int k = 0; k < D; k++) c.z[1 * D + k] = 0.0f;
  for (int k = 0; k < D; k++) c.z[2 * D + k] = k == 0 ? 3e-13f : 0.0f;
  l2norm_forward(&c.l, &c.e.ctx, c.z);
  for (int i = 0; i < ROWS; i++) {
    double ss = 0;
    for (int k = 0; k < D; k++) ss += (double)c.z[i * D + k] * c.z[i * D + k];
    const double n = fmax(sqrt(ss), 1e-12);
    assert_float_equal(c.l.norms[i], n, 1e-6 * n);
    for (int k = 0; k < D; k++) assert_float_equal(c.l.out[i * D + k], c.z[i * D + k] / n, 1e-6);
  }
  assert_float_equal(c.l.out[2 * D], 0.3, 1e-6);
  assert_float_equal(c.e.ctx.flops_forward[COMP_LOSS], 3.0 * ROWS * D, 0.0);
  case_close(&c);
}

static double loss_of(void *arg) {
  Case *c = arg;
  l2norm_forward(&c->l, &c->e.ctx, c->z);
  double s = 0;
  for (int i = 0; i < ROWS * D; i++) s += (double)c->l.out[i] * c->r[i];
  return s;
}

// The input gradient against finite differences, twice over (backward spends the norms forward
// kept, so each step's forward must bring them back), and written where the caller says.
static void test_backward_against_finite_differences(void **state) {
  (void)state;
  Case c;
  case_open(&c, OP_TRAIN, 1);
  float analytic[ROWS * D], to[ROWS * D];
  for (int round = 0; round < 2; round++) {
    loss_of(&c);
    l2norm_backward(&c.l, &c.e.ctx, c.r);
    memcpy(analytic, c.l.din, sizeof analytic);
    assert_true(gradcheck(loss_of, &c, c.z, analytic, ROWS * D, ROWS * D, 1e-2f, 1e-2,
                          "l2norm din") < 1e-2);
  }
  loss_of(&c);
  l2norm_backward_to(&c.l, &c.e.ctx, c.r, to);
  for (int i = 0; i < ROWS * D; i++) assert_float_equal(to[i], analytic[i], 1e-6);
  // A gradient along the row itself changes nothing: du = u gives (u - u (u . u)) / n = 0.
  loss_of(&c);
  l2norm_backward(&c.l, &c.e.ctx, c.l.out);
  for (int i = 0; i < ROWS * D; i++) assert_float_equal(c.l.din[i], 0.0, 1e-6);
  case_close(&c);
}

static void test_backward_flops(void **state) {
  (void)state;
  Case c;
  case_open(&c, OP_TRAIN, 1);
  l2norm_forward(&c.l, &c.e.ctx, c.z);
  l2norm_backward(&c.l, &c.e.ctx, c.r);
  // Per entry: the dot, the multiply, the subtraction and the division.
  assert_float_equal(c.e.ctx.flops_backward[COMP_LOSS], 4.0 * ROWS * D, 0.0);
  assert_float_equal(c.e.ctx.flops_backward[COMP_ENCODER], 0.0, 0.0);
  case_close(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows_by_hand),
      cmocka_unit_test(test_forward_against_reference),
      cmocka_unit_test(test_backward_against_finite_differences),
      cmocka_unit_test(test_backward_flops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
