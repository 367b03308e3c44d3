#include "ops/l2norm.h"

#include <stdlib.h>
#include <string.h>

// The norm's floor: F.normalize's eps, squared (oneDNN's norm_lp_max floors the sum of squares).
static const float NORM_EPS_SQUARED = 1e-24f;

struct L2NormPrivate {
  dnnl_primitive_desc_t norm_pd, div_pd, dot_pd, sub_pd;
  dnnl_primitive_t norm, div, dot, sub;
  dnnl_memory_t rows_a, rows_b;  // (rows, d), bound per execution
  dnnl_memory_t per_row;         // (rows, 1): the norms, then backward's row dots
  dnnl_memory_t u3, g3, dot3;    // the matmul's views: (rows, 1, d), (rows, d, 1), (rows, 1, 1)
};

// Backward: dz = du / n; then n's buffer takes s = -(u . dz) per row (a matmul over the batch of
// rows, scale -1); then dz += u * s.
static void make_backward(L2Norm *l, ExecCtx *ctx, DnnlMd mat, DnnlMd col) {
  struct L2NormPrivate *p = l->priv;
  const dnnl_dims_t u_dims = {l->rows, 1, l->d}, g_dims = {l->rows, l->d, 1},
                    s_dims = {l->rows, 1, 1};
  DnnlMd u3 = dnnl_md_plain(3, u_dims, dnnl_abc), g3 = dnnl_md_plain(3, g_dims, dnnl_abc),
         s3 = dnnl_md_plain(3, s_dims, dnnl_abc);
  p->dot_pd = dnnl_pd_matmul(ctx, u3, g3, s3, -1.0f);
  p->dot = dnnl_ctx_adopt(ctx, p->dot_pd);
  p->sub_pd = dnnl_pd_binary_accumulate(ctx, dnnl_binary_mul, mat, col, mat);
  p->sub = dnnl_ctx_adopt(ctx, p->sub_pd);
  p->u3 = dnnl_mem_new(ctx, u3);
  p->g3 = dnnl_mem_new(ctx, g3);
  p->dot3 = dnnl_mem_new(ctx, s3);
  dnnl_md_destroy(u3);
  dnnl_md_destroy(g3);
  dnnl_md_destroy(s3);
}

// The primitives `mode` runs, no buffers.
static void make_primitives(L2Norm *l, const Builder *b, OpMode mode, int rows, int d) {
  if (rows <= 0 || d <= 0) TL_DIE("l2norm: bad shape (%d, %d)", rows, d);
  ExecCtx *ctx = b->ctx;
  memset(l, 0, sizeof *l);
  l->rows = rows, l->d = d;
  l->mode = mode;
  l->comp = b->component;
  struct L2NormPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  l->priv = p;
  const dnnl_dims_t mat_dims = {rows, d}, col_dims = {rows, 1};
  DnnlMd mat = dnnl_md_plain(2, mat_dims, dnnl_ab), col = dnnl_md_plain(2, col_dims, dnnl_ab);
  p->norm_pd = dnnl_pd_reduction(ctx, dnnl_reduction_norm_lp_max, mat, col, 2.0f, NORM_EPS_SQUARED);
  p->norm = dnnl_ctx_adopt(ctx, p->norm_pd);
  p->div_pd = dnnl_pd_binary(ctx, dnnl_binary_div, mat, col, mat);
  p->div = dnnl_ctx_adopt(ctx, p->div_pd);
  p->rows_a = dnnl_mem_new(ctx, mat);
  p->rows_b = dnnl_mem_new(ctx, mat);
  p->per_row = dnnl_mem_new(ctx, col);
  if (mode == OP_TRAIN) make_backward(l, ctx, mat, col);
  dnnl_md_destroy(mat);
  dnnl_md_destroy(col);
}

void l2norm_init_unowned(L2Norm *l, const Builder *b, int rows, int d) {
  make_primitives(l, b, OP_INFER, rows, d);
}

void l2norm_init(L2Norm *l, const Builder *b, int rows, int d, int need_din) {
  make_primitives(l, b, b->mode, rows, d);
  l->need_din = need_din && b->mode == OP_TRAIN;
  const MemCategory kept = builder_out_category(b);
  l->out = tl_alloc(sizeof(float) * (size_t)rows * d, kept, l->comp);
  l->norms = tl_alloc(sizeof(float) * (size_t)rows, kept, l->comp);
  if (l->need_din) l->din = tl_alloc(sizeof(float) * (size_t)rows * d, MEM_ACT_GRAD, l->comp);
}

// dst = src / (one value per row).
static void divide_rows(struct L2NormPrivate *p, ExecCtx *ctx, const float *src, float *dst) {
  dnnl_mem_bind(p->rows_a, src);
  dnnl_mem_bind(p->rows_b, dst);
  dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC_0, p->rows_a}, {DNNL_ARG_SRC_1, p->per_row}, {DNNL_ARG_DST, p->rows_b}};
  dnnl_ctx_exec(ctx, p->div, p->div_pd, 3, args);
}

void l2norm_forward_to(L2Norm *l, ExecCtx *ctx, const float *in, float *out, float *norms) {
  struct L2NormPrivate *p = l->priv;
  dnnl_mem_bind(p->rows_a, in);
  dnnl_mem_bind(p->per_row, norms);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->rows_a}, {DNNL_ARG_DST, p->per_row}};
  dnnl_ctx_exec(ctx, p->norm, p->norm_pd, 2, args);
  divide_rows(p, ctx, in, out);
  // A square-add per entry for the norms, a division for the unit rows.
  ctx->flops_forward[l->comp] += 3.0 * l->rows * l->d;
}

void l2norm_forward(L2Norm *l, ExecCtx *ctx, const float *in) {
  l2norm_forward_to(l, ctx, in, l->out, l->norms);
}

void l2norm_backward_to(L2Norm *l, ExecCtx *ctx, const float *dout, float *din) {
  struct L2NormPrivate *p = l->priv;
  if (l->mode != OP_TRAIN) TL_DIE("l2norm_backward on an op built without backward");
  dnnl_mem_bind(p->per_row, l->norms);
  divide_rows(p, ctx, dout, din);  // din = du / n
  dnnl_mem_bind(p->u3, l->out);
  dnnl_mem_bind(p->g3, din);
  dnnl_mem_bind(p->dot3, l->norms);  // the norms are spent: s = -(u . du) / n over them
  dnnl_exec_arg_t dot_args[] = {
      {DNNL_ARG_SRC, p->u3}, {DNNL_ARG_WEIGHTS, p->g3}, {DNNL_ARG_DST, p->dot3}};
  dnnl_ctx_exec(ctx, p->dot, p->dot_pd, 3, dot_args);
  dnnl_mem_bind(p->rows_a, l->out);
  dnnl_mem_bind(p->rows_b, din);
  dnnl_exec_arg_t sub_args[] = {
      {DNNL_ARG_SRC_0, p->rows_a}, {DNNL_ARG_SRC_1, p->per_row}, {DNNL_ARG_DST, p->rows_b}};
  dnnl_ctx_exec(ctx, p->sub, p->sub_pd, 3, sub_args);  // din += u * s
  // The model's arithmetic per entry: the dot, the multiply, the subtraction and the division.
  ctx->flops_backward[l->comp] += 4.0 * l->rows * l->d;
}

void l2norm_backward(L2Norm *l, ExecCtx *ctx, const float *dout) {
  TL_ASSERT(l->need_din);
  l2norm_backward_to(l, ctx, dout, l->din);
}

void l2norm_destroy(L2Norm *l) {
  struct L2NormPrivate *p = l->priv;
  if (p) {
    dnnl_primitive_t prims[] = {p->norm, p->div, p->dot, p->sub};
    dnnl_primitive_desc_t pds[] = {p->norm_pd, p->div_pd, p->dot_pd, p->sub_pd};
    for (int i = 0; i < 4; i++) {
      if (prims[i]) dnnl_primitive_destroy(prims[i]);
      if (pds[i]) dnnl_primitive_desc_destroy(pds[i]);
    }
    dnnl_memory_t mems[] = {p->rows_a, p->rows_b, p->per_row, p->u3, p->g3, p->dot3};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
      if (mems[i]) dnnl_memory_destroy(mems[i]);
    free(p);
  }
  tl_free(l->out);
  tl_free(l->norms);
  tl_free(l->din);
  memset(l, 0, sizeof *l);
}
