#include "nn/transformer.h"

#include <stdio.h>
#include <string.h>

void transformer_block_init(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din) {
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
  // With a gradient pool (b->grad_pool), the block's input gradients share four buffers: the
  // block's incoming and outgoing gradients are in the builder's slot, dx1 (live from the MLP
  // branch's sum to the block's) in Q, and the ops of each branch alternate between A and B.
  // Without backward, with an output pool (b->out_pool), the outputs rotate the same way from the
  // builder's out_slot: norm1 P -> A, qkv -> B, attention -> A, proj -> B, residual P + B -> Q,
  // norm2 Q -> A, fc1 -> B, GELU -> A, fc2 -> B, residual Q + B -> P.
  const int slot = b->grad_slot, out = b->out_slot;
  const int Q = (slot + 1) % 4, A = (slot + 2) % 4, B = (slot + 3) % 4;
  const int oQ = out < 0 ? -1 : (out + 1) % 4, oA = out < 0 ? -1 : (out + 2) % 4,
            oB = out < 0 ? -1 : (out + 3) % 4;
  snprintf(nm, sizeof nm, "%s.norm1", name);
  b->grad_slot = B, b->out_slot = oA;
  layernorm_init(&blk->norm1, b, nm, M, D);
  // qkv's input gradient is needed even without need_din: norm1's scale and shift gradients
  // come from it.
  snprintf(nm, sizeof nm, "%s.attn.qkv", name);
  b->grad_slot = A, b->out_slot = oB;
  linear_init(&blk->qkv, b, nm, M, D, 3 * D, 1, train, 0.0f);
  b->grad_slot = B, b->out_slot = oA;
  attention_init(&blk->attn, b, N, T, D, heads);
  snprintf(nm, sizeof nm, "%s.attn.proj", name);
  b->grad_slot = A, b->out_slot = oB;
  linear_init(&blk->proj, b, nm, M, D, D, 1, train, 0.0f);
  b->out_slot = oQ;
  add_init(&blk->attn_residual, b, n, builder_out_category(b), 0);
  snprintf(nm, sizeof nm, "%s.norm2", name);
  b->grad_slot = B, b->out_slot = oA;
  layernorm_init(&blk->norm2, b, nm, M, D);
  snprintf(nm, sizeof nm, "%s.mlp.fc1", name);
  b->grad_slot = A, b->out_slot = oB;
  linear_init(&blk->fc1, b, nm, M, D, hidden, 1, train, 0.0f);
  b->grad_slot = B, b->out_slot = oA;
  eltwise_init(&blk->gelu, b, ELTWISE_GELU, (size_t)M * (size_t)hidden, train);
  snprintf(nm, sizeof nm, "%s.mlp.fc2", name);
  b->grad_slot = A, b->out_slot = oB;
  linear_init(&blk->fc2, b, nm, M, hidden, D, 1, train, 0.0f);
  b->out_slot = out;
  add_init(&blk->mlp_residual, b, n, builder_out_category(b), 0);
  blk->out = blk->mlp_residual.out;
  b->grad_slot = slot;
  if (!train) return;
  b->grad_slot = Q;
  add_init(&blk->dx1_sum, b, n, MEM_ACT_GRAD, 1);
  b->grad_slot = slot;
  if (blk->need_din) add_init(&blk->dx_sum, b, n, MEM_ACT_GRAD, 1);
}

const float *transformer_block_forward(TransformerBlock *blk, DnnlCtx *ctx, const float *in) {
  blk->in = in;
  layernorm_forward(&blk->norm1, ctx, in);
  linear_forward(&blk->qkv, ctx, blk->norm1.out);
  attention_forward(&blk->attn, ctx, blk->qkv.out);
  linear_forward(&blk->proj, ctx, blk->attn.out);
  add_forward(&blk->attn_residual, ctx, in, blk->proj.out);
  const float *x1 = blk->attn_residual.out;
  layernorm_forward(&blk->norm2, ctx, x1);
  linear_forward(&blk->fc1, ctx, blk->norm2.out);
  eltwise_forward(&blk->gelu, ctx, blk->fc1.out);
  linear_forward(&blk->fc2, ctx, blk->gelu.out);
  add_forward(&blk->mlp_residual, ctx, x1, blk->fc2.out);
  return blk->out = blk->mlp_residual.out;
}

const float *transformer_block_backward(TransformerBlock *blk, DnnlCtx *ctx, const float *dout) {
  if (blk->mode != OP_TRAIN) TL_DIE("transformer_block_backward on a block built without backward");
  linear_backward(&blk->fc2, ctx, dout);
  eltwise_backward(&blk->gelu, ctx, blk->fc2.din);
  linear_backward(&blk->fc1, ctx, blk->gelu.din);
  layernorm_backward(&blk->norm2, ctx, blk->fc1.din);
  add_forward(&blk->dx1_sum, ctx, dout, blk->norm2.din);
  const float *dx1 = blk->dx1_sum.out;
  linear_backward(&blk->proj, ctx, dx1);
  attention_backward(&blk->attn, ctx, blk->proj.din);
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
