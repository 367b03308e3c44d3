// Pre-norm transformer block on (N, T, D) tokens, as in ViT/MAE:
//   x1  = x + proj(attention(qkv(LN1(x))))
//   out = x1 + fc2(GELU(fc1(LN2(x1))))
// qkv: Linear D -> 3D, proj: D -> D, fc1: D -> mlp_ratio*D, fc2: back to D; all Xavier-uniform
// with zero biases. Parameters are taken in the order norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
// mlp.fc2 under "<name>.".
#pragma once
#include "ops/add.h"
#include "ops/attention.h"
#include "ops/eltwise.h"
#include "ops/layernorm.h"
#include "ops/linear.h"

typedef struct {
  int N, T, D, heads, mlp_ratio, need_din;
  OpMode mode;
  LayerNorm norm1, norm2;
  Linear qkv, proj, fc1, fc2;
  Attention attn;
  Eltwise gelu;
  Add attn_residual;  // x1 (N, T, D)
  Add mlp_residual;   // out (N, T, D)
  Add dx1_sum;        // gradient at x1: from the output directly and through the MLP branch
  Add dx_sum;         // gradient at x: directly and through the attention branch (need_din)
  const float *in;    // (N, T, D), the last forward's
  float *out;         // (N, T, D) = mlp_residual.out of the last forward
  float *din;         // (N, T, D) = dx_sum.out after backward, when need_din (OP_TRAIN)
} TransformerBlock;

// With b->scratch_pool, the block takes buffers scratch_slot to scratch_slot + 3 of it: in
// training for what backward does not read where it was written, in any mode for what lives
// only inside attention's passes (see transformer_block_init); the owner finishes the pool
// (buffer_pool_finish) before the first forward.
void transformer_block_init(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din);
// Returns blk->out.
const float *transformer_block_forward(TransformerBlock *blk, DnnlCtx *ctx, const float *in);
// Fills the block's parameter gradients; returns blk->din (NULL without need_din).
const float *transformer_block_backward(TransformerBlock *blk, DnnlCtx *ctx, const float *dout);
void transformer_block_destroy(TransformerBlock *blk);
