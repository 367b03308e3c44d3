#include "nn/transformer.h"

#include <stdio.h>
#include <string.h>

// The block's op list (ops/oplist.h) on tokens (N, T, 1, D). The list plans the rest: outputs
// no backward reads share the pool's buffers (proj and fc2, read once by the residual sums; the
// norms' and GELU's when their readers' backward reads a converted copy, or when [train]
// recompute writes them again before that backward), the sums and GELU write over their input
// where nothing reads it later (without backward), the gradients reaching x and x1 by two paths
// are summed, and gradients share buffers by lifetime. x: the block's input value, dout: the
// gradient reaching its output, din: where its input gradient goes.
static BufValue block_build(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din, BufValue x,
                            BufValue dout, BufValue din) {
  *blk = (TransformerBlock){.N = N,
                            .T = T,
                            .D = D,
                            .heads = heads,
                            .mlp_ratio = mlp_ratio,
                            .need_din = need_din && b->mode == OP_TRAIN,
                            .mode = b->mode};
  OpList *l = &blk->ops;
  char nm[64];
#define PART(part) (snprintf(nm, sizeof nm, "%s.%s", name, part), nm)
  const int n1 = oplist_add(l, &op_layernorm, OPLIST_INPUT, 0, (OpArgs){.name = PART("norm1")});
  const int qkv = oplist_add(l, &op_linear, n1, 0,
                             (OpArgs){.name = PART("attn.qkv"), .channels = 3 * D, .has_bias = 1});
  const int at = oplist_add(l, &op_attention, qkv, 0, (OpArgs){.heads = heads});
  const int proj = oplist_add(l, &op_linear, at, 0,
                              (OpArgs){.name = PART("attn.proj"), .channels = D, .has_bias = 1});
  const int x1 = oplist_add(l, &op_add, proj, OPLIST_INPUT, (OpArgs){0});
  const int n2 = oplist_add(l, &op_layernorm, x1, 0, (OpArgs){.name = PART("norm2")});
  const int fc1 =
      oplist_add(l, &op_linear, n2, 0,
                 (OpArgs){.name = PART("mlp.fc1"), .channels = mlp_ratio * D, .has_bias = 1});
  const int gelu = oplist_add(l, &op_gelu, fc1, 0, (OpArgs){0});
  const int fc2 = oplist_add(l, &op_linear, gelu, 0,
                             (OpArgs){.name = PART("mlp.fc2"), .channels = D, .has_bias = 1});
  oplist_add(l, &op_add, fc2, x1, (OpArgs){0});
#undef PART
  const BufValue out =
      oplist_build(l, b, (OpShape){N, T, 1, D}, need_din, (OpListValues){x, dout, din});
  blk->norm1 = oplist_op(l, n1);
  blk->qkv = oplist_op(l, qkv);
  blk->attn = oplist_op(l, at);
  blk->proj = oplist_op(l, proj);
  blk->norm2 = oplist_op(l, n2);
  blk->fc1 = oplist_op(l, fc1);
  blk->fc2 = oplist_op(l, fc2);
  blk->out = oplist_out(l);
  return out;
}

void transformer_block_init(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din) {
  block_build(blk, b, name, N, T, D, heads, mlp_ratio, need_din, 0, 0, 0);
}

BufValue transformer_stack_init(TransformerBlock *blocks, int depth, Builder *b, const char *prefix,
                                int N, int T, int D, int heads, int mlp_ratio, BufValue x,
                                BufValue dout, BufValue din) {
  BufValue g_in = din;
  for (int i = 0; i < depth; i++) {
    char name[48];
    snprintf(name, sizeof name, "%s.%d", prefix, i);
    const BufValue g_out = i + 1 < depth ? builder_grad_value(b) : dout;
    x = block_build(&blocks[i], b, name, N, T, D, heads, mlp_ratio, 1, x, g_out, g_in);
    g_in = g_out;
  }
  return x;
}

const float *transformer_block_forward(TransformerBlock *blk, ExecCtx *ctx, const float *in) {
  blk->in = in;
  return blk->out = oplist_forward(&blk->ops, ctx, in);
}

const float *transformer_block_backward(TransformerBlock *blk, ExecCtx *ctx, const float *dout) {
  if (blk->mode != OP_TRAIN) TL_DIE("transformer_block_backward on a block built without backward");
  const float *din = oplist_backward(&blk->ops, ctx, dout);
  return blk->need_din ? (blk->din = (float *)din) : NULL;
}

void transformer_block_destroy(TransformerBlock *blk) {
  oplist_destroy(&blk->ops);
  memset(blk, 0, sizeof *blk);
}
