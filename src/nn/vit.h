// Vision Transformer backbone (ViT/MAE style) on NHWC images.
//
// images (N, S, S, C) -> framed with base.pad_value (normalized black) to P_S = pad_to (centered:
// floor((P_S - S) / 2) rows and columns above and to the left, the rest below and to the right)
// -> patches (N, G*G, P*P*C), G = P_S / P -> patch embedding Linear(P*P*C -> D) (a convolution with
// kernel = stride = P) -> + fixed 2-D sin-cos position embedding -> [cls token first, when
// pool = cls] -> depth pre-norm transformer blocks -> final LayerNorm = `tokens` ->
// `feature` (N, D): the cls token (pool = cls) or the mean of the patch tokens (pool = mean).
//
// Patch order, shared with MAE's reconstruction targets (vit_patchify): patches row-major over
// the G x G grid (index gy*G + gx), each patch's P*P*C values row-major as (py, px, c). The cls
// token exists exactly when pool = cls; it is a parameter (normal, std 0.02) with a zero position
// embedding.
//
// Visible-only encoding (MAE): a Vit made by vit_create_masked encodes n_keep < G*G patches per
// image, chosen per call by keep_idx. Patches are gathered before the embedding (a per-patch
// linear map, so this equals embedding everything and gathering after the position embedding),
// hence every op in the encoder runs on T = has_cls + n_keep tokens and never sees a masked
// patch.
//
// Precision: under [train] precision = bf16 the blocks and the final LayerNorm keep their
// activations and gradients in bf16 (act_type; f32 in evaluation). The embedded tokens are
// converted into it before the first block, the final LayerNorm's output back to f32 `tokens`
// (ops/convert.h): patch embedding, positions, cls token and pooling stay f32.
//
// FLOPs: the ops' own counts, plus N*n_keep*D position adds (forward), N*T*D for mean pooling
// (each way) and N*D for the cls token's gradient sum.
//
// Parameters are taken in the order patch_embed.weight, patch_embed.bias, cls_token (pool = cls),
// blocks.0 ... blocks.{depth-1} (see transformer.h), norm.gamma, norm.beta.
#pragma once
#include "nn/backbone_type.h"
#include "nn/transformer.h"
#include "ops/oplist.h"

typedef struct {
  Backbone base;  // first member: a Vit * is a Backbone *
  int N, image_size, channels;
  int padded_size;                  // P_S
  int pad_before;                   // frame rows (and columns) above (left of) the image
  int patch_size, grid, n_patches;  // P, G, G*G
  int patch_dim;                    // P*P*C
  int n_keep;                       // patches encoded per image (n_patches unless masked)
  int has_cls;                      // pool = cls
  int T;                            // tokens per image in the blocks: has_cls + n_keep
  int D, depth;
  OpMode mode;
  MemComponent comp;
  dnnl_data_type_t act_type;  // of the blocks' and the final norm's activations and gradients
  float *pos_embed;           // (G*G, D) fixed sin-cos table, not a parameter
  float *cls, *dcls;          // (D), when has_cls
  const ParamSet *params;     // the block cls comes from: told when dcls is ready
  // The last forward call's patches, embedded tokens and feature; one of each per call (the
  // module's OpCalls, ops/builder.h) in the *_slots buffers.
  OpCalls calls;
  float *patches;      // (N, n_keep, P*P*C) the patches encoded by the last forward
  Linear patch_embed;  // (N*n_keep, P*P*C) -> (N*n_keep, D)
  float *embedded;     // (N, T, D) the tokens, f32
  OpList entry;        // embedded converted into act_type, the first block's input (bf16 only)
  float *patches_slots, *embedded_slots, *feature_slots;
  TransformerBlock *blocks;  // (depth)
  BufferPool buffers;        // the blocks' and final norm's planned buffers (ops/buffer_pool.h)
  OpList head;      // the final LayerNorm after the blocks (and, in bf16, its output into f32)
  LayerNorm *norm;  // head's
  float *tokens;    // (N, T, D) final-LN output in f32 = head's output; cls first when has_cls
  float *feature;   // (N, D) = base.feature
  float *dtokens_from_feature;  // (N, T, D) OP_TRAIN: the Backbone backward's token gradient
  float *dpatch_tokens;         // (N*n_keep, D) OP_TRAIN with cls: patch rows of the gradient
} Vit;

// Checks a vit spec against the data geometry; -1 with tl_last_error() saying what is wrong.
int vit_check_spec(const ModelSpec *spec, int image_size, int channels);
// G*G: patches per image after padding to backbone_padded_size.
int vit_patch_count(const ModelSpec *spec, int image_size);

// The Backbone: forward/backward encode all G*G patches. NULL (tl_last_error) on a bad spec.
Backbone *vit_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
// An encoder for n_keep visible patches per image (1 <= n_keep <= G*G); drive it with
// vit_forward_visible / vit_backward_tokens (its Backbone forward refuses when n_keep < G*G).
Vit *vit_create_masked(const ModelSpec *spec, Builder *b, int N, int image_size, int channels,
                       int n_keep);

// keep_idx (N, n_keep): patch indices (0 <= i < G*G) of each image, in the order they become
// tokens; NULL means all patches in grid order (only when n_keep = G*G). Fills tokens and feature.
void vit_forward_visible(Vit *v, ExecCtx *ctx, const float *images, const int *keep_idx);
// dtokens (N, T, D): gradient with respect to `tokens`. Fills the parameter gradients.
void vit_backward_tokens(Vit *v, ExecCtx *ctx, const float *dtokens);

// images (N, S, S, C) -> patches (N, G*G, P*P*C) in the order above (padding included).
void vit_patchify(const Vit *v, const float *images, float *patches);

// MAE's get_2d_sincos_pos_embed without the cls row: table (grid*grid, dim), dim % 4 == 0.
// Row gy*grid + gx = [sin(gx w_k), cos(gx w_k), sin(gy w_k), cos(gy w_k)] with
// w_k = 10000^(-k / (dim/4)), k = 0 .. dim/4 - 1, each group dim/4 wide.
void vit_sincos_pos_embed(float *table, int grid, int dim);
