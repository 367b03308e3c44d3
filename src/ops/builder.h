// What every op needs when it is created: the replica's oneDNN context (where scratchpad and FLOPs
// are counted), the parameter block it takes its weights from, the mode it runs in, the component
// its buffers and FLOPs belong to, and the run's build policy (precision, recompute, convolution
// algorithm, BatchNorm groups and sync). An op keeps what of these it needs at run time.
//
// Conventions shared by all ops (src/ops/*.h):
// - Layouts: 4-D activations are NHWC (oneDNN tag nhwc) unless the builder says otherwise (a
//   network whose channel counts allow it runs oneDNN's blocked nChw16c, which its Winograd
//   convolutions need; element-wise ops do not care); 2-D are (rows, features) row-major;
//   token tensors are (N, T, D) row-major, which is the same memory as NHWC with H*W = T.
// - An op is created once for fixed shapes (its primitives are created then, never per step),
//   owns its output `out` and, when asked, its input gradient `din`; it remembers the input
//   pointer it was given in forward for use in backward.
// - Calls: an op built for `calls` > 1 (OP_TRAIN) keeps one output, one input pointer and one
//   set of saved workspaces per forward call, so a module can run on several inputs (two views)
//   before backward; backward takes the calls back last-in first-out and `out` names the output
//   of the call being worked on. The input gradient `din` is one buffer: a call's backward hands
//   it on before the next call's backward begins.
// - Parameter gradients are the parameters' own bookkeeping, whichever op instance writes them
//   (core/params.h): an op built in training tells the set how many backward contributions a
//   step brings to its slices (its calls; a second instance over the same weights, built on a
//   paramset_view, adds its own); paramset_zero_grad starts the step, the first backward after
//   it writes, later ones add (through the set's scratch, reserved once a slice expects more
//   than one), and the set hears that a slice is ready after its last expected contribution.
// - Buffers: `out` is MEM_ACT when kept for backward (OP_TRAIN), MEM_WORKSPACE otherwise; `din` is
//   MEM_ACT_GRAD; workspaces kept between forward and backward are MEM_ACT; all tagged with
//   the builder's component.
// - Each execution adds its analytic FLOPs (a multiply-add counts 2) to
//   ctx->flops_forward/backward[the builder's component, kept at creation].
#pragma once
#include "core/dnnl_prim.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/params.h"
#include "ops/buffer_pool.h"

typedef enum {
  OP_TRAIN,    // forward training (batch statistics), keeps what backward needs, has backward
  OP_FORWARD,  // forward with batch statistics, nothing kept, no backward (momentum encoder)
  OP_INFER,    // forward inference (running statistics), no backward (evaluation)
} OpMode;

typedef enum {
  CONV_ALGO_AUTO,      // Winograd where it was measured faster (ops/conv.c), else direct
  CONV_ALGO_DIRECT,    // direct everywhere
  CONV_ALGO_WINOGRAD,  // Winograd wherever oneDNN offers it
} ConvAlgorithm;

// [model] sync_bn: BatchNorm with batch statistics normalizes with the global batch's. `average`
// averages a per-channel buffer over the replicas in place, weighted by `samples` (each replica's
// count); `scale` is global / local samples. A NULL `average`: each replica's own statistics.
typedef struct {
  void (*average)(void *user, float *buf, size_t n, double samples);
  void *user;
  double scale;
} BnSync;

// How a run builds its networks, from its configuration; the same for every op it builds.
typedef struct {
  // [train] precision = bf16: convolutions and linear layers multiply in bf16, accumulating in f32
  // into f32 weight gradients (builder_compute_type); a network may keep its activations in bf16
  // too (Builder.act_type: a ResNet's), else the ops convert to bf16 copies of their inputs and
  // output gradients and write f32. 0: everything f32, as evaluation always is.
  int bf16;
  // [train] recompute: transformer blocks in training recompute their LayerNorm and GELU outputs,
  // ResNets their stem's and each block's first BatchNorm-ReLU output, before the f32 op whose
  // backward reads them, instead of keeping them.
  int recompute;
  // [train] conv_algorithm: which 3x3 stride-1 convolutions on blocked activations run oneDNN's
  // Winograd F(4x4, 3x3) kernels (see ops/conv.c); the others, and any the library lacks it for,
  // run direct.
  ConvAlgorithm conv_algorithm;
  // [model] bn_splits: BatchNorm with batch statistics computes them over this many equal groups
  // of the batch, as several replicas would (MoCo's single-GPU SplitBatchNorm). 1 = the batch.
  int bn_splits;
  BnSync bn_sync;
} BuildPolicy;

// The layout of the 4-D activations a network's ops pass each other.
typedef enum {
  ACT_LAYOUT_UNSET,  // the network chooses (nn/resnet.c); the ops read nhwc
  ACT_LAYOUT_NHWC,   // channels last
  // oneDNN's blocked nChw16c, which its Winograd convolutions need: every channel count a
  // multiple of 16 except a convolution's input read from outside the network (the images, nhwc)
  ACT_LAYOUT_BLOCKED16,
} ActLayout;

typedef struct {
  ExecCtx *ctx;
  ParamSet *params;
  OpMode mode;
  // What the ops built count their buffers and FLOPs to (0: the encoder).
  MemComponent component;
  // NULL: the defaults (build_policy_default), what evaluation and tests build with.
  const BuildPolicy *policy;
  int calls;  // forward calls before backward, OP_TRAIN only; 0 means 1
  // With a pool (ops/buffer_pool.h), the module's op list (ops/oplist.h) declares each op before
  // building it (builder_output, builder_grad), which points the op at its planned values; NULL:
  // every op owns its buffers.
  BufferPool *pool;
  // A network that makes a pool of its own joins it to this arena (ops/buffer_pool.h) when set:
  // what a replica's backbones are built with. NULL: the pool's buffers are its own.
  BufferArena *arena;
  BufValue out_value;   // the next op's output, 0: its own
  BufValue grad_value;  // the next op's input gradient, 0: its own
  ActLayout layout;
  // The data type of the activations and of their gradients the ops pass each other (bf16 or
  // f32; 0: f32), chosen by the network (nn/resnet.c). An op reads and writes its activations in
  // it and sizes their buffers by it (builder_act_bytes); parameters, their gradients and
  // statistics stay f32. A buffer is a `float *` either way: oneDNN's memory is untyped, and C
  // code that reads one reads it as the type the op declared.
  dnnl_data_type_t act_type;
  // The next op reads f32 from outside the network (the images) whatever act_type is.
  int input_f32;
  // Training BatchNorms leave their running statistics as they are: a second instance of a
  // network at another input size (DINO's local crops) normalizes with its own batch statistics,
  // and the running ones stay those of the size the network is evaluated and exported at.
  int keep_running_stats;
} Builder;

// f32, recompute, conv_algorithm auto, the whole batch's BatchNorm statistics, no sync.
static inline BuildPolicy build_policy_default(void) {
  return (BuildPolicy){.recompute = 1, .bn_splits = 1};
}

static inline BuildPolicy builder_policy(const Builder *b) {
  return b->policy ? *b->policy : build_policy_default();
}

// The data type convolutions and linear layers multiply in: bf16 under [train] precision = bf16,
// else f32.
static inline dnnl_data_type_t builder_compute_type(const Builder *b) {
  return b->policy && b->policy->bf16 ? dnnl_bf16 : dnnl_f32;
}

// The activations' data type, and the bytes of one element of it.
static inline dnnl_data_type_t builder_act_type(const Builder *b) {
  return b->act_type == dnnl_bf16 ? dnnl_bf16 : dnnl_f32;
}
static inline size_t builder_act_bytes(const Builder *b) {
  return builder_act_type(b) == dnnl_bf16 ? 2 : sizeof(float);
}
// The data type of the next op's input: f32 from outside the network, else the activations'.
static inline dnnl_data_type_t builder_input_type(const Builder *b) {
  return b->input_f32 ? dnnl_f32 : builder_act_type(b);
}

// The activations' layout as oneDNN names it.
static inline dnnl_format_tag_t builder_layout(const Builder *b) {
  return b->layout == ACT_LAYOUT_BLOCKED16 ? dnnl_nChw16c : dnnl_nhwc;
}

// Memory category for an op's output under this builder's mode.
static inline MemCategory builder_out_category(const Builder *b) {
  return b->mode == OP_TRAIN ? MEM_ACT : MEM_WORKSPACE;
}

// Declaring a module's ops to its pool (ops/buffer_pool.h), each just before it is built, in the
// order forward runs them — an op list (ops/oplist.h) does it for its nodes; without a pool (or,
// for gradients, without backward) these do nothing and return 0, and every op owns its buffers.
enum {
  OUT_OWN = 1,          // the output outlives the module's pass (or is read outside it): its own
  OUT_NONE = 2,         // the op writes nothing in forward (a gradient sum)
  OUT_IN_PLACE = 4,     // the op may write its output over in0, if nothing reads in0 after it
  OUT_READS_LATE = 8,   // the op reads in0 again after writing its output: never in place
  OUT_RECOMPUTED = 16,  // with [train] recompute the module writes the output again just before
                        // a backward that reads it, instead of keeping it
};

// Starts the next op: its forward reads in0 and in1 (0: none, or a buffer of its own); returns
// the value its output is (0 with OUT_OWN or OUT_NONE) and points the builder at it.
static inline BufValue builder_output(Builder *b, BufValue in0, BufValue in1, unsigned flags) {
  b->out_value = b->grad_value = 0;
  if (!b->pool) return 0;
  BufferPool *pool = b->pool;
  buffer_pool_op(pool);
  buffer_pool_read(pool, in0);
  buffer_pool_read(pool, in1);
  if (flags & OUT_READS_LATE)
    buffer_pool_touch(pool, in0, PASS_FORWARD, pool_write_time(PASS_FORWARD, pool->ops - 1));
  if (flags & (OUT_OWN | OUT_NONE)) return 0;
  BufValue v = buffer_pool_value(pool, b->mode == OP_TRAIN ? VALUE_ACTIVATION : VALUE_OUTPUT);
  buffer_pool_write(pool, v, PASS_FORWARD);
  if ((flags & OUT_IN_PLACE) && in0)
    buffer_pool_in_place(pool, v, in0);
  else
    buffer_pool_touch(pool, v, PASS_FORWARD, pool_read_time(PASS_FORWARD, pool->ops - 1));
  if ((flags & OUT_RECOMPUTED) && builder_policy(b).recompute) pool->values[v].recomputed = 1;
  return b->out_value = v;
}

// Whether the next op's output may be written again before a backward reads it (OUT_RECOMPUTED
// under [train] recompute): the op prepares what recomputing takes when it is built.
static inline int builder_may_recompute(const Builder *b) {
  return b->pool && b->out_value && b->pool->values[b->out_value].recomputed;
}

// A gradient value for ops declared later to write and read (0 without backward).
static inline BufValue builder_grad_value(Builder *b) {
  return b->pool && b->mode == OP_TRAIN ? buffer_pool_value(b->pool, VALUE_GRAD) : 0;
}

// The current op's backward reads the gradients dout0 and dout1 and writes din, its input
// gradient (never over what it reads); the builder points the op's din at it.
static inline void builder_grad(Builder *b, BufValue din, BufValue dout0, BufValue dout1) {
  if (!b->pool || b->mode != OP_TRAIN) return;
  buffer_pool_read_in_backward(b->pool, dout0);
  buffer_pool_read_in_backward(b->pool, dout1);
  buffer_pool_write(b->pool, din, PASS_BACKWARD);
  buffer_pool_touch(b->pool, din, PASS_BACKWARD, pool_read_time(PASS_BACKWARD, b->pool->ops - 1));
  b->grad_value = din;
}

// The module's first op reads a value made by code before it (an embedding, a scatter) whose
// backward reads that value's gradient `g`: declared as an op of its own, first, so that `g`
// lives until then.
static inline void builder_input(Builder *b, BufValue g) {
  builder_output(b, 0, 0, OUT_NONE);
  builder_grad(b, 0, g, 0);
}

// The current op's backward reads the forward value v (its input for a weight gradient, its own
// output for ReLU's): kept for it, or written again just before it when recomputed.
static inline void builder_backward_reads(Builder *b, BufValue v) {
  if (b->pool && b->mode == OP_TRAIN) buffer_pool_read_in_backward(b->pool, v);
}

enum { OP_MAX_CALLS = 8 };

// The forward calls an op built by `b` keeps state for.
static inline int builder_calls(const Builder *b) {
  if (b->calls > OP_MAX_CALLS)
    TL_DIE("ops keep at most %d calls, asked for %d", OP_MAX_CALLS, b->calls);
  return b->mode == OP_TRAIN && b->calls > 1 ? b->calls : 1;
}

// Which of an op's per-call slots a pass uses. With one slot every forward reuses it (a forward
// without backward — a finite-difference probe, a monitor pass — replaces what was kept, as
// before calls existed). With several, a step's forwards stack up to `count` and backward pops
// them; a step is a generation of the parameter set (paramset_zero_grad), so an op whose
// backward a step skips (no input gradient wanted) starts the next step from slot 0 again.
typedef struct {
  int count;                     // slots: builder_calls()
  int depth;                     // this step's forwards whose backward is still due
  unsigned step;                 // the set's grad_generation `depth` belongs to
  const ParamSet *params;        // whose generation counts steps (its root's, for a view)
  const void *in[OP_MAX_CALLS];  // each call's input, for its backward
  int din_pooled;                // the op's din lives in a pool (op_din_alloc)
  int out_pooled;                // its output does (op_out_alloc)
  int out_shared;                // one output for every call: a scratch output (op_out_slot)
} OpCalls;

static inline void op_calls_init(OpCalls *c, const Builder *b) {
  memset(c, 0, sizeof *c);
  c->count = builder_calls(b);
  c->params = b->params;
}

static inline void op_calls_new_step(OpCalls *c) {
  const unsigned generation = paramset_root(c->params)->grad_generation;
  if (c->step == generation) return;
  c->step = generation;
  c->depth = 0;
}

// `count` buffers of `bytes` side by side, one allocation for the ledger; op_slot finds one.
static inline void *op_calls_alloc(const OpCalls *c, size_t bytes, MemCategory cat,
                                   MemComponent comp) {
  return tl_alloc(bytes * (size_t)c->count, cat, comp);
}

// An op's input gradient (MEM_ACT_GRAD): its own buffer, or with a pool the value the module
// declared for it (builder_grad), filled in by buffer_pool_finish (NULL until then).
static inline void op_din_alloc(const Builder *b, OpCalls *c, float **din, size_t bytes,
                                MemComponent comp) {
  c->din_pooled = b->pool && b->grad_value;
  if (c->din_pooled)
    buffer_pool_record(b->pool, b->grad_value, din, bytes, 1, &c->din_pooled, NULL, comp);
  else
    *din = tl_alloc(bytes, MEM_ACT_GRAD, comp);
}

// An op's output, one per call (`slots`): its own, or with a pool the value the module declared
// for it (builder_output); the planner decides whether that is a pool buffer for every call
// (out_pooled, out_shared) or, for an activation a backward reads, one of its own per call.
static inline void op_out_alloc(const Builder *b, OpCalls *c, float **slots, size_t bytes,
                                MemComponent comp) {
  c->out_shared = c->out_pooled = 0;
  if (b->pool && b->out_value)
    buffer_pool_record(b->pool, b->out_value, slots, bytes, c->count, &c->out_pooled,
                       &c->out_shared, comp);
  else
    *slots = op_calls_alloc(c, bytes, builder_out_category(b), comp);
}

// A buffer that lives only inside one pass of the op: with a pool a value live over the op in
// that pass (filled in by buffer_pool_finish; returns 1), else its own (returns 0).
static inline int op_inner_alloc(const Builder *b, Pass pass, float **buf, size_t bytes,
                                 MemCategory cat, MemComponent comp) {
  if (b->pool && b->pool->ops) {
    BufValue v = buffer_pool_value(b->pool, VALUE_INNER);
    buffer_pool_touch(b->pool, v, pass, pool_read_time(pass, b->pool->ops - 1));
    buffer_pool_write(b->pool, v, pass);
    buffer_pool_record(b->pool, v, buf, bytes, 1, NULL, NULL, comp);
    return 1;
  }
  *buf = tl_alloc(bytes, cat, comp);
  return 0;
}

static inline void op_buffer_free(float *buf, int pooled) {
  if (!pooled) tl_free(buf);
}
static inline void *op_slot(void *base, size_t bytes, int slot) {
  return base ? (char *)base + bytes * (size_t)slot : NULL;
}

// Where call `call`'s output lives: its own slot, or the one scratch buffer.
static inline float *op_out_slot(const OpCalls *c, float *slots, size_t bytes, int call) {
  return c->out_shared ? slots : op_slot(slots, bytes, call);
}

static inline int op_calls_forward(OpCalls *c, const char *op) {
  if (c->count == 1) return c->depth = 1, 0;
  op_calls_new_step(c);
  if (c->depth == c->count)
    TL_DIE("%s: forward call %d in one step, built for %d", op, c->depth + 1, c->count);
  return c->depth++;
}

// The slot of the call this backward works on: the latest forward not yet gone back.
static inline int op_calls_backward(OpCalls *c, const char *op) {
  if (c->count == 1) return c->depth = 0, 0;
  op_calls_new_step(c);
  if (c->depth == 0) TL_DIE("%s: backward without an outstanding forward call", op);
  return --c->depth;
}

// The call the op's next backward will take, without taking it (a recompute before it).
static inline int op_calls_next_backward(OpCalls *c, const char *op) {
  if (c->count == 1) return 0;
  op_calls_new_step(c);
  if (c->depth == 0) TL_DIE("%s: recompute without an outstanding forward call", op);
  return c->depth - 1;
}

// Adds a gradient written to the scratch into its slice (counted as backward FLOPs: one add per
// float); nothing when it was written in place.
static inline void op_grad_commit(ExecCtx *ctx, MemComponent comp, const ParamSet *ps, float *grad,
                                  const float *target, size_t count) {
  if (target == grad) return;
  if (!ctx->dry_run) paramset_grad_commit(ps, grad, target, count);
  ctx->flops_backward[comp] += (double)count;
}

// The parameter gradients one backward call writes: up to two slices of its set (weight and
// bias, gamma and beta; a NULL slice is skipped). op_grads_expect, when the op is built, tells
// the set the op's calls will contribute to them each step, and reserves scratch for both once
// either may be added to. op_grads_begin picks where each is written: in place, or the set's
// scratch when a backward (of this op or another instance over the same weights) wrote it since
// the last zero (the second slice after the first in the scratch). op_grads_end adds the scratch
// into the slices and reports the contribution; after a slice's last one, the set says it is
// complete.
typedef struct {
  float *grad[2];
  float *target[2];
  size_t count[2];
} OpGrads;

static inline void op_grads_expect(const Builder *b, const OpCalls *c, const float *g0, size_t n0,
                                   const float *g1, size_t n1) {
  if (b->mode != OP_TRAIN || paramset_root(b->params)->counting) return;
  paramset_grad_expect(b->params, g0, c->count);
  paramset_grad_expect(b->params, g1, c->count);
  // One contribution a step writes; a second one may add, through the scratch.
  if ((g0 && paramset_grad_expected(b->params, g0) > 1) ||
      (g1 && paramset_grad_expected(b->params, g1) > 1))
    paramset_reserve_grad_scratch(b->params, (g0 ? n0 : 0) + (g1 ? n1 : 0));
}

static inline OpGrads op_grads_begin(OpCalls *c, float *g0, size_t n0, float *g1, size_t n1) {
  OpGrads g = {{g0, g1}, {NULL, NULL}, {n0, n1}};
  if (g0)
    g.target[0] =
        paramset_grad_target(c->params, g0, n0, paramset_grad_accumulates(c->params, g0), 0);
  if (g1)
    g.target[1] = paramset_grad_target(c->params, g1, n1, paramset_grad_accumulates(c->params, g1),
                                       g0 ? n0 : 0);
  return g;
}

static inline void op_grads_end(ExecCtx *ctx, MemComponent comp, const OpCalls *c,
                                const OpGrads *g) {
  for (int i = 0; i < 2; i++)
    if (g->grad[i]) {
      op_grad_commit(ctx, comp, c->params, g->grad[i], g->target[i], g->count[i]);
      paramset_grad_contributed(c->params, g->grad[i], g->count[i]);
    }
}

// A normalization's affine parameters from the builder's set: NAME.gamma (ones) and NAME.beta
// (zeros), n each, without weight decay, with their gradients (batchnorm, layernorm).
static inline void op_take_scale_shift(const Builder *b, const char *name, size_t n, float **gamma,
                                       float **dgamma, float **beta, float **dbeta) {
  char pname[96];
  snprintf(pname, sizeof pname, "%s.gamma", name);
  *gamma = paramset_take(b->params, pname, n, 1, dgamma);
  paramset_init_const(b->params, *gamma, n, 1.0f);
  snprintf(pname, sizeof pname, "%s.beta", name);
  *beta = paramset_take(b->params, pname, n, 1, dbeta);
  paramset_init_const(b->params, *beta, n, 0.0f);
}
