// Primitives on a replica's context: a created descriptor taken into use (its primitive made once,
// the shared scratchpad grown to what it asks), executed with that scratchpad, and the reorders
// and converted copies ops put between layouts and data types. Above both the context
// (core/exec_ctx.h) and the seam that creates descriptors on either oneDNN (core/dnnl_seam.h).
#pragma once
#include "core/dnnl_seam.h"
#include "core/exec_ctx.h"

// Takes a created primitive descriptor into use: creates its primitive and grows the shared
// scratchpad to what it asks for. A NULL `pd` (the library has no implementation, see
// core/dnnl_seam.h) ends the run: call it only for what has no fallback.
dnnl_primitive_t dnnl_ctx_adopt(ExecCtx *ctx, const_dnnl_primitive_desc_t pd);

// The same for an op that gives the primitive a scratchpad of its own at each execution
// (dnnl_ctx_exec_scratchpad): the shared one is left as it is.
dnnl_primitive_t dnnl_prim_new(const_dnnl_primitive_desc_t pd);

// Bytes of scratchpad a primitive of this descriptor needs (0: none): what it asks for, plus what
// a kernel known to write past its ask writes there (dnnl_prim.c).
size_t dnnl_pd_scratchpad_bytes(const_dnnl_primitive_desc_t pd);

// Destroys a primitive and its descriptor, either of them NULL (a pass the op did not build).
void dnnl_prim_destroy(dnnl_primitive_t prim, dnnl_primitive_desc_t pd);

// Grows the shared scratchpad to at least what `pd` needs (dnnl_ctx_adopt does).
void dnnl_ctx_reserve_scratchpad(ExecCtx *ctx, const_dnnl_primitive_desc_t pd);

void dnnl_mem_bind(dnnl_memory_t mem, const void *ptr);

// Executes a primitive with the given args plus the shared scratchpad; its outputs are ready when
// this returns (the CPU stream is synchronous, see exec_ctx.c).
void dnnl_ctx_exec(ExecCtx *ctx, dnnl_primitive_t prim, const_dnnl_primitive_desc_t pd, int nargs,
                   const dnnl_exec_arg_t *args);

// The same with the op's own scratchpad: `mem` (a u8 memory of at least what the primitive needs,
// dnnl_pd_scratchpad_bytes) bound to `buf` (a buffer pool's value live only over the pass,
// ops/buffer_pool.h).
void dnnl_ctx_exec_scratchpad(ExecCtx *ctx, dnnl_primitive_t prim, int nargs,
                              const dnnl_exec_arg_t *args, dnnl_memory_t mem, void *buf);

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
