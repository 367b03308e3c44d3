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
  // norm2 Q -> A, fc1 -> B, GELU in place in B, fc2 -> A, residual Q + A -> P; so only B is
  // ever as wide as the MLP's hidden layer.
  const int slot = b->grad_slot, out = b->out_slot;
  const int Q = (slot + 1) % 4, A = (slot + 2) % 4, B = (slot + 3) % 4;
  const int oQ = out < 0 ? -1 : (out + 1) % 4, oA = out < 0 ? -1 : (out + 2) % 4,
            oB = out < 0 ? -1 : (out + 3) % 4;
  // With a scratch pool (b->scratch_pool), in training, what backward does not read where it
  // was written lives in two buffers shared by every block and call: the norms' outputs and the
  // projections back to D (proj, fc2) in buffer S, GELU's output in buffer S + 1. proj and fc2
  // are read once, by the residual sums. The norms' and GELU's outputs are read by linear layers
  // whose backward either reads a converted copy of its own (a compute type other than f32) or
  // gets the output recomputed first (transformer_block_backward); [train] recompute = 0 keeps
  // them instead. What stays per block and call: the residual stream (x1, out), qkv,
  // attention's probabilities and output, and fc1's output. Attention's inner buffers
  // (ops/builder.h) take S + 2 and S + 3, in any mode. Each op's slot is set before it is built,
  // as its gradient and output slots are; -1: its own buffer.
  const int scratch_in = b->scratch_slot, inner_in = b->inner_slot;
  const int S = b->scratch_pool ? scratch_in : -1;
  const int s0 = S, s1 = S < 0 ? -1 : S + 1, inner = S < 0 ? -1 : S + 2;
  const int copies = dnnl_ctx_compute_type(b->ctx) != dnnl_f32;  // what linear_init decides
  const int r0 = b->ctx->recompute || copies ? s0 : -1, r1 = b->ctx->recompute || copies ? s1 : -1;
  snprintf(nm, sizeof nm, "%s.norm1", name);
  b->grad_slot = B, b->out_slot = oA, b->scratch_slot = r0;
  layernorm_init(&blk->norm1, b, nm, M, D);
  // qkv's input gradient is needed even without need_din: norm1's scale and shift gradients
  // come from it.
  snprintf(nm, sizeof nm, "%s.attn.qkv", name);
  b->grad_slot = A, b->out_slot = oB, b->scratch_slot = -1;
  linear_init(&blk->qkv, b, nm, M, D, 3 * D, 1, train, 0.0f);
  b->grad_slot = B, b->out_slot = oA, b->scratch_slot = -1, b->inner_slot = inner;
  attention_init(&blk->attn, b, N, T, D, heads);
  snprintf(nm, sizeof nm, "%s.attn.proj", name);
  b->grad_slot = A, b->out_slot = oB, b->scratch_slot = s0;
  linear_init(&blk->proj, b, nm, M, D, D, 1, train, 0.0f);
  b->out_slot = oQ, b->scratch_slot = -1;
  add_init(&blk->attn_residual, b, n, builder_out_category(b), 0);
  snprintf(nm, sizeof nm, "%s.norm2", name);
  b->grad_slot = B, b->out_slot = oA, b->scratch_slot = r0;
  layernorm_init(&blk->norm2, b, nm, M, D);
  snprintf(nm, sizeof nm, "%s.mlp.fc1", name);
  b->grad_slot = A, b->out_slot = oB, b->scratch_slot = -1;
  linear_init(&blk->fc1, b, nm, M, D, hidden, 1, train, 0.0f);
  b->grad_slot = B, b->out_slot = oB, b->scratch_slot = r1;
  eltwise_init(&blk->gelu, b, ELTWISE_GELU, (size_t)M * (size_t)hidden, train);
  snprintf(nm, sizeof nm, "%s.mlp.fc2", name);
  b->grad_slot = A, b->out_slot = oA, b->scratch_slot = s0;
  linear_init(&blk->fc2, b, nm, M, hidden, D, 1, train, 0.0f);
  b->out_slot = out, b->scratch_slot = -1;
  add_init(&blk->mlp_residual, b, n, builder_out_category(b), 0);
  b->scratch_slot = scratch_in, b->inner_slot = inner_in;
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
