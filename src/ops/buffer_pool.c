#include "ops/buffer_pool.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static PoolValue *value_of(BufferPool *pool, BufValue v) {
  if (v < 1 || v > pool->n_values) TL_DIE("buffer pool: no value %d", v);
  return &pool->values[v];
}

int buffer_pool_op(BufferPool *pool) { return pool->ops++; }

static int current_op(const BufferPool *pool) {
  if (pool->ops == 0) TL_DIE("buffer pool: a value used before any op was declared");
  return pool->ops - 1;
}

BufValue buffer_pool_value(BufferPool *pool, ValueKind kind) {
  if (pool->n_values + 1 >= pool->cap_values) {
    pool->cap_values = pool->cap_values ? 2 * pool->cap_values : 64;
    pool->values = realloc(pool->values, sizeof *pool->values * (size_t)pool->cap_values);
    if (!pool->values) TL_DIE("out of memory for %d pool values", pool->cap_values);
  }
  BufValue v = ++pool->n_values;
  pool->values[v] = (PoolValue){.kind = kind, .lo = {INT_MAX, INT_MAX}, .hi = {-1, -1}};
  return v;
}

void buffer_pool_touch(BufferPool *pool, BufValue v, Pass pass, int time) {
  if (!v) return;
  PoolValue *p = value_of(pool, v);
  if (time < p->lo[pass]) p->lo[pass] = time;
  if (time > p->hi[pass]) p->hi[pass] = time;
}

void buffer_pool_read(BufferPool *pool, BufValue v) {
  buffer_pool_touch(pool, v, PASS_FORWARD, pool_read_time(PASS_FORWARD, current_op(pool)));
}

void buffer_pool_write(BufferPool *pool, BufValue v, Pass pass) {
  buffer_pool_touch(pool, v, pass, pool_write_time(pass, current_op(pool)));
}

void buffer_pool_read_in_backward(BufferPool *pool, BufValue v) {
  if (!v) return;
  if (value_of(pool, v)->kind == VALUE_ACTIVATION) value_of(pool, v)->back_reads++;
  buffer_pool_touch(pool, v, PASS_BACKWARD, pool_read_time(PASS_BACKWARD, current_op(pool)));
}

void buffer_pool_in_place(BufferPool *pool, BufValue out, BufValue in) {
  PoolValue *p = value_of(pool, out);
  p->in_place_of = in;
  p->in_place_op = current_op(pool);
}

void buffer_pool_record(BufferPool *pool, BufValue v, float **field, size_t bytes, int calls,
                        int *pooled, int *shared, MemComponent comp) {
  PoolValue *p = value_of(pool, v);
  if (bytes > p->bytes) p->bytes = bytes;
  if (pool->n_users == pool->cap_users) {
    pool->cap_users = pool->cap_users ? 2 * pool->cap_users : 64;
    pool->users = realloc(pool->users, sizeof *pool->users * (size_t)pool->cap_users);
    if (!pool->users) TL_DIE("out of memory for %d pool users", pool->cap_users);
  }
  pool->users[pool->n_users++] = (PoolUser){v, field, bytes, calls, pooled, shared, comp};
  *field = NULL;
}

static int live_in(const PoolValue *p, int pass) { return p->lo[pass] <= p->hi[pass]; }

static BufValue root_of(const BufferPool *pool, BufValue v) {
  while (pool->values[v].merged_into) v = pool->values[v].merged_into;
  return v;
}

static void merge_interval(PoolValue *into, const PoolValue *from) {
  for (int pass = 0; pass < 2; pass++) {
    if (from->lo[pass] < into->lo[pass]) into->lo[pass] = from->lo[pass];
    if (from->hi[pass] > into->hi[pass]) into->hi[pass] = from->hi[pass];
  }
}

// An activation a backward reads is kept for it unless written again just before; one no
// backward reads lives only through its forward readers.
static void decide_kept(BufferPool *pool) {
  for (BufValue v = 1; v <= pool->n_values; v++) {
    PoolValue *p = &pool->values[v];
    if (p->kind != VALUE_ACTIVATION || !p->back_reads || p->recomputed) continue;
    p->kept = 1;
    p->lo[0] = p->lo[1] = INT_MAX;
    p->hi[0] = p->hi[1] = -1;
  }
}

// An op writes its output over its input when nothing reads the input after the op's reading
// time: no later forward reader, no backward life, neither kept. Otherwise the output is live
// from the op's reading time, as any output that may not overwrite what the op reads.
static void decide_in_place(BufferPool *pool) {
  for (BufValue v = 1; v <= pool->n_values; v++) {
    PoolValue *p = &pool->values[v];
    if (!p->in_place_of) continue;
    const int read = pool_read_time(PASS_FORWARD, p->in_place_op);
    BufValue u = root_of(pool, p->in_place_of);
    PoolValue *q = &pool->values[u];
    int ok = !p->kept && !q->kept && q->kind != VALUE_GRAD && p->kind != VALUE_GRAD &&
             q->hi[PASS_FORWARD] <= read && !live_in(q, PASS_BACKWARD);
    if (ok) {
      p->merged_into = u;
      merge_interval(q, p);
    } else if (read < p->lo[PASS_FORWARD]) {
      p->lo[PASS_FORWARD] = read;
    }
  }
}

typedef struct {
  BufValue v;
  size_t bytes;
  int tie;  // among values of one size, the smaller goes first
} BySize;

static int larger_first(const void *a, const void *b) {
  const BySize *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  if (x->tie != y->tie) return x->tie - y->tie;
  return x->v - y->v;
}

static int is_grad(const PoolValue *p) { return p->kind == VALUE_GRAD; }

// The orders tried among values of one size: as declared, gradients first, longer lives first.
// A value lives in two intervals (one per pass), so no one order packs best for every module:
// the planner tries each and keeps the smallest block.
enum { ORDER_DECLARED, ORDER_GRADIENTS_FIRST, ORDER_LONGER_FIRST, N_ORDERS };

static int tie_of(const PoolValue *p, int order) {
  if (order == ORDER_GRADIENTS_FIRST) return !is_grad(p);
  if (order == ORDER_LONGER_FIRST) {
    int life = 0;
    for (int pass = 0; pass < 2; pass++)
      if (p->lo[pass] <= p->hi[pass]) life += p->hi[pass] - p->lo[pass] + 1;
    return -life;
  }
  return 0;
}

enum { POOL_ALIGN = 64 };  // every value starts on a cache line, as tl_alloc's blocks do

static size_t aligned(size_t bytes) { return (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN; }

// Whether two values are live at a common time of either pass.
static int lives_overlap(const PoolValue *p, const PoolValue *q) {
  for (int pass = 0; pass < 2; pass++)
    if (p->lo[pass] <= q->hi[pass] && q->lo[pass] <= p->hi[pass]) return 1;
  return 0;
}

typedef struct {
  size_t lo, hi;
} Extent;

static int by_start(const void *a, const void *b) {
  const Extent *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// The lowest offset where `bytes` fit between the extents (sorted by start) of the values live
// at the same time.
static size_t lowest_gap(const Extent *taken, int n, size_t bytes) {
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    if (taken[i].lo >= at + bytes) break;
    if (taken[i].hi > at) at = taken[i].hi;
  }
  return at;
}

// The most bytes of gradients live at once: what the pool's block counts as MEM_ACT_GRAD.
static size_t gradient_peak(const BufferPool *pool) {
  size_t peak = 0;
  for (int t = 0; t < 2 * pool->ops + 2; t++) {
    size_t live = 0;
    for (BufValue v = 1; v <= pool->n_values; v++) {
      const PoolValue *p = &pool->values[v];
      if (!p->kept && !p->merged_into && is_grad(p) && p->lo[PASS_BACKWARD] <= t &&
          t <= p->hi[PASS_BACKWARD])
        live += aligned(p->bytes);
    }
    if (live > peak) peak = live;
  }
  return peak;
}

// Largest first, each value at the lowest offset of the pool's one block where it overlaps no
// value live at the same time in either pass (TFLite's greedy-by-size offset planner; ggml's
// allocator also places tensors in one arena by offset): forward values and gradients alike, so
// a forward temporary and a gradient (live only in backward) share bytes, and a value of one size
// can take the room two smaller ones left. Returns the block's size.
static size_t assign_offsets(BufferPool *pool, int tie_order) {
  BySize *order = malloc(sizeof *order * (size_t)(pool->n_values + 1));
  Extent *taken = malloc(sizeof *taken * (size_t)(pool->n_values + 1));
  if (!order || !taken) TL_DIE("out of memory");
  int n = 0;
  for (BufValue v = 1; v <= pool->n_values; v++) {
    const PoolValue *p = &pool->values[v];
    if (!p->kept && !p->merged_into) order[n++] = (BySize){v, p->bytes, tie_of(p, tie_order)};
  }
  qsort(order, (size_t)n, sizeof *order, larger_first);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    PoolValue *p = &pool->values[order[i].v];
    const size_t bytes = aligned(p->bytes);
    int m = 0;
    for (int j = 0; j < i; j++) {
      const PoolValue *q = &pool->values[order[j].v];
      if (lives_overlap(p, q)) taken[m++] = (Extent){q->offset, q->offset + aligned(q->bytes)};
    }
    qsort(taken, (size_t)m, sizeof *taken, by_start);
    p->offset = lowest_gap(taken, m, bytes);
    if (p->offset + bytes > total) total = p->offset + bytes;
  }
  free(taken);
  free(order);
  pool->block.bytes = total;
  return total;
}

void buffer_pool_plan(BufferPool *pool) {
  if (pool->planned) return;
  decide_kept(pool);
  decide_in_place(pool);
  int best = 0;
  size_t least = SIZE_MAX;
  for (int order = 0; order < N_ORDERS; order++) {
    const size_t total = assign_offsets(pool, order);
    if (total < least) {
      least = total;
      best = order;
    }
  }
  if (best != N_ORDERS - 1) assign_offsets(pool, best);
  pool->block.grad_bytes = gradient_peak(pool);
  pool->planned = 1;
}

size_t buffer_pool_bytes(const BufferPool *pool, int gradients) {
  return gradients ? pool->block.grad_bytes : pool->block.bytes - pool->block.grad_bytes;
}

// The block's bytes beyond the gradients' are counted as MEM_WORKSPACE: moved there from
// MEM_ACT_GRAD after allocating it, back before freeing it.
static void recount(const PoolBlock *b, MemComponent comp, MemCategory from, MemCategory to) {
  const size_t extra = b->grad_bytes ? b->bytes - b->grad_bytes : 0;
  if (!extra) return;
  // Under an allocation scope both are counted as the scope's category: nothing moves.
  const MemCategory counted = tl_account(extra, to, comp);
  tl_unaccount(extra, counted == to ? from : counted, comp);
}

static void allocate(PoolBlock *b, MemComponent comp) {
  if (!b->bytes) return;
  b->data = tl_alloc(b->bytes, b->grad_bytes ? MEM_ACT_GRAD : MEM_WORKSPACE, comp);
  recount(b, comp, MEM_ACT_GRAD, MEM_WORKSPACE);
}

static void release(PoolBlock *b, MemComponent comp) {
  if (!b->data) return;
  recount(b, comp, MEM_WORKSPACE, MEM_ACT_GRAD);
  tl_free(b->data);
  b->data = NULL;
}

// Points the pool's users that are not kept into `block` (the pool's own or its arena's).
static void point_users(BufferPool *pool, const PoolBlock *block) {
  for (int u = 0; u < pool->n_users; u++) {
    const PoolUser *user = &pool->users[u];
    const PoolValue *p = &pool->values[root_of(pool, user->value)];
    if (!p->kept) *user->field = (float *)(block->data + p->offset);
  }
}

// A pool joining an arena: the arena's block grows to the pool's.
static void arena_join(BufferArena *arena, BufferPool *pool, MemComponent comp) {
  if (arena->finished) TL_DIE("buffer arena: a network built after the arena was allocated");
  if (arena->n_pools == arena->cap_pools) {
    arena->cap_pools = arena->cap_pools ? 2 * arena->cap_pools : 4;
    arena->pools = realloc(arena->pools, sizeof *arena->pools * (size_t)arena->cap_pools);
    if (!arena->pools) TL_DIE("out of memory");
  }
  if (!arena->n_pools) arena->comp = comp;
  arena->pools[arena->n_pools++] = pool;
  PoolBlock *b = &arena->block;
  if (pool->block.bytes > b->bytes) b->bytes = pool->block.bytes;
  if (pool->block.grad_bytes > b->grad_bytes) b->grad_bytes = pool->block.grad_bytes;
}

void buffer_pool_finish(BufferPool *pool, MemComponent comp) {
  buffer_pool_plan(pool);
  pool->comp = comp;
  if (pool->arena) {
    arena_join(pool->arena, pool, comp);
  } else {
    allocate(&pool->block, comp);
    point_users(pool, &pool->block);
  }
  for (int u = 0; u < pool->n_users; u++) {
    const PoolUser *user = &pool->users[u];
    const PoolValue *p = &pool->values[root_of(pool, user->value)];
    if (p->kept) *user->field = tl_alloc(user->bytes * (size_t)user->calls, MEM_ACT, user->comp);
    if (user->pooled) *user->pooled = !p->kept;
    if (user->shared) *user->shared = !p->kept;
  }
}

void buffer_arena_finish(BufferArena *arena) {
  if (arena->finished) return;
  arena->finished = 1;
  allocate(&arena->block, arena->comp);
  for (int i = 0; i < arena->n_pools; i++) point_users(arena->pools[i], &arena->block);
}

void buffer_arena_free(BufferArena *arena) {
  release(&arena->block, arena->comp);
  free(arena->pools);
  memset(arena, 0, sizeof *arena);
}

void buffer_pool_free(BufferPool *pool) {
  if (!pool->arena) release(&pool->block, pool->comp);
  free(pool->values);
  free(pool->users);
  memset(pool, 0, sizeof *pool);
}
