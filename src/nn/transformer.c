#include "nn/transformer.h"

#include <stdio.h>
#include <string.h>

// The block's ops in the order forward runs them, each declared to the builder's pool before it is
// built (ops/builder.h): what it reads, where its output goes, which gradient its backward reads
// and writes. The planner decides the rest (ops/buffer_pool.h): outputs no backward reads share
// the pool's buffers (proj and fc2, read once by the residual sums; the norms' and GELU's when
// their readers' backward reads a converted copy, or when [train] recompute writes them again
// first, transformer_block_backward), the sums and GELU write over their input where nothing
// reads it later (without backward), and gradients share buffers by lifetime. x: the block's
// input value, dout: the gradient reaching its output, din: where its input gradient goes.
static BufValue block_build(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din, BufValue x,
                            BufValue dout, BufValue din) {
  memset(blk, 0, sizeof *blk);
  int train = b->mode == OP_TRAIN;
  blk->N = N;
  blk->T = T;
  blk->D = D;
  blk->heads = heads;
  blk->mlp_ratio = mlp_ratio;
  blk->need_din = need_din && train;
  blk->mode = b->mode;
  int M = N * T, hidden = mlp_ratio * D;
  size_t n = (size_t)M * (size_t)D;
  char nm[64];
  // Gradients: at x through the attention branch, at x1 through the MLP branch and in all, at
  // the norms', qkv's, attention's and GELU's and fc1's inputs.
  const BufValue g_xa = builder_grad_value(b), g_x1m = builder_grad_value(b),
                 g_x1 = builder_grad_value(b), g_n1 = builder_grad_value(b),
                 g_q = builder_grad_value(b), g_at = builder_grad_value(b),
                 g_n2 = builder_grad_value(b), g_h = builder_grad_value(b),
                 g_g = builder_grad_value(b);
  if (blk->need_din) {
    builder_output(b, 0, 0, OUT_NONE);
    builder_grad(b, din, g_x1, g_xa);
    add_init(&blk->dx_sum, b, n, MEM_ACT_GRAD, 1);
  }
  snprintf(nm, sizeof nm, "%s.norm1", name);
  const BufValue n1 = builder_output(b, x, 0, OUT_RECOMPUTED);
  builder_grad(b, g_xa, g_n1, 0);
  builder_backward_reads(b, x);
  layernorm_init(&blk->norm1, b, nm, M, D);
  // qkv's input gradient is needed even without need_din: norm1's scale and shift gradients
  // come from it.
  snprintf(nm, sizeof nm, "%s.attn.qkv", name);
  const BufValue q = builder_output(b, n1, 0, 0);
  builder_grad(b, g_n1, g_q, 0);
  linear_init(&blk->qkv, b, nm, M, D, 3 * D, 1, train, 0.0f);
  if (linear_backward_reads_input(&blk->qkv)) builder_backward_reads(b, n1);
  const BufValue at = builder_output(b, q, 0, 0);
  builder_grad(b, g_q, g_at, 0);
  builder_backward_reads(b, q);
  attention_init(&blk->attn, b, N, T, D, heads);
  snprintf(nm, sizeof nm, "%s.attn.proj", name);
  const BufValue pr = builder_output(b, at, 0, 0);
  builder_grad(b, g_at, g_x1, 0);
  linear_init(&blk->proj, b, nm, M, D, D, 1, train, 0.0f);
  if (linear_backward_reads_input(&blk->proj)) builder_backward_reads(b, at);
  const BufValue x1 = builder_output(b, pr, x, OUT_IN_PLACE);
  add_init(&blk->attn_residual, b, n, builder_out_category(b), 0);
  if (train) {
    builder_output(b, 0, 0, OUT_NONE);
    builder_grad(b, g_x1, dout, g_x1m);
    add_init(&blk->dx1_sum, b, n, MEM_ACT_GRAD, 1);
  }
  snprintf(nm, sizeof nm, "%s.norm2", name);
  const BufValue n2 = builder_output(b, x1, 0, OUT_RECOMPUTED);
  builder_grad(b, g_x1m, g_n2, 0);
  builder_backward_reads(b, x1);
  layernorm_init(&blk->norm2, b, nm, M, D);
  snprintf(nm, sizeof nm, "%s.mlp.fc1", name);
  const BufValue h = builder_output(b, n2, 0, 0);
  builder_grad(b, g_n2, g_h, 0);
  linear_init(&blk->fc1, b, nm, M, D, hidden, 1, train, 0.0f);
  if (linear_backward_reads_input(&blk->fc1)) builder_backward_reads(b, n2);
  const BufValue g = builder_output(b, h, 0, OUT_IN_PLACE | OUT_RECOMPUTED);
  builder_grad(b, g_h, g_g, 0);
  builder_backward_reads(b, h);
  eltwise_init(&blk->gelu, b, ELTWISE_GELU, (size_t)M * (size_t)hidden, train);
  snprintf(nm, sizeof nm, "%s.mlp.fc2", name);
  const BufValue f = builder_output(b, g, 0, 0);
  builder_grad(b, g_g, dout, 0);
  linear_init(&blk->fc2, b, nm, M, hidden, D, 1, train, 0.0f);
  if (linear_backward_reads_input(&blk->fc2)) builder_backward_reads(b, g);
  const BufValue out = builder_output(b, f, x1, OUT_IN_PLACE);
  add_init(&blk->mlp_residual, b, n, builder_out_category(b), 0);
  blk->out = blk->mlp_residual.out;
  b->out_value = b->grad_value = 0;
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
  layernorm_forward(&blk->norm1, ctx, in);
  linear_forward(&blk->qkv, ctx, blk->norm1.out);
  attention_forward(&blk->attn, ctx, blk->qkv.out);
  linear_forward(&blk->proj, ctx, blk->attn.out);
  add_forward(&blk->attn_residual, ctx, blk->proj.out, in);
  const float *x1 = blk->attn_residual.out;
  layernorm_forward(&blk->norm2, ctx, x1);
  linear_forward(&blk->fc1, ctx, blk->norm2.out);
  eltwise_forward(&blk->gelu, ctx, blk->fc1.out);
  linear_forward(&blk->fc2, ctx, blk->gelu.out);
  add_forward(&blk->mlp_residual, ctx, blk->fc2.out, x1);
  return blk->out = blk->mlp_residual.out;
}

const float *transformer_block_backward(TransformerBlock *blk, ExecCtx *ctx, const float *dout) {
  if (blk->mode != OP_TRAIN) TL_DIE("transformer_block_backward on a block built without backward");
  // A scratch output a linear layer's backward reads is written again first (fp32; in bf16 the
  // layer reads the copy it kept).
  if (blk->gelu.calls.out_shared && linear_backward_reads_input(&blk->fc2))
    eltwise_recompute(&blk->gelu, ctx);
  linear_backward(&blk->fc2, ctx, dout);
  eltwise_backward(&blk->gelu, ctx, blk->fc2.din);
  if (blk->norm2.calls.out_shared && linear_backward_reads_input(&blk->fc1))
    layernorm_recompute(&blk->norm2, ctx);
  linear_backward(&blk->fc1, ctx, blk->gelu.din);
  layernorm_backward(&blk->norm2, ctx, blk->fc1.din);
  add_forward(&blk->dx1_sum, ctx, dout, blk->norm2.din);
  const float *dx1 = blk->dx1_sum.out;
  linear_backward(&blk->proj, ctx, dx1);
  attention_backward(&blk->attn, ctx, blk->proj.din);
  if (blk->norm1.calls.out_shared && linear_backward_reads_input(&blk->qkv))
    layernorm_recompute(&blk->norm1, ctx);
  linear_backward(&blk->qkv, ctx, blk->attn.din);
  layernorm_backward(&blk->norm1, ctx, blk->qkv.din);
  if (!blk->need_din) return NULL;
  add_forward(&blk->dx_sum, ctx, dx1, blk->norm1.din);
  return blk->din = blk->dx_sum.out;
}

void transformer_block_destroy(TransformerBlock *blk) {
  layernorm_destroy(&blk->norm1);
  linear_destroy(&blk->qkv);
  attention_destroy(&blk->attn);
  linear_destroy(&blk->proj);
  add_destroy(&blk->attn_residual);
  layernorm_destroy(&blk->norm2);
  linear_destroy(&blk->fc1);
  eltwise_destroy(&blk->gelu);
  linear_destroy(&blk->fc2);
  add_destroy(&blk->mlp_residual);
  add_destroy(&blk->dx1_sum);  // no-ops when never created (zeroed)
  add_destroy(&blk->dx_sum);
  memset(blk, 0, sizeof *blk);
}
