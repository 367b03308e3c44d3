// Memory shared by ops whose contents are never live at the same time, laid out by a planner
// instead of by hand. A module declares its ops in the order forward runs them (backward runs
// them in reverse) and, for each, the values it writes and reads: its output, the values its
// forward reads, what its backward reads (a forward value, the gradients reaching it) and the
// gradient it writes. Every value is live from the op that writes it to its last reader, in the
// forward pass and in the backward pass separately; buffer_pool_finish gives each value a place
// in one block that no value live at the same time overlaps (largest values first, each at the
// lowest offset free over its lifetime, as TFLite's greedy-by-size offset planner; ggml's
// allocator also frees a tensor once its last consumer ran), lets an op write over its input
// when nothing reads that input after it, and allocates the block once. The ledger counts that
// allocation, so the plan (a dry run of the same code) holds what a run holds.
//
// Kinds of values:
// - VALUE_OUTPUT: an op's output in a network without backward (momentum encoder, evaluation):
//   free once its last reader ran.
// - VALUE_ACTIVATION: an op's output in training. When a backward reads it, it is kept for that
//   backward (a buffer of its own per forward call, MEM_ACT), unless the module writes it again
//   just before (recomputed: then it lives in the pool around that backward too); otherwise it
//   lives in the pool only until its last forward reader (one place for every call).
// - VALUE_GRAD: an input gradient (MEM_ACT_GRAD), live in backward from the op that writes it to
//   the last op whose backward reads it.
// - VALUE_INNER: what lives only inside one pass of one op (attention's probabilities, the
//   scratchpad of a convolution's or linear layer's pass, ops/weighted.c).
// Every value the pool holds (outputs, activations not kept, inner values, gradients) shares the
// block by lifetime, so a forward temporary and a gradient (live only in backward) can take the
// same bytes. The most gradient bytes live at once are counted as MEM_ACT_GRAD, the rest of the
// block as MEM_WORKSPACE.
#pragma once
#include <stddef.h>

#include "core/alloc.h"

typedef int BufValue;  // a value of a pool, 1-based; 0: none (a buffer of its own)

typedef enum { VALUE_OUTPUT, VALUE_ACTIVATION, VALUE_GRAD, VALUE_INNER } ValueKind;
typedef enum { PASS_FORWARD, PASS_BACKWARD } Pass;

typedef struct {
  ValueKind kind;
  size_t bytes;      // the largest request
  int lo[2], hi[2];  // live times in each pass (lo > hi: not live in it)
  int back_reads;    // backwards that read it (VALUE_ACTIVATION)
  int recomputed;    // written again before each backward that reads it
  int in_place_of;   // the value it asks to overwrite (0: none), at op in_place_op
  int in_place_op;
  int merged_into;  // after planning: the value whose place it took over (0: none)
  int kept;         // after planning: a buffer of its own per call
  size_t offset;    // after planning, neither kept nor merged: where in the pool's block it lies
} PoolValue;

// A pool's memory: one block in which every pooled value has its place (PoolValue.offset), its
// bytes, how many of them are counted as MEM_ACT_GRAD (the most gradient bytes live at once; the
// rest, forward temporaries and scratchpads, as MEM_WORKSPACE), and the memory once allocated.
typedef struct {
  size_t bytes;
  size_t grad_bytes;
  char *data;
} PoolBlock;

typedef struct BufferPool BufferPool;

// Pools that are never live at the same time can share their memory: the arena's block is as
// large as the largest of the pools' blocks, allocated once every pool has joined. A network
// whose pooled values live only within its own forward and backward calls (a backbone: its
// feature is its own buffer, what crosses from forward to backward is kept or written again)
// qualifies, so a replica's backbones share one arena: the momentum teacher's forward runs in
// the bytes the student's backward uses.
typedef struct {
  PoolBlock block;
  int n_pools, cap_pools;
  BufferPool **pools;
  MemComponent comp;
  int finished;
} BufferArena;

// An op's field that points at a value's buffer once planned.
typedef struct {
  BufValue value;
  float **field;
  size_t bytes;  // one call's
  int calls;     // the op's forward calls (a kept value gets one buffer per call)
  int *pooled;   // the op's flag: its buffer is the pool's (not its own), or NULL
  int *shared;   // the op's flag: one buffer for every call, or NULL
  MemComponent comp;
} PoolUser;

struct BufferPool {
  int ops;  // ops declared so far: the clock of both passes
  int n_values, cap_values;
  PoolValue *values;  // [1..n_values]
  int n_users, cap_users;
  PoolUser *users;
  // After planning: the block, allocated by buffer_pool_finish.
  int planned;
  PoolBlock block;
  // NULL: the buffers are the pool's own. Otherwise buffer_pool_finish joins the arena, and the
  // pooled values' fields are set by buffer_arena_finish.
  BufferArena *arena;
  MemComponent comp;  // what its own block is counted to (buffer_pool_finish)
};

// Times in a pass: an op k reads at 2k and writes at 2k + 1 in forward; backward runs the ops
// in reverse, so there op k reads at 2k + 1 and writes at 2k. A value written by an op is live
// from the op's reading time on (it may not overwrite what the op reads) unless the op writes in
// place.
static inline int pool_read_time(Pass pass, int op) { return 2 * op + (pass == PASS_BACKWARD); }
static inline int pool_write_time(Pass pass, int op) { return 2 * op + (pass == PASS_FORWARD); }

// Starts the next op of the list; returns its index.
int buffer_pool_op(BufferPool *pool);
// A new value (no buffer, not live anywhere yet).
BufValue buffer_pool_value(BufferPool *pool, ValueKind kind);
// `v` is live at `time` of `pass` (nothing for v = 0).
void buffer_pool_touch(BufferPool *pool, BufValue v, Pass pass, int time);
// The current op's forward reads `v`.
void buffer_pool_read(BufferPool *pool, BufValue v);
// The current op writes `v` in `pass` (its output in forward, its gradient in backward).
void buffer_pool_write(BufferPool *pool, BufValue v, Pass pass);
// The current op's backward reads `v` (an activation: kept unless recomputed; a gradient).
void buffer_pool_read_in_backward(BufferPool *pool, BufValue v);
// The current op may write its output `out` over `in`: the planner lets it when nothing reads
// `in` after the op's reading time, in either pass; otherwise `out` gets a buffer of its own.
void buffer_pool_in_place(BufferPool *pool, BufValue out, BufValue in);
// The current op's field `*field` is value v's buffer (bytes per call; `calls` forward calls).
// `pooled`, `shared`: the op's flags, set when planned. *field is NULL until buffer_pool_finish.
void buffer_pool_record(BufferPool *pool, BufValue v, float **field, size_t bytes, int calls,
                        int *pooled, int *shared, MemComponent comp);
// Plans every value (kept, merged in place, or its place in the block) without allocating;
// idempotent.
void buffer_pool_plan(BufferPool *pool);
// Plans, allocates the block (tagged `comp`) and points every recorded field at its value's
// place; with an arena, joins it instead, and the pooled fields stay NULL until
// buffer_arena_finish.
void buffer_pool_finish(BufferPool *pool, MemComponent comp);
// Allocates the arena's block and points every joined pool's fields into it (once; later calls
// do nothing). A pool joining after it dies.
void buffer_arena_finish(BufferArena *arena);
// After every joined pool was freed.
void buffer_arena_free(BufferArena *arena);
// The bytes of the pool's block of one kind after planning (1: those counted as MEM_ACT_GRAD,
// the most gradient bytes live at once; 0: the rest, MEM_WORKSPACE).
size_t buffer_pool_bytes(const BufferPool *pool, int gradients);
void buffer_pool_free(BufferPool *pool);
