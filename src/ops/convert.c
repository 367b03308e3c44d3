#include "ops/convert.h"

#include <string.h>

static size_t type_bytes(dnnl_data_type_t t) { return t == dnnl_bf16 ? 2 : sizeof(float); }

void convert_init(Convert *l, Builder *b, size_t n, dnnl_data_type_t from, dnnl_data_type_t to,
                  int need_din) {
  if (n == 0 || from == to) TL_DIE("convert: %zu elements from type %d to %d", n, from, to);
  memset(l, 0, sizeof *l);
  l->n = n;
  l->in_bytes = n * type_bytes(from);
  l->out_bytes = n * type_bytes(to);
  l->need_din = need_din && b->mode == OP_TRAIN;
  op_calls_init(&l->calls, b);
  dnnl_dims_t dims = {(dnnl_dim_t)n};
  DnnlMd in_md = dnnl_md_typed(1, dims, from, dnnl_a), out_md = dnnl_md_typed(1, dims, to, dnnl_a);
  dnnl_reorder_init(&l->forward, b->ctx, in_md, out_md);
  op_out_alloc(b, &l->calls, &l->out_slots, l->out_bytes, b->component);
  l->out = l->out_slots;
  if (l->need_din) {
    dnnl_reorder_init(&l->backward, b->ctx, out_md, in_md);
    op_din_alloc(b, &l->calls, &l->din, l->in_bytes, b->component);
  }
  dnnl_md_destroy(in_md);
  dnnl_md_destroy(out_md);
}

BufValue convert_in_init(Convert *l, Builder *b, size_t n, BufValue din, BufValue *dout) {
  *dout = builder_grad_value(b);
  const BufValue out = builder_output(b, 0, 0, 0);
  builder_grad(b, din, *dout, 0);
  convert_init(l, b, n, dnnl_f32, builder_act_type(b), 1);
  return out;
}

void convert_out_init(Convert *l, Builder *b, size_t n, BufValue in, BufValue din) {
  builder_output(b, in, 0, OUT_OWN);
  builder_grad(b, din, 0, 0);
  convert_init(l, b, n, builder_act_type(b), dnnl_f32, 1);
}

const float *convert_forward(Convert *l, ExecCtx *ctx, const float *in) {
  if (!l->n) return in;
  l->out =
      op_out_slot(&l->calls, l->out_slots, l->out_bytes, op_calls_forward(&l->calls, "convert"));
  dnnl_reorder_run(&l->forward, ctx, in, l->out);
  return l->out;
}

const float *convert_backward(Convert *l, ExecCtx *ctx, const float *dout) {
  if (!l->n) return dout;
  if (!l->need_din) TL_DIE("convert_backward on an op built without an input gradient");
  l->out =
      op_out_slot(&l->calls, l->out_slots, l->out_bytes, op_calls_backward(&l->calls, "convert"));
  dnnl_reorder_run(&l->backward, ctx, dout, l->din);
  return l->din;
}

void convert_destroy(Convert *l) {
  dnnl_reorder_destroy(&l->forward);
  dnnl_reorder_destroy(&l->backward);
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
