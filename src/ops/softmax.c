#include "ops/softmax.h"

#include <string.h>

void row_softmax_init(RowSoftmax *s, ExecCtx *ctx, int rows, int cols, SoftmaxKind kind) {
  if (rows <= 0 || cols <= 0) TL_DIE("softmax: bad shape (%d, %d)", rows, cols);
  memset(s, 0, sizeof *s);
  s->rows = rows;
  s->cols = cols;
  dnnl_dims_t dims = {rows, cols};
  DnnlMd md = dnnl_md_plain(2, dims, dnnl_ab);
  dnnl_alg_kind_t alg = kind == SOFTMAX_LOG_PROBS ? dnnl_softmax_log : dnnl_softmax_accurate;
  s->pd = dnnl_pd_softmax_forward(ctx, dnnl_forward_inference, alg, md, 1);
  s->prim = dnnl_ctx_adopt(ctx, s->pd);
  s->mem = dnnl_mem_new(ctx, md);
  dnnl_md_destroy(md);
}

void row_softmax_run(RowSoftmax *s, ExecCtx *ctx, float *rows) {
  dnnl_mem_bind(s->mem, rows);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, s->mem}, {DNNL_ARG_DST, s->mem}};
  dnnl_ctx_exec(ctx, s->prim, s->pd, 2, args);
}

void row_softmax_destroy(RowSoftmax *s) {
  if (s->prim) dnnl_primitive_destroy(s->prim);
  if (s->pd) dnnl_primitive_desc_destroy(s->pd);
  if (s->mem) dnnl_memory_destroy(s->mem);
  memset(s, 0, sizeof *s);
}
