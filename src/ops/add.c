#include "ops/add.h"

#include <stdlib.h>
#include <string.h>

struct AddPrivate {
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, out;  // (n) each
};

void add_init(Add *l, Builder *b, size_t n, MemCategory cat, int is_backward) {
  if (n == 0) TL_DIE("add: empty tensor");
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->n = n;
  l->bytes = n * builder_act_bytes(b);
  l->comp = b->component;
  l->is_backward = is_backward;
  Builder one_call = *b;
  one_call.calls = 1;
  op_calls_init(&l->calls, is_backward ? &one_call : b);

  struct AddPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  dnnl_dims_t dims = {(dnnl_dim_t)n};
  DnnlMd md = dnnl_md_typed(1, dims, builder_act_type(b), dnnl_a);
  p->pd = dnnl_pd_binary(ctx, dnnl_binary_add, md, md, md);
  p->prim = dnnl_ctx_adopt(ctx, p->pd);
  p->a = dnnl_mem_new(ctx, md);
  p->b = dnnl_mem_new(ctx, md);
  p->out = dnnl_mem_new(ctx, md);
  dnnl_md_destroy(md);
  if (is_backward && cat == MEM_ACT_GRAD)
    op_din_alloc(b, &l->calls, &l->out_slots, l->bytes, l->comp);
  else if (!is_backward && cat == builder_out_category(b))
    op_out_alloc(b, &l->calls, &l->out_slots, l->bytes, l->comp);
  else
    l->out_slots = op_calls_alloc(&l->calls, l->bytes, cat, l->comp);
  l->out = l->out_slots;
}

void add_forward(Add *l, ExecCtx *ctx, const float *a, const float *bb) {
  struct AddPrivate *p = l->priv;
  l->out = op_out_slot(&l->calls, l->out_slots, l->bytes, op_calls_forward(&l->calls, "add"));
  dnnl_mem_bind(p->a, a);
  dnnl_mem_bind(p->b, bb);
  dnnl_mem_bind(p->out, l->out);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC_0, p->a}, {DNNL_ARG_SRC_1, p->b}, {DNNL_ARG_DST, p->out}};
  dnnl_ctx_exec(ctx, p->prim, p->pd, 3, args);
  double *flops = l->is_backward ? ctx->flops_backward : ctx->flops_forward;
  flops[l->comp] += (double)l->n;
}

void add_destroy(Add *l) {
  struct AddPrivate *p = l->priv;
  if (p) {
    dnnl_primitive_destroy(p->prim);
    dnnl_primitive_desc_destroy(p->pd);
    dnnl_memory_destroy(p->a);
    dnnl_memory_destroy(p->b);
    dnnl_memory_destroy(p->out);
    free(p);
  }
  op_buffer_free(l->out_slots, l->calls.din_pooled || l->calls.out_pooled);
  memset(l, 0, sizeof *l);
}
