// One replica's oneDNN execution context: engine, stream, the shared user-managed scratchpad
// (so the ledger counts it), and the FLOP counters every op adds its own analytic count to. It
// executes and holds no policy: how a network is built (precision, recompute, convolution
// algorithm, BatchNorm groups and sync, the component it counts to) travels in the Builder
// (ops/builder.h), and each op keeps what it needs of it.
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/dnnl_seam.h"
#include "core/error.h"

#define DNNL_CHECK(call)                                                 \
  do {                                                                   \
    dnnl_status_t status_ = (call);                                      \
    if (status_ != dnnl_success)                                         \
      TL_DIE("oneDNN call failed (status %d): %s", (int)status_, #call); \
  } while (0)

// Whether oneDNN runs AVX-512 (avx512_core) kernels on this CPU: blocked nChw16c activations and
// Winograd convolutions are native there only.
int cpu_has_avx512(void);
// Whether oneDNN runs bf16 natively on this CPU (AVX512-BF16 or AMX): what train.precision = auto
// takes bf16 for.
int cpu_has_native_bf16(void);

struct ExecCtx {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  // Shared scratchpad for all primitives of this replica; they run one at a time.
  void *scratchpad;
  size_t scratchpad_bytes;
  dnnl_memory_t scratchpad_mem;     // the whole buffer as one u8 memory, passed to every primitive
  MemCategory scratchpad_category;  // MEM_WORKSPACE; MEM_EVAL for the evaluation context
  // Planning: primitives are created and FLOPs counted, but nothing executes.
  int dry_run;
  // Analytic FLOPs (multiply-add = 2) added by ops as they execute, reset by the trainer per step.
  double flops_forward[COMP_NCOMP];
  double flops_backward[COMP_NCOMP];
  // The part of the above (forward and backward, every component) that convolution passes run by
  // Winograd kernels added: still the direct count, the arithmetic of the model.
  double flops_winograd;
};

// Builds what oneDNN builds only on first execution, never at primitive creation: the JIT
// kernels of its gemm (which the f32 inner products of every head run on), the code pages of its
// gemm driver and the OpenMP worker threads with their stacks. A plan, whose networks are built
// in dry run and never execute, calls it before it takes its process's resident memory, so that
// memory includes what a training's first step adds to it (about 5 MiB here).
void exec_build_lazy_kernels(void);

void exec_ctx_init(ExecCtx *ctx);
void exec_ctx_destroy(ExecCtx *ctx);
void exec_ctx_reset_flops(ExecCtx *ctx);
double exec_ctx_total_flops(const ExecCtx *ctx);

// Attribute with user-managed scratchpad: every primitive descriptor is created with this.
dnnl_primitive_attr_t dnnl_ctx_attr(void);

// Takes a created primitive descriptor into use: creates its primitive and grows the shared
// scratchpad to what it asks for. A NULL `pd` (the library has no implementation, see
// core/dnnl_seam.h) ends the run: call it only for what has no fallback.
dnnl_primitive_t dnnl_ctx_adopt(ExecCtx *ctx, const_dnnl_primitive_desc_t pd);

// Grows the shared scratchpad to at least what `pd` asks for (dnnl_ctx_adopt does).
void dnnl_ctx_reserve_scratchpad(ExecCtx *ctx, const_dnnl_primitive_desc_t pd);

void dnnl_mem_bind(dnnl_memory_t mem, const void *ptr);

// Executes a primitive with the given args plus the shared scratchpad; its outputs are ready when
// this returns (the CPU stream is synchronous, see exec_ctx.c).
void dnnl_ctx_exec(ExecCtx *ctx, dnnl_primitive_t prim, const_dnnl_primitive_desc_t pd, int nargs,
                   const dnnl_exec_arg_t *args);

// A reorder between two layouts of the same tensor, created once; a no-op when they are equal.
typedef struct {
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t src, dst;
} DnnlReorder;
void dnnl_reorder_init(DnnlReorder *r, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md);
int dnnl_reorder_needed(const DnnlReorder *r);
void dnnl_reorder_run(DnnlReorder *r, ExecCtx *ctx, const void *src, void *dst);
void dnnl_reorder_destroy(DnnlReorder *r);

// A tensor as a primitive reads it: converted into a buffer of its own when the primitive's
// descriptor differs from the source's (layout or data type), else the source itself.
typedef struct {
  DnnlReorder reorder;
  void *buf;          // NULL when no conversion is needed; else `slots` copies side by side
  size_t slot_bytes;  // one copy's
} DnnlCopy;
// `category` and `comp` tag the buffer for the ledger (MEM_ACT when the copy is kept for backward).
void dnnl_copy_init(DnnlCopy *c, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md, MemCategory category,
                    MemComponent comp);
// The same with `slots` copies, one per forward call an op keeps (ops/builder.h).
void dnnl_copy_init_slots(DnnlCopy *c, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md,
                          MemCategory category, MemComponent comp, int slots);
// Converts `src` when needed; returns what the primitive should read.
const void *dnnl_copy_run(DnnlCopy *c, ExecCtx *ctx, const void *src);
const void *dnnl_copy_run_at(DnnlCopy *c, ExecCtx *ctx, const void *src, int slot);
// The last converted copy (or `src`) without converting again.
const void *dnnl_copy_last(const DnnlCopy *c, const void *src);
const void *dnnl_copy_last_at(const DnnlCopy *c, const void *src, int slot);
void dnnl_copy_destroy(DnnlCopy *c);
