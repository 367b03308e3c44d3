#include "ops/matmul.h"

#include <string.h>

// Row-major (rows, cols) descriptor with `ld` floats from one row to the next (0: cols), or the
// transpose view of a row-major (cols, rows) buffer (ld 0: rows).
static DnnlMd md_2d(int rows, int cols, int transposed, int ld) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {ld ? ld : cols, 1};
  if (transposed) {
    strides[0] = 1;
    strides[1] = ld ? ld : rows;
  }
  return dnnl_md_strided(2, dims, strides);
}

void matmul_init(Matmul *m, ExecCtx *ctx, int M, int K, int N, int trans_a, int trans_b,
                 MemComponent comp, int is_backward) {
  matmul_init_ld(m, ctx, M, K, N, trans_a, trans_b, 0, 0, comp, is_backward);
}

void matmul_init_ld(Matmul *m, ExecCtx *ctx, int M, int K, int N, int trans_a, int trans_b, int lda,
                    int ldc, MemComponent comp, int is_backward) {
  memset(m, 0, sizeof *m);
  *m = (Matmul){.M = M,
                .K = K,
                .N = N,
                .trans_a = trans_a,
                .trans_b = trans_b,
                .comp = comp,
                .is_backward = is_backward};
  DnnlMd a = md_2d(M, K, trans_a, lda), b = md_2d(K, N, trans_b, 0), c = md_2d(M, N, 0, ldc);
  m->pd = dnnl_pd_matmul(ctx, a, b, c, 1.0f);
  m->prim = dnnl_ctx_adopt(ctx, m->pd);
  m->a = dnnl_mem_new(ctx, a);
  m->b = dnnl_mem_new(ctx, b);
  m->c = dnnl_mem_new(ctx, c);
  dnnl_md_destroy(a);
  dnnl_md_destroy(b);
  dnnl_md_destroy(c);
}

void matmul_run(Matmul *m, ExecCtx *ctx, const float *a, const float *b, float *c) {
  dnnl_mem_bind(m->a, a);
  dnnl_mem_bind(m->b, b);
  dnnl_mem_bind(m->c, c);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, m->a}, {DNNL_ARG_WEIGHTS, m->b}, {DNNL_ARG_DST, m->c}};
  dnnl_ctx_exec(ctx, m->prim, m->pd, 3, args);
  double flops = 2.0 * m->M * m->K * m->N;
  if (m->is_backward)
    ctx->flops_backward[m->comp] += flops;
  else
    ctx->flops_forward[m->comp] += flops;
}

void matmul_destroy(Matmul *m) {
  if (m->prim) dnnl_primitive_destroy(m->prim);
  if (m->pd) dnnl_primitive_desc_destroy(m->pd);
  if (m->a) dnnl_memory_destroy(m->a);
  if (m->b) dnnl_memory_destroy(m->b);
  if (m->c) dnnl_memory_destroy(m->c);
  memset(m, 0, sizeof *m);
}
