// The buffer planner on small op lists declared by hand, as a module declares its ops
// (ops/builder.h, ops/buffer_pool.h): each op reads at 2k and writes at 2k + 1 of forward, and
// backward runs the list in reverse (op k reads at 2k + 1, writes at 2k). The buffers and bytes
// each case expects are worked out in its comment from those lifetimes, not from the planner.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ops/builder.h"

enum { CALLS = 1 };

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

// Forward-only chain, each op reading the previous output: v0 (100 bytes) lives [0, 2], v1 (200)
// [2, 4], v2 (300) [4, 6], v3 (400, read by nobody) [6, 7]. Neighbours overlap, values two apart
// do not: two buffers in turn, as large as the larger of each parity: 400 + 300.
static void test_chain_alternates_two_buffers(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_FORWARD, 0);
  Use u[4];
  BufValue prev = 0;
  for (int i = 0; i < 4; i++) {
    prev = builder_output(&c.b, prev, 0, 0);
    use(&c, &u[i], prev, 100 * (size_t)(i + 1));
  }
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_count(&c.pool, 0), 2);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 700);
  assert_ptr_equal(u[0].field, u[2].field);
  assert_ptr_equal(u[1].field, u[3].field);
  assert_ptr_not_equal(u[0].field, u[1].field);
  assert_true(u[0].pooled && u[0].shared);
  buffer_pool_free(&c.pool);
}

// x (op 0) is read only by op 1, which may write y over it; op 2 reads y and writes z. x and y
// become one value live [0, 4], z [4, 5] overlaps it: two buffers of 100.
static void test_in_place_when_nothing_reads_later(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_FORWARD, 0);
  Use ux, uy, uz;
  BufValue x = builder_output(&c.b, 0, 0, 0);
  use(&c, &ux, x, 100);
  BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE);
  use(&c, &uy, y, 100);
  BufValue z = builder_output(&c.b, y, 0, 0);
  use(&c, &uz, z, 100);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_ptr_equal(ux.field, uy.field);
  assert_ptr_not_equal(uy.field, uz.field);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 200);
  buffer_pool_free(&c.pool);
}

// Training: op 1 may write y over x, but op 1's backward reads x. Without recompute x is kept
// (its own buffer, not the pool's) and y alone is in the pool: 100 bytes. With recompute x is
// in the pool, live [0, 2] in forward and at 3 in backward; y may not take it over (x has a
// backward life), so y lives from op 1's reading time [2, 3] and overlaps x at 2: 200 bytes.
static void test_in_place_refused_when_backward_reads(void **state) {
  (void)state;
  for (int recompute = 0; recompute < 2; recompute++) {
    Case c;
    case_init(&c, OP_TRAIN, recompute);
    Use ux, uy;
    BufValue x = builder_output(&c.b, 0, 0, OUT_RECOMPUTED);
    use(&c, &ux, x, 100);
    BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE);
    builder_backward_reads(&c.b, x);
    use(&c, &uy, y, 100);
    const long long act_before = tl_mem_thread_net(MEM_ACT, COMP_OTHER);
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_ptr_not_equal(ux.field, uy.field);
    assert_int_equal(ux.pooled, recompute);
    assert_int_equal(ux.shared, recompute);
    assert_true(uy.pooled);
    assert_int_equal(buffer_pool_bytes(&c.pool, 0), recompute ? 200 : 100);
    assert_int_equal(tl_mem_thread_net(MEM_ACT, COMP_OTHER) - act_before, recompute ? 0 : 100);
    if (!recompute) tl_free(ux.field);  // a kept output is the op's own
    buffer_pool_free(&c.pool);
  }
}

// An MLP residual must not land where the next block's proj writes. out (op 0) is read by the
// next block's norm (op 1) and, after proj (op 2), by its residual sum (op 3): out lives
// [0, 6], norm's output [2, 4], proj's [4, 6] and the sum's over it [4, 7]. At 4 all three are
// live: three buffers, out in none of the others'.
static void test_residual_outlives_the_branch(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_TRAIN, 0);
  Use uo, un, up, us;
  BufValue out = builder_output(&c.b, 0, 0, 0);
  use(&c, &uo, out, 100);
  BufValue n = builder_output(&c.b, out, 0, 0);
  use(&c, &un, n, 100);
  BufValue p = builder_output(&c.b, n, 0, 0);
  use(&c, &up, p, 100);
  BufValue s = builder_output(&c.b, p, out, OUT_IN_PLACE);
  use(&c, &us, s, 100);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 300);
  assert_ptr_not_equal(uo.field, up.field);
  assert_ptr_not_equal(uo.field, un.field);
  assert_ptr_not_equal(un.field, up.field);
  assert_ptr_equal(up.field, us.field);
  buffer_pool_free(&c.pool);
}

// A synchronized BatchNorm normalizes with this replica's statistics, then reads its input
// again after the global statistics arrive: in place it would have overwritten the input it
// still needs. Reading late (at 3), the input x lives [0, 3]; the output may not take it over
// and lives [2, 3]: two buffers. The same op without the late read runs in place: one.
static void test_sync_batchnorm_not_in_place(void **state) {
  (void)state;
  for (int late = 0; late < 2; late++) {
    Case c;
    case_init(&c, OP_FORWARD, 0);
    Use ux, uy;
    BufValue x = builder_output(&c.b, 0, 0, 0);
    use(&c, &ux, x, 100);
    BufValue y = builder_output(&c.b, x, 0, OUT_IN_PLACE | (late ? OUT_READS_LATE : 0));
    use(&c, &uy, y, 100);
    builder_output(&c.b, y, 0, OUT_OWN);  // the next op reads y
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_int_equal(buffer_pool_bytes(&c.pool, 0), late ? 200 : 100);
    if (late)
      assert_ptr_not_equal(ux.field, uy.field);
    else
      assert_ptr_equal(ux.field, uy.field);
    buffer_pool_free(&c.pool);
  }
}

// Gradients of a residual block's shape: op 3's backward writes g_s, read by op 2 and by the sum
// (op 0); op 2 writes g_b, op 1 reads it and writes g_a; op 0 adds g_a and g_s into g_in, the
// input's gradient (400 bytes, the others 100). In backward times g_s lives [1, 7], g_b [3, 5],
// g_a [1, 3], g_in [0, 1]: g_in and g_b may share (400), g_s and g_a overlap everything else:
// 400 + 100 + 100.
static void test_gradients_by_lifetime(void **state) {
  (void)state;
  Case c;
  case_init(&c, OP_TRAIN, 0);
  Use ui, ua, ub, us;
  BufValue g_in = builder_grad_value(&c.b), g_a = builder_grad_value(&c.b),
           g_b = builder_grad_value(&c.b), g_s = builder_grad_value(&c.b);
  builder_output(&c.b, 0, 0, OUT_NONE);
  builder_grad(&c.b, g_in, g_a, g_s);
  use(&c, &ui, g_in, 400);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_a, g_b, 0);
  use(&c, &ua, g_a, 100);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_b, g_s, 0);
  use(&c, &ub, g_b, 100);
  builder_output(&c.b, 0, 0, OUT_OWN);
  builder_grad(&c.b, g_s, 0, 0);
  use(&c, &us, g_s, 100);
  const long long grad_before = tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER);
  buffer_pool_finish(&c.pool, COMP_OTHER);
  assert_int_equal(buffer_pool_count(&c.pool, 1), 3);
  assert_int_equal(buffer_pool_bytes(&c.pool, 1), 600);
  assert_int_equal(buffer_pool_bytes(&c.pool, 0), 0);
  assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER) - grad_before, 600);
  assert_ptr_equal(ui.field, ub.field);
  assert_ptr_not_equal(us.field, ua.field);
  assert_ptr_not_equal(us.field, ui.field);
  assert_ptr_not_equal(ua.field, ui.field);
  buffer_pool_free(&c.pool);
}

// A forward temporary and a gradient share a buffer: x (op 0's output, read only by op 1's
// forward) lives [0, 2] in forward; the gradient g op 1's backward writes for op 0's lives [1, 2]
// in backward only. One buffer holds both, as large as the larger (100 or 200 bytes); the
// gradient's 100 bytes of it are counted as the gradients', the rest as workspace.
static void test_forward_temporary_shares_a_gradient_buffer(void **state) {
  (void)state;
  for (size_t x_bytes = 100; x_bytes <= 200; x_bytes += 100) {
    Case c;
    case_init(&c, OP_TRAIN, 0);
    Use ux, ug;
    BufValue g = builder_grad_value(&c.b);
    BufValue x = builder_output(&c.b, 0, 0, 0);
    builder_grad(&c.b, 0, g, 0);
    use(&c, &ux, x, x_bytes);
    builder_output(&c.b, x, 0, OUT_OWN);
    builder_grad(&c.b, g, 0, 0);
    use(&c, &ug, g, 100);
    const long long ws_before = tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER),
                    grad_before = tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER);
    buffer_pool_finish(&c.pool, COMP_OTHER);
    assert_int_equal(buffer_pool_count(&c.pool, 1), 1);
    assert_int_equal(buffer_pool_bytes(&c.pool, 1), x_bytes);
    assert_int_equal(buffer_pool_count(&c.pool, 0), 0);
    assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before,
                     (long long)x_bytes - 100);
    assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER) - grad_before, 100);
    assert_ptr_equal(ux.field, ug.field);
    buffer_pool_free(&c.pool);
    assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER), ws_before);
    assert_int_equal(tl_mem_thread_net(MEM_ACT_GRAD, COMP_OTHER), grad_before);
  }
}

// Two networks that never run at once share an arena: A's chain x (100 bytes) -> y (300), live
// together at 2, needs buffers of 300 and 100; B's one value z (200) one of 200. The arena's
// buffer 0 is max(300, 200), its buffer 1 A's 100: 400 bytes where the pools' own would be
// 600. The pooled fields stay NULL until the arena is allocated, then y and z share memory.
static void test_arena_shares_the_largest(void **state) {
  (void)state;
  BufferArena arena = {0};
  Case a, b;
  case_init(&a, OP_FORWARD, 0);
  case_init(&b, OP_FORWARD, 0);
  a.pool.arena = b.pool.arena = &arena;
  Use ux, uy, uz;
  BufValue x = builder_output(&a.b, 0, 0, 0);
  use(&a, &ux, x, 100);
  BufValue y = builder_output(&a.b, x, 0, 0);
  use(&a, &uy, y, 300);
  builder_output(&a.b, y, 0, OUT_OWN);
  BufValue z = builder_output(&b.b, 0, 0, 0);
  use(&b, &uz, z, 200);
  builder_output(&b.b, z, 0, OUT_OWN);
  const long long ws_before = tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER);
  buffer_pool_finish(&a.pool, COMP_OTHER);
  buffer_pool_finish(&b.pool, COMP_OTHER);
  assert_null(ux.field);
  assert_null(uz.field);
  assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before, 0);
  buffer_arena_finish(&arena);
  assert_int_equal(tl_mem_thread_net(MEM_WORKSPACE, COMP_OTHER) - ws_before, 400);
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
      cmocka_unit_test(test_chain_alternates_two_buffers),
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
