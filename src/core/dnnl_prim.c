#include "core/dnnl_prim.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

// Primitives run back to back and host code reads an op's output as soon as the op returns, with
// no stream wait: under these runtimes a CPU stream executes each primitive synchronously (its wait
// returns at once; measured 3 ns a call). A threadpool or SYCL runtime may run asynchronously and
// would need a wait before host code reads a result.
#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP && DNNL_CPU_RUNTIME != DNNL_RUNTIME_SEQ && \
    DNNL_CPU_RUNTIME != DNNL_RUNTIME_TBB
#error "Tally needs a oneDNN CPU runtime that executes synchronously (OpenMP, TBB or sequential)"
#endif

dnnl_primitive_t dnnl_prim_new(const_dnnl_primitive_desc_t pd) {
  if (!pd) TL_DIE("oneDNN has no implementation for a primitive this build needs");
  dnnl_primitive_t prim;
  DNNL_CHECK(dnnl_primitive_create(&prim, pd));
  return prim;
}

dnnl_primitive_t dnnl_ctx_adopt(ExecCtx *ctx, const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_t prim = dnnl_prim_new(pd);
  dnnl_ctx_reserve_scratchpad(ctx, pd);
  return prim;
}

// oneDNN's 1x1 backward-weights kernels, on a strided convolution over an input of fewer channels
// than their block of 16, write past the scratchpad they ask for: they copy the input to unit
// stride into a buffer booked at IC channels an input position per thread and written at the
// block's 16 (oneDNN issue #6035, open against 3.12; seen here on 2.6.3 on AMD EPYC with AVX-512
// as up to 1088 bytes past a 2432-byte ask, over the buffer-pool value placed after it). Such a
// pass is given what the copy writes besides its ask: 16 channels of every output position, per
// thread, in f32 (the widest type it copies).
static size_t known_overrun(const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_kind_t kind = dnnl_undefined_primitive;
  DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_primitive_kind, 0, &kind));
  dnnl_dims_t w, src, dst;
  if (kind != dnnl_convolution || dnnl_pd_md_dims(pd, dnnl_query_src_md, 0, src) != 4 ||
      dnnl_pd_md_dims(pd, dnnl_query_diff_dst_md, 0, dst) != 4)
    return 0;
  const int nw = dnnl_pd_md_dims(pd, dnnl_query_diff_weights_md, 0, w);  // backward weights only
  const int one_by_one = nw >= 4 && w[nw - 1] == 1 && w[nw - 2] == 1;
  const int strided = dst[2] * dst[3] < src[2] * src[3];
  if (!one_by_one || !strided || src[1] >= 16) return 0;
  return (size_t)omp_get_max_threads() * (size_t)(dst[2] * dst[3]) * 16 * sizeof(float);
}

size_t dnnl_pd_scratchpad_bytes(const_dnnl_primitive_desc_t pd) {
  const size_t asked = dnnl_pd_md_bytes(pd, dnnl_query_scratchpad_md, 0);
  return asked ? asked + known_overrun(pd) : 0;
}

void dnnl_prim_destroy(dnnl_primitive_t prim, dnnl_primitive_desc_t pd) {
  if (prim) dnnl_primitive_destroy(prim);
  if (pd) dnnl_primitive_desc_destroy(pd);
}

void dnnl_ctx_reserve_scratchpad(ExecCtx *ctx, const_dnnl_primitive_desc_t pd) {
  const size_t need = dnnl_pd_scratchpad_bytes(pd);
  if (need <= ctx->scratchpad_bytes) return;
  tl_free(ctx->scratchpad);
  ctx->scratchpad = tl_alloc(need, ctx->scratchpad_category, COMP_OTHER);
  ctx->scratchpad_bytes = need;
  // One memory object for the buffer, made here rather than at every execution: a primitive
  // uses the first bytes it asked for.
  if (ctx->scratchpad_mem) dnnl_memory_destroy(ctx->scratchpad_mem);
  dnnl_dims_t dims = {(dnnl_dim_t)need};
  DnnlMd whole = dnnl_md_typed(1, dims, dnnl_u8, dnnl_a);
  ctx->scratchpad_mem = dnnl_mem_new(ctx, whole);
  dnnl_md_destroy(whole);
  dnnl_mem_bind(ctx->scratchpad_mem, ctx->scratchpad);
}

void dnnl_mem_bind(dnnl_memory_t mem, const void *ptr) {
  DNNL_CHECK(dnnl_memory_set_data_handle(mem, (void *)ptr));
}

// Executes with `args` plus `scratchpad` (NULL: none).
static void execute(ExecCtx *ctx, dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args,
                    dnnl_memory_t scratchpad) {
  enum { MAX_ARGS = 16 };
  TL_ASSERT(nargs < MAX_ARGS);
  dnnl_exec_arg_t all[MAX_ARGS];
  memcpy(all, args, sizeof(dnnl_exec_arg_t) * (size_t)nargs);
  if (scratchpad) all[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, scratchpad};
  DNNL_CHECK(dnnl_primitive_execute(prim, ctx->stream, nargs, all));
}

void dnnl_ctx_exec(ExecCtx *ctx, dnnl_primitive_t prim, const_dnnl_primitive_desc_t pd, int nargs,
                   const dnnl_exec_arg_t *args) {
  if (ctx->dry_run) return;
  // What it asks for (cheaper to read than what it needs, which the reserve already counted).
  const size_t asked = dnnl_pd_md_bytes(pd, dnnl_query_scratchpad_md, 0);
  TL_ASSERT(asked <= ctx->scratchpad_bytes);
  execute(ctx, prim, nargs, args, asked ? ctx->scratchpad_mem : NULL);
}

void dnnl_ctx_exec_scratchpad(ExecCtx *ctx, dnnl_primitive_t prim, int nargs,
                              const dnnl_exec_arg_t *args, dnnl_memory_t mem, void *buf) {
  if (ctx->dry_run) return;
  TL_ASSERT(mem && buf);
  dnnl_mem_bind(mem, buf);
  execute(ctx, prim, nargs, args, mem);
}

void dnnl_reorder_init(DnnlReorder *r, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md) {
  memset(r, 0, sizeof *r);
  if (dnnl_md_equal(src_md, dst_md)) return;
  r->pd = dnnl_pd_reorder(ctx, src_md, dst_md);
  r->prim = dnnl_ctx_adopt(ctx, r->pd);
  r->src = dnnl_mem_new(ctx, src_md);
  r->dst = dnnl_mem_new(ctx, dst_md);
}

int dnnl_reorder_needed(const DnnlReorder *r) { return r->prim != NULL; }

void dnnl_reorder_run(DnnlReorder *r, ExecCtx *ctx, const void *src, void *dst) {
  TL_ASSERT(r->prim);
  dnnl_mem_bind(r->src, src);
  dnnl_mem_bind(r->dst, dst);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, r->src}, {DNNL_ARG_DST, r->dst}};
  dnnl_ctx_exec(ctx, r->prim, r->pd, 2, args);
}

void dnnl_reorder_destroy(DnnlReorder *r) {
  if (r->prim) dnnl_primitive_destroy(r->prim);
  if (r->pd) dnnl_primitive_desc_destroy(r->pd);
  if (r->src) dnnl_memory_destroy(r->src);
  if (r->dst) dnnl_memory_destroy(r->dst);
  memset(r, 0, sizeof *r);
}

void dnnl_copy_init_slots(DnnlCopy *c, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md,
                          MemCategory category, MemComponent comp, int slots) {
  dnnl_reorder_init(&c->reorder, ctx, src_md, dst_md);
  c->slot_bytes = dnnl_md_bytes(dst_md);
  c->buf = dnnl_reorder_needed(&c->reorder)
               ? tl_alloc(c->slot_bytes * (size_t)slots, category, comp)
               : NULL;
}

void dnnl_copy_init(DnnlCopy *c, ExecCtx *ctx, DnnlMd src_md, DnnlMd dst_md, MemCategory category,
                    MemComponent comp) {
  dnnl_copy_init_slots(c, ctx, src_md, dst_md, category, comp, 1);
}

const void *dnnl_copy_last_at(const DnnlCopy *c, const void *src, int slot) {
  return c->buf ? (const char *)c->buf + c->slot_bytes * (size_t)slot : src;
}

const void *dnnl_copy_run_at(DnnlCopy *c, ExecCtx *ctx, const void *src, int slot) {
  const void *dst = dnnl_copy_last_at(c, src, slot);
  if (dst != src) dnnl_reorder_run(&c->reorder, ctx, src, (void *)dst);
  return dst;
}

const void *dnnl_copy_run(DnnlCopy *c, ExecCtx *ctx, const void *src) {
  return dnnl_copy_run_at(c, ctx, src, 0);
}

const void *dnnl_copy_last(const DnnlCopy *c, const void *src) {
  return dnnl_copy_last_at(c, src, 0);
}

void dnnl_copy_destroy(DnnlCopy *c) {
  dnnl_reorder_destroy(&c->reorder);
  tl_free(c->buf);
  c->buf = NULL;
}
