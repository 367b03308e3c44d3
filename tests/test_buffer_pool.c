// The buffer planner on small op lists declared by hand, as a module declares its ops
// (ops/builder.h, ops/buffer_pool.h): each op reads at 2k and writes at 2k + 1 of forward, and
// backward runs the list in reverse (op k reads at 2k + 1, writes at 2k). The bytes and the
// sharing each case expects are worked out in its comment from those lifetimes, not from the
// planner. Sizes are in units of U = 64 bytes, the alignment the pool keeps every value at.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ops/builder.h"

enum { CALLS = 1, U = 64 };

// Whether two pooled values' bytes are apart.
static int disjoint(const float *a, size_t a_bytes, const float *b, size_t b_bytes) {
  const char *x = (const char *)a, *y = (const char *)b;
  return x + a_bytes <= y || y + b_bytes <= x;
}

typedef struct {
  ExecCtx ctx;
  BuildPolicy policy;
  BufferPool pool;
  Builder b;
} Case;

static void case_init(Case *c, OpMode mode, int recompute) {
  memset(c, 0, sizeof *c);
  c->policy = build_policy_default();
  c->policy.recompute = recompute;
  c->b = (Builder){.ctx = &c->ctx, .mode = mode, .pool = &c->pool, .policy = &c->policy};
}

// What an op's init does with its output (op_out_alloc) or input gradient (op_din_alloc).
typedef struct {
  float *field;
  int pooled, shared;
} Use;

static void use(Case *c, Use *u, BufValue v, size_t bytes) {
  buffer_pool_record(&c->pool, v, &u->field, bytes, CALLS, &u->pooled, &u->shared, COMP_OTHER);
}

// Forward-only chain, each op reading the previous output: v0 (U) lives [0, 2], v1 (2U) [2, 4],
// v2 (3U) [4, 6], v3 (4U, read by nobody) [6, 7]. Neighbours overlap, values two apart do not:
// the pool is as large as the largest two neighbours, 4U + 3U, each neighbour apart from the
// other, and v1 takes v3's place.
static void test_chain_holds_two_neighbours(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_FORWARD, 0);
  Use u[4];
  BufValue prev = 0;
  for (int i = 0; i < 4; i++) {
    prev = builder_output(&c.b, prev, 0, 0);
    use(&c, &u[i], prev, U * (size_t)(i + 1));
  }
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 7 * U);
  for (int i = 0; i < 3; i++)
    assert_true(disjoint(u[i].field, U * (size_t)(i + 1), u[i + 1].field, U * (size_t)(i + 2)));
  assert_ptr_equal(u[1].field, u[3].field);
  assert_true(u[0].pooled && u[0].shared);
  buffer_pool_free(&c.pool);
}

// Two values of U can take the place one of 2U left, where a buffer per value would not have
// them: a (2U) and b (U) live [0, 1], then b, c and d (U each) [2, 3]. At most 3U are live at
// once, and that is the pool; c and d lie where a was.
static void test_small_values_fill_a_larger_ones_place(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_FORWARD, 0);
  buffer_pool_op(&c.pool);
  buffer_pool_op(&c.pool);
  const int from[4] = {0, 0, 2, 2}, to[4] = {1, 3, 3, 3};
  const size_t bytes[4] = {2 * U, U, U, U};
  Use u[4];
  for (int i = 0; i < 4; i++) {
    BufValue v = buffer_pool_value(&c.pool, VALUE_OUTPUT);
    buffer_pool_touch(&c.pool, v, PASS_FORWARD, from[i]);
    buffer_pool_touch(&c.pool, v, PASS_FORWARD, to[i]);
    use(&c, &u[i], v, bytes[i]);
  }
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 3 * U);
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      if (from[j] <= to[i] && from[i] <= to[j])
        assert_true(disjoint(u[i].field, bytes[i], u[j].field, bytes[j]));
  assert_false(disjoint(u[0].field, bytes[0], u[2].field, bytes[2]));
  assert_false(disjoint(u[0].field, bytes[0], u[3].field, bytes[3]));
  buffer_pool_free(&c.pool);
}

// x (op 0) is read only by op 1, which may write y over it; op 2 reads y and writes z. x and y
// become one value live [0, 4], z [4, 5] overlaps it: 2U.
static void test_in_place_when_nothing_reads_later(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_FORWARD, 0);
  Use ux, uy, uz;
  BufValue x = builder_output(&c.b, 0, 0, 0);
  use(&c, &ux, x, U);
  BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE);
  use(&c, &uy, y, U);
  BufValue z = builder_output(&c.b, y, 0, 0);
  use(&c, &uz, z, U);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_ptr_equal(ux.field, uy.field);
  assert_ptr_not_equal(uy.field, uz.field);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 2 * U);
  buffer_pool_free(&c.pool);
}

// Training: op 1 may write y over x, but op 1's backward reads x. Without recompute x is kept
// (its own buffer, not the pool's) and y alone is in the pool: U. With recompute x is in the
// pool, live [0, 2] in forward and at 3 in backward; y may not take it over (x has a backward
// life), so y lives from op 1's reading time [2, 3] and overlaps x at 2: 2U.
static void test_in_place_refused_when_backward_reads(void **state) {
  (void)state;
  for (int recompute = 0; recompute < 2; recompute++) {
    Case c;
    case_init(&c, OP_TRAIN, recompute);
    Use ux, uy;
    BufValue x = builder_output(&c.b, 0, 0, OUT_RECOMPUTED);
    use(&c, &ux, x, U);
    BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE);
    builder_backward_reads(&c.b, x);
    use(&c, &uy, y, U);
    const long long act_before = tl_mem_thread_net(MEM_ACT, COMP_OTHER);
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_ptr_not_equal(ux.field, uy.field);
    assert_int_equal(ux.pooled, recompute);
    assert_int_equal(ux.shared, recompute);
    assert_true(uy.pooled);
    assert_int_equal(buffer_pool_bytes(&c.pool, 0), recompute ? 2 * U : U);
    assert_int_equal(tl_mem_thread_net(MEM_ACT, COMP_OTHER) - act_before, recompute ? 0 : U);
    if (!recompute) tl_free(ux.field);  // a kept output is the op's own
    buffer_pool_free(&c.pool);
  }
}

// An MLP residual must not land where the next block's proj writes. out (op 0) is read by the
// next block's norm (op 1) and, after proj (op 2), by its residual sum (op 3): out lives
// [0, 6], norm's output [2, 4], proj's [4, 6] and the sum's over it [4, 7]. At 4 all three are
// live: 3U, out apart from each of the others.
static void test_residual_outlives_the_branch(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_TRAIN, 0);
  Use uo, un, up, us;
  BufValue out = builder_output(&c.b, 0, 0, 0);
  use(&c, &uo, out, U);
  BufValue n = builder_output(&c.b, out, 0, 0);
  use(&c, &un, n, U);
  BufValue p = builder_output(&c.b, n, 0, 0);
  use(&c, &up, p, U);
  BufValue s = builder_output(&c.b, p, out, OUT_IN_PLACE);
  use(&c, &us, s, U);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 3 * U);
  assert_true(disjoint(uo.field, U, up.field, U));
  assert_true(disjoint(uo.field, U, un.field, U));
  assert_true(disjoint(un.field, U, up.field, U));
  assert_ptr_equal(up.field, us.field);
  buffer_pool_free(&c.pool);
}

// A synchronized BatchNorm normalizes with this replica's statistics, then reads its input
// again after the global statistics arrive: in place it would have overwritten the input it
// still needs. Reading late (at 3), the input x lives [0, 3]; the output may not take it over
// and lives [2, 3]: 2U. The same op without the late read runs in place: U.
static void test_sync_batchnorm_not_in_place(void **state) {
  (void)state;
  for (int late = 0; late < 2; late++) {
    Case c;
    case_init(&c, OP_FORWARD, 0);
    Use ux, uy;
    BufValue x = builder_output(&c.b, 0, 0, 0);
    use(&c, &ux, x, U);
    BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE | (late ? OUT_READS_LATE : 0));
    use(&c, &uy, y, U);
    builder_output(&c.b, y, 0, OUT_OWN);  // the next op reads y
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_int_equal(buffer_pool_bytes(&c.pool, 0), late ? 2 * U : U);
    if (late)
      assert_ptr_not_equal(ux.field, uy.field);
    else
      assert_ptr_equal(ux.field, uy.field);
    buffer_pool_free(&c.pool);
  }
}

// Gradients of a residual block's shape: op 3's backward writes g_s, read by op 2 and by the sum
// (op 0); op 2 writes g_b, op 1 reads it and writes g_a; op 0 adds g_a and g_s into g_in, the
// input's gradient (4U, the others U). In backward times g_s lives [1, 7], g_b [3, 5], g_a
// [1, 3], g_in [0, 1]: at 1, g_in, g_a and g_s are live, 6U, all of it gradients; g_b, live
// with g_s only, lies where g_in was.
static void test_gradients_by_lifetime(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_TRAIN, 0);
  Use ui, ua, ub, us;
  BufValue g_in = builder_grad_value(&c.b), g_a = builder_grad_value(&c.b),
           g_b = builder_grad_value(&c.b), g_s = builder_grad_value(&c.b);
  builder_output(&c.b, 0, 0, OUT_NONE);
  builder_grad(&c.b, g_in, g_a, g_s);
  use(&c, &ui, g_in, 4 * U);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_a, g_b, 0);
  use(&c, &ua, g_a, U);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_b, g_s, 0);
  use(&c, &ub, g_b, U);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_s, 0, 0);
  use(&c, &us, g_s, U);
  const long long grad_before = tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&c.pool, 1), 6 * U);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 0);
  assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER) - grad_before, 6 * U);
  assert_ptr_equal(ui.field, ub.field);
  assert_true(disjoint(us.field, U, ua.field, U));
  assert_true(disjoint(us.field, U, ui.field, 4 * U));
  assert_true(disjoint(ua.field, U, ui.field, 4 * U));
  assert_true(disjoint(ub.field, U, us.field, U));
  buffer_pool_free(&c.pool);
}

// A forward temporary and a gradient share a buffer: x (op 0's output, read only by op 1's
// forward) lives [0, 2] in forward; the gradient g op 1's backward writes for op 0's lives [1, 2]
// in backward only. They share their bytes: the pool is as large as the larger (U or 2U), the
// gradient's U of it counted as the gradients', the rest as workspace.
static void test_forward_temporary_shares_a_gradient_buffer(void **state) {
  (void)state;
  for (size_t x_bytes = U; x_bytes <= 2 * U; x_bytes += U) {
    Case c;
    case_init(&c, OP_TRAIN, 0);
    Use ux, ug;
    BufValue g = builder_grad_value(&c.b);
    BufValue x = builder_output(&c.b, 0, 0, 0);
    builder_grad(&c.b, 0, g, 0);
    use(&c, &ux, x, x_bytes);
    builder_output(&c.b, x, 0, OUT_OWN);
    builder_grad(&c.b, g, 0, 0);
    use(&c, &ug, g, U);
    const long long ws_before = tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER),
                    grad_before = tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER);
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_int_equal(buffer_pool_bytes(&c.pool, 1), U);
    assert_int_equal(buffer_pool_bytes(&c.pool, 0), x_bytes - U);
    assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before,
                     (long long)x_bytes - U);
    assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER) - grad_before, U);
    assert_ptr_equal(ux.field, ug.field);
    buffer_pool_free(&c.pool);
    assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER), ws_before);
    assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER), grad_before);
  }
}

// Two networks that never run at once share an arena: A's chain x (U) -> y (3U), live together
// at 2, needs 4U; B's one value z (2U) 2U. The arena is the larger, 4U, where the pools' own
// would be 6U. The pooled fields stay NULL until the arena is allocated, then y and z (each
// its pool's largest, placed first) share memory.
static void test_arena_shares_the_largest(void **state) {
  (void)state;
  BufferArena arena = {0};
  Case a, b;
  case_init(&a, OP_FORWARD, 0);
  case_init(&b, OP_FORWARD, 0);
  a.pool.arena = b.pool.arena = &arena;
  Use ux, uy, uz;
  BufValue x = builder_output(&a.b, 0, 0, 0);
  use(&a, &ux, x, U);
  BufValue y = builder_output(&a.b, x, 0, 0);
  use(&a, &uy, y, 3 * U);
  builder_output(&a.b, y, 0, OUT_OWN);
  BufValue z = builder_output(&b.b, 0, 0, 0);
  use(&b, &uz, z, 2 * U);
  builder_output(&b.b, z, 0, OUT_OWN);
  const long long ws_before = tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER);
  buffer_pool_finish(&a.pool, COMP_OTHER);
  buffer_pool_finish(&b.pool, COMP_OTHER);
  assert_null(ux.field);
  assert_null(uz.field);
  assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before, 0);
  buffer_arena_finish(&arena);
  assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before, 4 * U);
  assert_non_null(ux.field);
  assert_ptr_equal(uy.field, uz.field);
  assert_ptr_not_equal(ux.field, uy.field);
  buffer_pool_free(&a.pool);
  buffer_pool_free(&b.pool);
  buffer_arena_free(&arena);
  assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain_holds_two_neighbours),
      cmocka_unit_test(test_small_values_fill_a_larger_ones_place),
      cmocka_unit_test(test_in_place_when_nothing_reads_later),
      cmocka_unit_test(test_in_place_refused_when_backward_reads),
      cmocka_unit_test(test_residual_outlives_the_branch),
      cmocka_unit_test(test_sync_batchnorm_not_in_place),
      cmocka_unit_test(test_gradients_by_lifetime),
      cmocka_unit_test(test_forward_temporary_shares_a_gradient_buffer),
      cmocka_unit_test(test_arena_shares_the_largest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
