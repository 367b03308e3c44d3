#include "ops/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Per attention-matrix element: forward scale (1), row max (1), subtract (1), exp (1), row sum
// (1), normalize (1) = 6; backward sum of dP*P (2), subtract (1), multiply by P (1), scale (1) = 5.
enum { SOFTMAX_FWD_FLOPS_PER_ELEM = 6, SOFTMAX_BWD_FLOPS_PER_ELEM = 5 };

// Where Q, K, V live for the matmuls. oneDNN 2.6 runs its fast (brgemm) matmul only on operands
// without gaps; head views into qkv have gaps, so they fall back to gemm:jit. Measured here
// (N = 256, D = 128 or 64, 4 heads, forward + backward with reorders, one thread, best of 15,
// side by side in one process): a reorder into dense heads wins below T ~ 32 (T = 17: 6.3-9.9 ms
// dense vs 9.5-12.9 ms strided); strided views win above (T = 65: 45-49 vs 52-56 ms) and keep no
// second copy of qkv for backward.
enum { DENSE_HEADS_MAX_T = 32 };

// One batched matmul dst = scale * src x weights over (N, H) batches of strided views. The
// 1/sqrt(Dh) scale rides on the matmul as an output scale instead of a separate pass.
typedef struct {
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t src, weights, dst;
} HeadMatmul;

struct AttentionPrivate {
  HeadMatmul scores;   // S = Q K^T * scale
  HeadMatmul context;  // out_h = P V
  HeadMatmul dprobs;   // dP = dO V^T
  HeadMatmul dvalue;   // dV = P^T dO
  HeadMatmul dquery;   // dQ = dS K * scale
  HeadMatmul dkey;     // dK = dS^T Q * scale
  dnnl_primitive_desc_t softmax_fwd_pd, softmax_bwd_pd;
  dnnl_primitive_t softmax_fwd, softmax_bwd;
  dnnl_memory_t probs_mem, dprobs_mem;
  // (N, H, T, T): scores, turned into probabilities in place by the softmax (kept for backward)
  float *probs;  // (calls, N, H, T, T)
  // (N, H, T, T): dP, turned into dS (gradient of the scaled scores) in place; OP_TRAIN only
  float *dprobs_buf;
  // T < DENSE_HEADS_MAX_T: Q, K, V as dense (3, N, H, T, Dh) heads, and their gradients.
  int dense_heads;
  dnnl_dim_t part_offset;  // elements from Q to K to V in whichever buffer holds them
  size_t elem_bytes;       // of every tensor above: the builder's act_type
  DnnlReorder to_heads, from_heads;
  float *heads;   // (calls, 3, N, H, T, Dh), kept for backward
  float *dheads;  // (3, N, H, T, Dh), OP_TRAIN only
  // Which of probs, heads (forward-only), dprobs_buf, dheads (training) are a pool's
  // (op_inner_alloc): none is read outside the pass that writes it.
  int probs_pooled, heads_pooled, dprobs_pooled, dheads_pooled;
};

double attention_flops_forward(int N, int T, int D, int heads) {
  double scores = (double)N * heads * T * T;
  return 2 * (2.0 * N * T * (double)T * D) + SOFTMAX_FWD_FLOPS_PER_ELEM * scores;
}

double attention_flops_backward(int N, int T, int D, int heads) {
  double scores = (double)N * heads * T * T;
  return 4 * (2.0 * N * T * (double)T * D) + SOFTMAX_BWD_FLOPS_PER_ELEM * scores;
}

// A (N, H, rows, cols) view of `type` elements with explicit strides (in elements).
static DnnlMd head_view(dnnl_data_type_t type, int N, int H, int rows, int cols,
                        dnnl_dim_t batch_stride, dnnl_dim_t head_stride, dnnl_dim_t row_stride,
                        dnnl_dim_t col_stride) {
  dnnl_dims_t dims = {N, H, rows, cols};
  dnnl_dims_t strides = {batch_stride, head_stride, row_stride, col_stride};
  return dnnl_md_strided_typed(4, dims, strides, type);
}

// Part `part` (0: Q, 1: K, 2: V) of the heads or their gradients starting at `base`.
static void *part_at(const struct AttentionPrivate *p, const void *base, int part) {
  return (char *)base + (size_t)part * (size_t)p->part_offset * p->elem_bytes;
}

static void head_matmul_init(HeadMatmul *m, ExecCtx *ctx, DnnlMd src, DnnlMd weights, DnnlMd dst,
                             float scale) {
  m->pd = dnnl_pd_matmul(ctx, src, weights, dst, scale);
  m->prim = dnnl_ctx_adopt(ctx, m->pd);
  m->src = dnnl_mem_new(ctx, src);
  m->weights = dnnl_mem_new(ctx, weights);
  m->dst = dnnl_mem_new(ctx, dst);
}

static void head_matmul_run(HeadMatmul *m, ExecCtx *ctx, const float *src, const float *weights,
                            float *dst) {
  dnnl_mem_bind(m->src, src);
  dnnl_mem_bind(m->weights, weights);
  dnnl_mem_bind(m->dst, dst);
  dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, m->src}, {DNNL_ARG_WEIGHTS, m->weights}, {DNNL_ARG_DST, m->dst}};
  dnnl_ctx_exec(ctx, m->prim, m->pd, 3, args);
}

static void head_matmul_destroy(HeadMatmul *m) {
  if (m->prim) dnnl_primitive_destroy(m->prim);
  if (m->pd) dnnl_primitive_desc_destroy(m->pd);
  dnnl_memory_t mems[] = {m->src, m->weights, m->dst};
  for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
    if (mems[i]) dnnl_memory_destroy(mems[i]);
}

void attention_init(Attention *a, Builder *b, int N, int T, int D, int heads) {
  if (N <= 0 || T <= 0 || heads <= 0 || D <= 0 || D % heads != 0)
    TL_DIE("attention: bad shape N=%d T=%d D=%d heads=%d", N, T, D, heads);
  ExecCtx *ctx = b->ctx;
  memset(a, 0, sizeof *a);
  a->N = N;
  a->T = T;
  a->D = D;
  a->H = heads;
  a->mode = b->mode;
  a->comp = b->component;
  op_calls_init(&a->calls, b);
  struct AttentionPrivate *p = calloc(1, sizeof *p);
  if (!p) TL_DIE("out of memory");
  a->priv = p;

  int H = heads, Dh = D / heads, train = b->mode == OP_TRAIN;
  // Every tensor in the activations' type: under bf16 the matmuls multiply bf16 with f32
  // accumulation and the softmax computes in f32 between a bf16 input and output.
  const dnnl_data_type_t type = builder_act_type(b);
  const size_t eb = p->elem_bytes = builder_act_bytes(b);
  dnnl_dim_t qkv_row = 3 * (dnnl_dim_t)D, qkv_image = (dnnl_dim_t)T * qkv_row;
  dnnl_dim_t out_image = (dnnl_dim_t)T * D, probs_head = (dnnl_dim_t)T * T;
  dnnl_dim_t probs_image = H * probs_head;
  size_t qkv_count = (size_t)N * (size_t)qkv_image;
  // Q, K, V (and dQ, dK, dV) heads as (T, Dh) matrices, either rows of qkv or dense; K^T and V^T
  // read the same memory with the last two strides swapped.
  p->dense_heads = T < DENSE_HEADS_MAX_T;
  DnnlMd qkv_head, qkv_head_t;
  if (p->dense_heads) {
    dnnl_dim_t head = (dnnl_dim_t)T * Dh;
    qkv_head = head_view(type, N, H, T, Dh, H * head, head, Dh, 1);
    qkv_head_t = head_view(type, N, H, Dh, T, H * head, head, 1, Dh);
    p->part_offset = (dnnl_dim_t)N * out_image;
    dnnl_dims_t dims = {3, N, H, T, Dh}, fused_strides = {D, qkv_image, Dh, qkv_row, 1};
    DnnlMd fused = dnnl_md_strided_typed(5, dims, fused_strides, type);
    DnnlMd split = dnnl_md_typed(5, dims, type, dnnl_abcde);
    dnnl_reorder_init(&p->to_heads, ctx, fused, split);
    if (train)
      p->heads = op_calls_alloc(&a->calls, qkv_count * eb, MEM_ACT, a->comp);
    else
      p->heads_pooled =
          op_inner_alloc(b, PASS_FORWARD, &p->heads, qkv_count * eb, MEM_WORKSPACE, a->comp);
    if (train) {
      dnnl_reorder_init(&p->from_heads, ctx, split, fused);
      p->dheads_pooled =
          op_inner_alloc(b, PASS_BACKWARD, &p->dheads, qkv_count * eb, MEM_ACT_GRAD, a->comp);
    }
    dnnl_md_destroy(fused);
    dnnl_md_destroy(split);
  } else {
    qkv_head = head_view(type, N, H, T, Dh, qkv_image, Dh, qkv_row, 1);
    qkv_head_t = head_view(type, N, H, Dh, T, qkv_image, Dh, 1, qkv_row);
    p->part_offset = D;
  }
  DnnlMd out_head = head_view(type, N, H, T, Dh, out_image, Dh, D, 1);
  DnnlMd probs = head_view(type, N, H, T, T, probs_image, probs_head, T, 1);
  DnnlMd probs_t = head_view(type, N, H, T, T, probs_image, probs_head, 1, T);
  float scale = 1.0f / sqrtf((float)Dh);

  head_matmul_init(&p->scores, ctx, qkv_head, qkv_head_t, probs, scale);
  head_matmul_init(&p->context, ctx, probs, qkv_head, out_head, 1.0f);
  p->softmax_fwd_pd = dnnl_pd_softmax_forward(
      ctx, train ? dnnl_forward_training : dnnl_forward_inference, dnnl_softmax_accurate, probs, 3);
  p->softmax_fwd = dnnl_ctx_adopt(ctx, p->softmax_fwd_pd);
  p->probs_mem = dnnl_mem_new(ctx, probs);
  size_t probs_count = (size_t)N * (size_t)probs_image;
  if (train)
    p->probs = op_calls_alloc(&a->calls, probs_count * eb, MEM_ACT, a->comp);
  else
    p->probs_pooled =
        op_inner_alloc(b, PASS_FORWARD, &p->probs, probs_count * eb, MEM_WORKSPACE, a->comp);
  op_out_alloc(b, &a->calls, &a->out_slots, (size_t)N * (size_t)out_image * eb, a->comp);
  a->out = a->out_slots;
  if (train) {
    head_matmul_init(&p->dprobs, ctx, out_head, qkv_head_t, probs, 1.0f);
    head_matmul_init(&p->dvalue, ctx, probs_t, out_head, qkv_head, 1.0f);
    head_matmul_init(&p->dquery, ctx, probs, qkv_head, qkv_head, scale);
    head_matmul_init(&p->dkey, ctx, probs_t, qkv_head, qkv_head, scale);
    p->softmax_bwd_pd =
        dnnl_pd_softmax_backward(ctx, dnnl_softmax_accurate, probs, 3, p->softmax_fwd_pd);
    p->softmax_bwd = dnnl_ctx_adopt(ctx, p->softmax_bwd_pd);
    p->dprobs_mem = dnnl_mem_new(ctx, probs);
    p->dprobs_pooled =
        op_inner_alloc(b, PASS_BACKWARD, &p->dprobs_buf, probs_count * eb, MEM_ACT_GRAD, a->comp);
    op_din_alloc(b, &a->calls, &a->din, qkv_count * eb, a->comp);
  }
  DnnlMd mds[] = {qkv_head, qkv_head_t, out_head, probs, probs_t};
  for (size_t i = 0; i < sizeof mds / sizeof mds[0]; i++) dnnl_md_destroy(mds[i]);
}

// One call's saved tensors: its output, softmax output and (dense) heads.
typedef struct {
  float *probs, *heads;
} AttentionCall;

static AttentionCall attention_call(Attention *a, int call) {
  struct AttentionPrivate *p = a->priv;
  size_t qkv_bytes = (size_t)a->N * a->T * 3 * a->D * p->elem_bytes;
  size_t probs_bytes = (size_t)a->N * a->H * a->T * a->T * p->elem_bytes;
  a->out = op_out_slot(&a->calls, a->out_slots, (size_t)a->N * a->T * a->D * p->elem_bytes, call);
  return (AttentionCall){op_slot(p->probs, probs_bytes, call), op_slot(p->heads, qkv_bytes, call)};
}

void attention_forward(Attention *a, ExecCtx *ctx, const float *qkv) {
  struct AttentionPrivate *p = a->priv;
  int call = op_calls_forward(&a->calls, "attention");
  a->calls.in[call] = a->qkv = qkv;
  AttentionCall c = attention_call(a, call);
  if (p->dense_heads) dnnl_reorder_run(&p->to_heads, ctx, qkv, c.heads);
  const float *q = p->dense_heads ? c.heads : qkv;
  const float *k = part_at(p, q, 1), *v = part_at(p, q, 2);
  head_matmul_run(&p->scores, ctx, q, k, c.probs);
  dnnl_mem_bind(p->probs_mem, c.probs);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->probs_mem}, {DNNL_ARG_DST, p->probs_mem}};
  dnnl_ctx_exec(ctx, p->softmax_fwd, p->softmax_fwd_pd, 2, args);
  head_matmul_run(&p->context, ctx, c.probs, v, a->out);
  ctx->flops_forward[a->comp] += attention_flops_forward(a->N, a->T, a->D, a->H);
}

int attention_backward_reads_input(const Attention *a) { return !a->priv->dense_heads; }

void attention_backward(Attention *a, ExecCtx *ctx, const float *dout) {
  struct AttentionPrivate *p = a->priv;
  if (a->mode != OP_TRAIN) TL_DIE("attention_backward on an op built without backward");
  int call = op_calls_backward(&a->calls, "attention");
  a->qkv = a->calls.in[call];
  AttentionCall c = attention_call(a, call);
  TL_ASSERT(a->qkv);
  const float *q = p->dense_heads ? c.heads : a->qkv;
  const float *k = part_at(p, q, 1), *v = part_at(p, q, 2);
  float *dq = p->dense_heads ? p->dheads : a->din;
  float *dk = part_at(p, dq, 1), *dv = part_at(p, dq, 2);
  head_matmul_run(&p->dprobs, ctx, dout, v, p->dprobs_buf);
  head_matmul_run(&p->dvalue, ctx, c.probs, dout, dv);
  dnnl_mem_bind(p->probs_mem, c.probs);
  dnnl_mem_bind(p->dprobs_mem, p->dprobs_buf);
  dnnl_exec_arg_t args[] = {{DNNL_ARG_DST, p->probs_mem},
                            {DNNL_ARG_DIFF_DST, p->dprobs_mem},
                            {DNNL_ARG_DIFF_SRC, p->dprobs_mem}};
  dnnl_ctx_exec(ctx, p->softmax_bwd, p->softmax_bwd_pd, 3, args);
  head_matmul_run(&p->dquery, ctx, p->dprobs_buf, k, dq);
  head_matmul_run(&p->dkey, ctx, p->dprobs_buf, q, dk);
  if (p->dense_heads) dnnl_reorder_run(&p->from_heads, ctx, p->dheads, a->din);
  ctx->flops_backward[a->comp] += attention_flops_backward(a->N, a->T, a->D, a->H);
}

void attention_destroy(Attention *a) {
  struct AttentionPrivate *p = a->priv;
  if (p) {
    HeadMatmul *mms[] = {&p->scores, &p->context, &p->dprobs, &p->dvalue, &p->dquery, &p->dkey};
    for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++) head_matmul_destroy(mms[i]);
    if (p->softmax_fwd) dnnl_primitive_destroy(p->softmax_fwd);
    if (p->softmax_fwd_pd) dnnl_primitive_desc_destroy(p->softmax_fwd_pd);
    if (p->softmax_bwd) dnnl_primitive_destroy(p->softmax_bwd);
    if (p->softmax_bwd_pd) dnnl_primitive_desc_destroy(p->softmax_bwd_pd);
    if (p->probs_mem) dnnl_memory_destroy(p->probs_mem);
    if (p->dprobs_mem) dnnl_memory_destroy(p->dprobs_mem);
    op_buffer_free(p->probs, p->probs_pooled);
    op_buffer_free(p->dprobs_buf, p->dprobs_pooled);
    dnnl_reorder_destroy(&p->to_heads);
    dnnl_reorder_destroy(&p->from_heads);
    op_buffer_free(p->heads, p->heads_pooled);
    op_buffer_free(p->dheads, p->dheads_pooled);
    free(p);
  }
  op_buffer_free(a->out_slots, a->calls.out_pooled);
  op_buffer_free(a->din, a->calls.din_pooled);
  memset(a, 0, sizeof *a);
}
