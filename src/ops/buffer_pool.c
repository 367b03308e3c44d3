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
  pool->values[v] =
      (PoolValue){.kind = kind, .lo = {INT_MAX, INT_MAX}, .hi = {-1, -1}, .buffer = -1};
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
// A value lives in two intervals (one per pass), so no one order is best for every module: a
// ResNet's stem output, live through the first block's forward and written again in its
// backward, packs better after the gradients than before them.
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

// Whether buffer `buf` is free over the value's lifetime in both passes (busy:
// [buffer][pass][time]).
static int free_over(const unsigned char *busy, int buf, const PoolValue *p, int times) {
  for (int pass = 0; pass < 2; pass++)
    for (int t = p->lo[pass]; t <= p->hi[pass]; t++)
      if (busy[((size_t)buf * 2 + pass) * times + t]) return 0;
  return 1;
}

// Largest first, each value into the first buffer not in use over its lifetime in either pass
// (a busy map per buffer and pass over the op clock), else a new buffer of its size: forward
// values and gradients alike, so a forward temporary and a gradient share a buffer (gradients
// live only in backward), as TFLite's greedy-by-size and ggml's allocator share one arena
// across a graph's tensors.
static size_t assign_buffers(BufferPool *pool, int tie_order) {
  const int times = 2 * pool->ops + 2;
  BySize *order = malloc(sizeof *order * (size_t)(pool->n_values + 1));
  if (!order) TL_DIE("out of memory");
  int n = 0;
  for (BufValue v = 1; v <= pool->n_values; v++) {
    const PoolValue *p = &pool->values[v];
    if (!p->kept && !p->merged_into) order[n++] = (BySize){v, p->bytes, tie_of(p, tie_order)};
  }
  qsort(order, (size_t)n, sizeof *order, larger_first);
  unsigned char *busy = NULL;
  PoolBuffer *buffers = NULL;
  int n_buffers = 0;
  for (int i = 0; i < n; i++) {
    PoolValue *p = &pool->values[order[i].v];
    int chosen = -1;
    for (int buf = 0; buf < n_buffers && chosen < 0; buf++)
      if (free_over(busy, buf, p, times)) chosen = buf;
    if (chosen < 0) {
      chosen = n_buffers++;
      busy = realloc(busy, (size_t)n_buffers * 2 * times);
      buffers = realloc(buffers, sizeof *buffers * (size_t)n_buffers);
      if (!busy || !buffers) TL_DIE("out of memory for %d pool buffers", n_buffers);
      memset(busy + (size_t)chosen * 2 * times, 0, 2 * (size_t)times);
      buffers[chosen] = (PoolBuffer){.bytes = p->bytes};
    }
    for (int pass = 0; pass < 2; pass++)
      for (int t = p->lo[pass]; t <= p->hi[pass]; t++)
        busy[((size_t)chosen * 2 + pass) * times + t] = 1;
    buffers[chosen].grads |= is_grad(p);
    if (is_grad(p) && p->bytes > buffers[chosen].grad_bytes) buffers[chosen].grad_bytes = p->bytes;
    p->buffer = chosen;
  }
  free(busy);
  free(order);
  free(pool->buffers);
  pool->n_buffers = n_buffers;
  pool->buffers = buffers;
  size_t total = 0;
  for (int i = 0; i < n_buffers; i++) total += buffers[i].bytes;
  return total;
}

void buffer_pool_plan(BufferPool *pool) {
  if (pool->planned) return;
  decide_kept(pool);
  decide_in_place(pool);
  int best = 0;
  size_t least = SIZE_MAX;
  for (int order = 0; order < N_ORDERS; order++) {
    const size_t total = assign_buffers(pool, order);
    if (total < least) {
      least = total;
      best = order;
    }
  }
  if (best != N_ORDERS - 1) assign_buffers(pool, best);
  pool->planned = 1;
}

size_t buffer_pool_bytes(const BufferPool *pool, int gradients) {
  size_t total = 0;
  for (int i = 0; i < pool->n_buffers; i++)
    if (pool->buffers[i].grads == gradients) total += pool->buffers[i].bytes;
  return total;
}

int buffer_pool_count(const BufferPool *pool, int gradients) {
  int n = 0;
  for (int i = 0; i < pool->n_buffers; i++) n += pool->buffers[i].grads == gradients;
  return n;
}

// A buffer's bytes beyond its largest gradient, counted as MEM_WORKSPACE (moved there from
// MEM_ACT_GRAD after allocating it, back before freeing it).
static size_t beyond_grads(const PoolBuffer *b) { return b->grads ? b->bytes - b->grad_bytes : 0; }

static void recount(const PoolBuffer *b, MemComponent comp, MemCategory from, MemCategory to) {
  const size_t extra = beyond_grads(b);
  if (!extra) return;
  // Under an allocation scope both are counted as the scope's category: nothing moves.
  const MemCategory counted = tl_account(extra, to, comp);
  tl_unaccount(extra, counted == to ? from : counted, comp);
}

static void allocate(PoolBuffer *buffers, int n, MemComponent comp) {
  for (int i = 0; i < n; i++) {
    buffers[i].data =
        tl_alloc(buffers[i].bytes, buffers[i].grads ? MEM_ACT_GRAD : MEM_WORKSPACE, comp);
    recount(&buffers[i], comp, MEM_ACT_GRAD, MEM_WORKSPACE);
  }
}

static void release(PoolBuffer *buffers, int n, MemComponent comp) {
  for (int i = 0; i < n; i++) {
    recount(&buffers[i], comp, MEM_WORKSPACE, MEM_ACT_GRAD);
    tl_free(buffers[i].data);
  }
}

// Points the pool's users that are not kept at `buffers` (the pool's own or its arena's).
static void point_users(BufferPool *pool, const PoolBuffer *buffers) {
  for (int u = 0; u < pool->n_users; u++) {
    const PoolUser *user = &pool->users[u];
    const PoolValue *p = &pool->values[root_of(pool, user->value)];
    if (!p->kept) *user->field = buffers[p->buffer].data;
  }
}

// A pool joining an arena: the arena's buffer i grows to the pool's buffer i.
static void arena_join(BufferArena *arena, BufferPool *pool, MemComponent comp) {
  if (arena->finished) TL_DIE("buffer arena: a network built after the arena was allocated");
  if (arena->n_pools == arena->cap_pools) {
    arena->cap_pools = arena->cap_pools ? 2 * arena->cap_pools : 4;
    arena->pools = realloc(arena->pools, sizeof *arena->pools * (size_t)arena->cap_pools);
    if (!arena->pools) TL_DIE("out of memory");
  }
  if (!arena->n_pools) arena->comp = comp;
  arena->pools[arena->n_pools++] = pool;
  if (pool->n_buffers > arena->n_buffers) {
    arena->buffers = realloc(arena->buffers, sizeof *arena->buffers * (size_t)pool->n_buffers);
    if (!arena->buffers) TL_DIE("out of memory");
    memset(arena->buffers + arena->n_buffers, 0,
           sizeof *arena->buffers * (size_t)(pool->n_buffers - arena->n_buffers));
    arena->n_buffers = pool->n_buffers;
  }
  for (int i = 0; i < pool->n_buffers; i++) {
    PoolBuffer *b = &arena->buffers[i];
    if (pool->buffers[i].bytes > b->bytes) b->bytes = pool->buffers[i].bytes;
    b->grads |= pool->buffers[i].grads;
    if (pool->buffers[i].grad_bytes > b->grad_bytes) b->grad_bytes = pool->buffers[i].grad_bytes;
  }
}

void buffer_pool_finish(BufferPool *pool, MemComponent comp) {
  buffer_pool_plan(pool);
  pool->comp = comp;
  if (pool->arena) {
    arena_join(pool->arena, pool, comp);
  } else {
    allocate(pool->buffers, pool->n_buffers, comp);
    point_users(pool, pool->buffers);
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
  allocate(arena->buffers, arena->n_buffers, arena->comp);
  for (int i = 0; i < arena->n_pools; i++) point_users(arena->pools[i], arena->buffers);
}

void buffer_arena_free(BufferArena *arena) {
  if (arena->finished) release(arena->buffers, arena->n_buffers, arena->comp);
  free(arena->buffers);
  free(arena->pools);
  memset(arena, 0, sizeof *arena);
}

void buffer_pool_free(BufferPool *pool) {
  if (!pool->arena) release(pool->buffers, pool->n_buffers, pool->comp);
  free(pool->buffers);
  free(pool->values);
  free(pool->users);
  memset(pool, 0, sizeof *pool);
}
