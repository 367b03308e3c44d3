#include "ops/oplist.h"

#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv.h"
#include "ops/convert.h"
#include "ops/eltwise.h"
#include "ops/layernorm.h"
#include "ops/layerscale.h"
#include "ops/linear.h"
#include "ops/maxpool.h"
#include "ops/pool.h"

// The kinds: each op's public API (its .h) behind the table's signatures. What every one-input
// op has, for an op type T whose functions are PREFIX_forward/backward/destroy:
#define OP_ADAPTERS(T, prefix)                                                                 \
  static void prefix##_forward_1(void *op, ExecCtx *ctx, const float *in, const float *none) { \
    (void)none;                                                                                \
    prefix##_forward(op, ctx, in);                                                             \
  }                                                                                            \
  static void prefix##_backward_1(void *op, ExecCtx *ctx, const float *dout) {                 \
    prefix##_backward(op, ctx, dout);                                                          \
  }                                                                                            \
  static void prefix##_destroy_1(void *op) { prefix##_destroy(op); }                           \
  static float *prefix##_out(void *op) { return ((T *)op)->out; }                              \
  static float *prefix##_din(void *op) { return ((T *)op)->din; }                              \
  static const OpCalls *prefix##_calls(const void *op) { return &((const T *)op)->calls; }

#define OP_TABLE(prefix)                                                       \
  .inputs = 1, .forward = prefix##_forward_1, .backward = prefix##_backward_1, \
  .destroy = prefix##_destroy_1, .out = prefix##_out, .din = prefix##_din, .calls = prefix##_calls

static int reads_always(const void *op) { return (void)op, 1; }
static unsigned in_place(const Builder *b) { return (void)b, OUT_IN_PLACE; }

OP_ADAPTERS(Conv2d, conv2d)
static OpShape conv_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  Conv2d *l = op;
  conv2d_init_grouped(l, b, a->name, in->N, in->C, in->H, in->W, a->channels, a->kernel, a->stride,
                      a->pad, a->groups ? a->groups : 1, a->has_bias, need_din);
  return (OpShape){in->N, l->OH, l->OW, l->OC};
}
static int conv_reads_input(const void *op) { return conv2d_backward_reads_input(op); }

const OpKind op_conv = {.name = "conv",
                        .size = sizeof(Conv2d),
                        .init = conv_init,
                        OP_TABLE(conv2d),
                        .backward_reads_input = conv_reads_input,
                        .may_read_input = 1};

OP_ADAPTERS(BatchNorm, batchnorm)
static OpShape bn_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  batchnorm_init(op, b, a->name, in->N, in->C, in->H, in->W, a->fuse_relu, need_din);
  return *in;
}
static void bn_recompute(void *op, ExecCtx *ctx) { batchnorm_recompute(op, ctx); }
// Over its input, unless it reads the input again after writing (sync_bn's second pass).
static unsigned bn_flags(const Builder *b) {
  return OUT_IN_PLACE | (batchnorm_in_place(b) ? 0 : OUT_READS_LATE);
}

const OpKind op_batchnorm = {.name = "batchnorm",
                             .size = sizeof(BatchNorm),
                             .init = bn_init,
                             OP_TABLE(batchnorm),
                             .recompute = bn_recompute,
                             .backward_reads_input = reads_always,
                             .may_read_input = 1,
                             .out_flags = bn_flags};

OP_ADAPTERS(Eltwise, eltwise)
static OpShape relu_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)a;
  eltwise_init(op, b, ELTWISE_RELU, op_shape_elems(*in), need_din);
  return *in;
}
static OpShape gelu_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)a;
  eltwise_init(op, b, ELTWISE_GELU, op_shape_elems(*in), need_din);
  return *in;
}
static void eltwise_recompute_1(void *op, ExecCtx *ctx) { eltwise_recompute(op, ctx); }

// ReLU's backward reads its output (dst > 0); GELU's reads its input, so its output can be
// written again from it.
const OpKind op_relu = {.name = "relu",
                        .size = sizeof(Eltwise),
                        .init = relu_init,
                        OP_TABLE(eltwise),
                        .backward_reads_output = 1,
                        .out_flags = in_place};
const OpKind op_gelu = {.name = "gelu",
                        .size = sizeof(Eltwise),
                        .init = gelu_init,
                        OP_TABLE(eltwise),
                        .recompute = eltwise_recompute_1,
                        .backward_reads_input = reads_always,
                        .may_read_input = 1,
                        .out_flags = in_place};

// The residual sum: no backward of its own, the gradient at its output reaches both inputs.
static OpShape add_init_2(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)a, (void)need_din;
  if (op_shape_elems(in[0]) != op_shape_elems(in[1]))
    TL_DIE("add: inputs of %zu and %zu elements", op_shape_elems(in[0]), op_shape_elems(in[1]));
  add_init(op, b, op_shape_elems(in[0]), builder_out_category(b), 0);
  return in[0];
}
static void add_forward_2(void *op, ExecCtx *ctx, const float *a, const float *b) {
  add_forward(op, ctx, a, b);
}
static void add_destroy_1(void *op) { add_destroy(op); }
static float *add_out(void *op) { return ((Add *)op)->out; }
static const OpCalls *add_calls(const void *op) { return &((const Add *)op)->calls; }

const OpKind op_add = {.name = "add",
                       .size = sizeof(Add),
                       .inputs = 2,
                       .init = add_init_2,
                       .forward = add_forward_2,
                       .destroy = add_destroy_1,
                       .out = add_out,
                       .calls = add_calls,
                       .out_flags = in_place};

OP_ADAPTERS(LayerNorm, layernorm)
static OpShape ln_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)need_din;  // its backward writes the input gradient its scale and shift need anyway
  layernorm_init(op, b, a->name, in->N * in->H * in->W, in->C);
  return *in;
}
static void ln_recompute(void *op, ExecCtx *ctx) { layernorm_recompute(op, ctx); }

const OpKind op_layernorm = {.name = "layernorm",
                             .size = sizeof(LayerNorm),
                             .init = ln_init,
                             OP_TABLE(layernorm),
                             .recompute = ln_recompute,
                             .backward_reads_input = reads_always,
                             .may_read_input = 1};

OP_ADAPTERS(Linear, linear)
static OpShape linear_init_1(void *op, Builder *b, const OpArgs *a, const OpShape *in,
                             int need_din) {
  linear_init(op, b, a->name, in->N * in->H * in->W, in->C, a->channels, a->has_bias, need_din,
              a->init_std);
  return (OpShape){in->N, in->H, in->W, a->channels};
}
static int linear_reads_input(const void *op) { return linear_backward_reads_input(op); }

const OpKind op_linear = {.name = "linear",
                          .size = sizeof(Linear),
                          .init = linear_init_1,
                          OP_TABLE(linear),
                          .backward_reads_input = linear_reads_input,
                          .may_read_input = 1};

// Each channel times its own factor. Its backward reads its input (the factors' gradient), so it
// cannot write over it; its output cannot be written again (no recompute).
OP_ADAPTERS(LayerScale, layerscale)
static OpShape ls_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  layerscale_init(op, b, a->name, in->N * in->H * in->W, in->C, a->scale_init, need_din);
  return *in;
}

const OpKind op_layerscale = {.name = "layerscale",
                              .size = sizeof(LayerScale),
                              .init = ls_init,
                              OP_TABLE(layerscale),
                              .backward_reads_input = reads_always,
                              .may_read_input = 1};

// Tokens (N, T, 1, 3D) = [Q | K | V] -> (N, T, 1, D).
OP_ADAPTERS(Attention, attention)
static OpShape attn_init(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)need_din;
  if (in->C % 3) TL_DIE("attention: %d input features are not [Q | K | V]", in->C);
  attention_init(op, b, in->N, in->H * in->W, in->C / 3, a->heads);
  return (OpShape){in->N, in->H, in->W, in->C / 3};
}

// Its backward reads the qkv input, or for short sequences the dense heads it keeps instead.
static int attn_reads_input(const void *op) { return attention_backward_reads_input(op); }

const OpKind op_attention = {.name = "attention",
                             .size = sizeof(Attention),
                             .init = attn_init,
                             OP_TABLE(attention),
                             .backward_reads_input = attn_reads_input,
                             .may_read_input = 1};

// Its backward reads the argmax it keeps, not its input or output.
OP_ADAPTERS(MaxPool, maxpool)
static OpShape maxpool_init_1(void *op, Builder *b, const OpArgs *a, const OpShape *in,
                              int need_din) {
  MaxPool *l = op;
  maxpool_init(l, b, in->N, in->H, in->W, in->C, a->kernel, a->stride, a->pad, need_din);
  return (OpShape){in->N, l->OH, l->OW, in->C};
}

const OpKind op_maxpool = {
    .name = "maxpool", .size = sizeof(MaxPool), .init = maxpool_init_1, OP_TABLE(maxpool)};

// Global average pooling: (N, H, W, C) -> (N, 1, 1, C).
OP_ADAPTERS(GlobalAvgPool, gap)
static OpShape gap_init_1(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din) {
  (void)a;
  gap_init(op, b, in->N, in->H, in->W, in->C, need_din);
  return (OpShape){in->N, 1, 1, in->C};
}

const OpKind op_avgpool = {
    .name = "avgpool", .size = sizeof(GlobalAvgPool), .init = gap_init_1, OP_TABLE(gap)};

// A change of data type where the network meets f32 code: into the activations' type from an
// f32 input (OP_ARG_INPUT_F32), or from them into f32 (OP_ARG_OUTPUT_F32). Its backward converts
// the gradient back and reads neither input nor output.
OP_ADAPTERS(Convert, convert)
static OpShape convert_init_1(void *op, Builder *b, const OpArgs *a, const OpShape *in,
                              int need_din) {
  const dnnl_data_type_t to = (a->flags & OP_ARG_OUTPUT_F32) ? dnnl_f32 : builder_act_type(b);
  convert_init(op, b, op_shape_elems(*in), builder_input_type(b), to, need_din);
  return *in;
}
const OpKind op_convert = {
    .name = "convert", .size = sizeof(Convert), .init = convert_init_1, OP_TABLE(convert)};

// The list.

int oplist_add(OpList *l, const OpKind *kind, int in0, int in1, OpArgs args) {
  if (l->n + 2 > l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->nodes = realloc(l->nodes, sizeof *l->nodes * (size_t)l->cap);
    if (!l->nodes) TL_DIE("out of memory for %d op nodes", l->cap);
  }
  const int id = ++l->n;
  if (in0 < 0 || in0 >= id || (kind->inputs > 1 && (in1 < 0 || in1 >= id)))
    TL_DIE("op list: node %d (%s) reads a node not before it", id, kind->name);
  OpNode *nd = &l->nodes[id];
  *nd = (OpNode){.kind = kind, .in = {in0, kind->inputs > 1 ? in1 : -1}, .args = args};
  if (args.name) snprintf(nd->name, sizeof nd->name, "%s", args.name);
  return id;
}

// Who reads each value; the list's output (the last node's) is read outside it.
static void count_readers(OpList *l) {
  l->values = calloc((size_t)l->n + 1, sizeof *l->values);
  if (!l->values) TL_DIE("out of memory");
  for (int k = 1; k <= l->n; k++)
    for (int j = 0; j < l->nodes[k].kind->inputs; j++) {
      OpValue *val = &l->values[l->nodes[k].in[j]];
      if (val->readers == 2) TL_DIE("op list: a value read by more than two nodes");
      val->reader[val->readers] = k;
      val->slot[val->readers++] = j;
    }
  if (l->values[l->n].readers) TL_DIE("op list: the output is read inside the list");
}

// The gradient values, from the output back: grad[v] reaches value v, partial[k][j] is what node
// k's backward sends its input j — the value's gradient itself when it has one reader, else one
// of the two its sum adds; a sum's backward (add) sends its output's gradient on unchanged. New
// values are first tokens (-1, -2, ...), then made in the order their readers run forward, as a
// module declaring them by hand would (the planner breaks ties between equal sizes by that order).
static BufValue grad_value_of(Builder *b, BufValue *made, BufValue token) {
  if (token >= 0) return token;
  if (!made[-token - 1]) made[-token - 1] = builder_grad_value(b);
  return made[-token - 1];
}

static void plan_gradients(const OpList *l, Builder *b, OpListValues io, BufValue *grad,
                           BufValue (*partial)[2]) {
  int tokens = 0;
  grad[l->n] = io.dout;
  grad[0] = l->need_din ? io.din : 0;
  for (int k = l->n; k >= 1; k--) {
    const OpNode *nd = &l->nodes[k];
    if (k < l->n && l->values[k].readers == 2) grad[k] = -++tokens;
    for (int j = 0; j < nd->kind->inputs; j++) {
      const int v = nd->in[j];
      BufValue p = nd->kind->backward ? -++tokens : grad[k];
      if (v == 0 && !l->need_din) {
        p = 0;
      } else if (v == 0 && l->values[0].readers == 1) {
        if (!nd->kind->backward) TL_DIE("op list: the input read once, by a sum");
        p = grad[0];
      }
      if (v && l->values[v].readers == 1) grad[v] = p;
      partial[k][j] = p;
    }
  }
  BufValue *made = calloc((size_t)tokens + 1, sizeof *made);
  if (!made) TL_DIE("out of memory");
  for (int k = 1; k <= l->n; k++) {
    for (int j = 0; j < l->nodes[k].kind->inputs; j++)
      partial[k][j] = grad_value_of(b, made, partial[k][j]);
    grad[k] = grad_value_of(b, made, grad[k]);
  }
  free(made);
}

// With two readers, the sum of their gradients is an op of its own, declared right after the
// value's writer, so that backward (in reverse) runs it after both readers' and before the
// writer's.
static void declare_sum(OpList *l, Builder *b, int v, OpShape shape, const BufValue *grad,
                        BufValue (*partial)[2]) {
  OpValue *val = &l->values[v];
  if (b->mode != OP_TRAIN || val->readers < 2 || (v == 0 && !l->need_din)) return;
  builder_output(b, 0, 0, OUT_NONE);
  builder_grad(b, grad[v], partial[val->reader[0]][val->slot[0]],
               partial[val->reader[1]][val->slot[1]]);
  val->sum = calloc(1, sizeof *val->sum);
  if (!val->sum) TL_DIE("out of memory");
  add_init(val->sum, b, op_shape_elems(shape), MEM_ACT_GRAD, 1);
}

// Recomputing an output pays when a reader in the list may read it in backward.
static int may_recompute(const OpList *l, int k) {
  if (!l->nodes[k].kind->recompute || (l->nodes[k].args.flags & OP_ARG_KEEP)) return 0;
  const OpValue *val = &l->values[k];
  for (int r = 0; r < val->readers; r++)
    if (l->nodes[val->reader[r]].kind->may_read_input) return 1;
  return 0;
}

static BufValue declare_node(OpList *l, Builder *b, int k, const OpShape *shapes,
                             const BufValue *value, const BufValue *grad, BufValue (*partial)[2]) {
  OpNode *nd = &l->nodes[k];
  const OpKind *kind = nd->kind;
  const int train = b->mode == OP_TRAIN, two = kind->inputs > 1;
  unsigned flags = kind->out_flags ? kind->out_flags(b) : 0;
  if (may_recompute(l, k)) flags |= OUT_RECOMPUTED;
  if (nd->args.flags & OP_ARG_OWN_OUTPUT) flags |= OUT_OWN;
  const BufValue out = builder_output(b, value[nd->in[0]], two ? value[nd->in[1]] : 0, flags);
  if (kind->backward) builder_grad(b, partial[k][0], grad[k], 0);
  if (nd->args.name) nd->args.name = nd->name;  // the nodes no longer move
  const int input_f32 = b->input_f32;
  if (nd->args.flags & OP_ARG_INPUT_F32) b->input_f32 = 1;
  nd->op = calloc(1, kind->size);
  if (!nd->op) TL_DIE("out of memory");
  const OpShape in[2] = {shapes[nd->in[0]], two ? shapes[nd->in[1]] : shapes[nd->in[0]]};
  nd->shape = kind->init(nd->op, b, &nd->args, in, train && (nd->in[0] || l->need_din));
  b->input_f32 = input_f32;
  if (train && kind->backward_reads_input && kind->backward_reads_input(nd->op))
    builder_backward_reads(b, value[nd->in[0]]);
  if (kind->backward_reads_output) builder_backward_reads(b, out);
  return out;
}

BufValue oplist_build(OpList *l, Builder *b, OpShape in, int need_din, OpListValues io) {
  if (!l->n) TL_DIE("op list: no nodes");
  l->need_din = need_din && b->mode == OP_TRAIN;
  count_readers(l);
  const size_t n = (size_t)l->n + 1;
  BufValue *value = calloc(n, sizeof *value), *grad = calloc(n, sizeof *grad);
  BufValue(*partial)[2] = calloc(n, sizeof *partial);
  OpShape *shapes = calloc(n, sizeof *shapes);
  if (!value || !grad || !partial || !shapes) TL_DIE("out of memory");
  plan_gradients(l, b, io, grad, partial);
  value[0] = io.x;
  shapes[0] = in;
  declare_sum(l, b, 0, in, grad, partial);
  for (int k = 1; k <= l->n; k++) {
    value[k] = declare_node(l, b, k, shapes, value, grad, partial);
    shapes[k] = l->nodes[k].shape;
    declare_sum(l, b, k, shapes[k], grad, partial);
  }
  const BufValue out = value[l->n];
  free(value);
  free(grad);
  free(partial);
  free(shapes);
  b->out_value = b->grad_value = 0;
  return out;
}

BufValue oplist_build_chain(OpList *lists, int n, Builder *b, OpShape *shape, int need_din,
                            OpListValues v) {
  BufValue x = v.x, din = v.din;
  for (int i = 0; i < n; i++) {
    const BufValue dout = i + 1 < n ? builder_grad_value(b) : v.dout;
    x = oplist_build(&lists[i], b, *shape, i ? 1 : need_din, (OpListValues){x, dout, din});
    *shape = oplist_shape(&lists[i]);
    din = dout;
  }
  return x;
}

OpShape oplist_shape(const OpList *l) { return l->nodes[l->n].shape; }

float *oplist_out(const OpList *l) { return l->nodes[l->n].kind->out(l->nodes[l->n].op); }

void *oplist_op(const OpList *l, int node) {
  if (node < 1 || node > l->n) TL_DIE("op list: no node %d", node);
  return l->nodes[node].op;
}

static const float *value_out(const OpList *l, int v) {
  return v ? l->nodes[v].kind->out(l->nodes[v].op) : l->in;
}

float *oplist_forward(OpList *l, ExecCtx *ctx, const float *in) {
  l->in = in;
  for (int k = 1; k <= l->n; k++) {
    const OpNode *nd = &l->nodes[k];
    nd->kind->forward(nd->op, ctx, value_out(l, nd->in[0]),
                      nd->kind->inputs > 1 ? value_out(l, nd->in[1]) : NULL);
  }
  return oplist_out(l);
}

// The gradient reaching value v once its readers' backwards ran (dout at the output).
static const float *value_grad(const OpList *l, int v, const float *dout) {
  const OpValue *val = &l->values[v];
  if (v == l->n) return dout;
  if (v == 0 && !l->need_din) return NULL;
  if (val->sum) return val->sum->out;
  return val->readers ? l->nodes[val->reader[0]].partial[val->slot[0]] : NULL;
}

static void run_sum(OpList *l, ExecCtx *ctx, int v) {
  const OpValue *val = &l->values[v];
  if (val->sum)
    add_forward(val->sum, ctx, l->nodes[val->reader[0]].partial[val->slot[0]],
                l->nodes[val->reader[1]].partial[val->slot[1]]);
}

// A recomputable output the backward reads, not kept, is written again just before it.
static void recompute_inputs(OpList *l, ExecCtx *ctx, const OpNode *nd) {
  if (!nd->kind->backward_reads_input || !nd->kind->backward_reads_input(nd->op)) return;
  for (int j = 0; j < nd->kind->inputs; j++) {
    const OpNode *p = nd->in[j] ? &l->nodes[nd->in[j]] : NULL;
    if (p && p->kind->recompute && p->kind->calls(p->op)->out_shared)
      p->kind->recompute(p->op, ctx);
  }
}

const float *oplist_backward(OpList *l, ExecCtx *ctx, const float *dout) {
  for (int k = l->n; k >= 1; k--) {
    OpNode *nd = &l->nodes[k];
    run_sum(l, ctx, k);
    const float *d = value_grad(l, k, dout);
    if (!nd->kind->backward) {
      nd->partial[0] = nd->partial[1] = d;
      continue;
    }
    recompute_inputs(l, ctx, nd);
    nd->kind->backward(nd->op, ctx, d);
    nd->partial[0] = nd->kind->din(nd->op);
  }
  run_sum(l, ctx, 0);
  return value_grad(l, 0, NULL);
}

void oplist_destroy(OpList *l) {
  for (int k = 1; k <= l->n; k++) {
    if (l->nodes[k].op) l->nodes[k].kind->destroy(l->nodes[k].op);
    free(l->nodes[k].op);
  }
  for (int v = 0; l->values && v <= l->n; v++)
    if (l->values[v].sum) {
      add_destroy(l->values[v].sum);
      free(l->values[v].sum);
    }
  free(l->nodes);
  free(l->values);
  memset(l, 0, sizeof *l);
}

const float *oplist_chain_forward(OpList *lists, int n, ExecCtx *ctx, const float *in) {
  for (int i = 0; i < n; i++) in = oplist_forward(&lists[i], ctx, in);
  return in;
}

const float *oplist_chain_backward(OpList *lists, int n, ExecCtx *ctx, const float *dout) {
  for (int i = n - 1; i >= 0; i--) dout = oplist_backward(&lists[i], ctx, dout);
  return dout;
}

void oplist_chain_destroy(OpList *lists, int n) {
  for (int i = 0; i < n; i++) oplist_destroy(&lists[i]);
  free(lists);
}
