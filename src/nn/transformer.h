// Pre-norm transformer block on (N, T, D) tokens, as in ViT/MAE:
//   x1  = x + proj(attention(qkv(LN1(x))))
//   out = x1 + fc2(GELU(fc1(LN2(x1))))
// qkv: Linear D -> 3D, proj: D -> D, fc1: D -> mlp_ratio*D, fc2: back to D; all Xavier-uniform
// with zero biases. Parameters are taken in the order norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
// mlp.fc2 under "<name>.".
#pragma once
#include "ops/attention.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/oplist.h"

typedef struct {
  int N, T, D, heads, mlp_ratio, need_din;
  OpMode mode;
  OpList ops;  // norm1, qkv, attention, proj, x1 = x + proj, norm2, fc1, GELU, fc2, out = x1 + fc2
  // The list's ops that hold the block's parameters, by name (tests, vit's checks).
  LayerNorm *norm1, *norm2;
  Linear *qkv, *proj, *fc1, *fc2;
  Attention *attn;
  const float *in;  // (N, T, D), the last forward's
  float *out;       // (N, T, D), the last forward's output
  float *din;       // (N, T, D), the input gradient after backward, when need_din (OP_TRAIN)
} TransformerBlock;

// A block whose ops own their buffers (no pool): the pool's values come with
// transformer_stack_init.
void transformer_block_init(TransformerBlock *blk, Builder *b, const char *name, int N, int T,
                            int D, int heads, int mlp_ratio, int need_din);
// `depth` blocks named PREFIX.i, declared to b->pool and built (see transformer.c): x, the first
// block's input value (0: a buffer of its own); dout, the gradient value reaching the last
// block's output; din, where the first block's input gradient goes. Returns the last block's
// output value. The owner finishes the pool (buffer_pool_finish) before the first forward.
BufValue transformer_stack_init(TransformerBlock *blocks, int depth, Builder *b, const char *prefix,
                                int N, int T, int D, int heads, int mlp_ratio, BufValue x,
                                BufValue dout, BufValue din);
// Returns blk->out.
const float *transformer_block_forward(TransformerBlock *blk, ExecCtx *ctx, const float *in);
// Fills the block's parameter gradients; returns blk->din (NULL without need_din).
const float *transformer_block_backward(TransformerBlock *blk, ExecCtx *ctx, const float *dout);
void transformer_block_destroy(TransformerBlock *blk);
