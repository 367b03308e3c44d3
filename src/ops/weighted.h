// What convolution and linear layers share: an op whose output is its input times a weight, plus a
// bias, run as oneDNN's three passes (forward, backward data, backward weights) of a convolution or
// an inner product. It creates the passes' primitive descriptors through the seam, keeps the
// copies of the input, weights and output gradient the passes read where their type or layout
// differs from what the op is given (bf16 under [train] precision = bf16: a network whose
// activations are f32 hands them over in f32, one whose activations are bf16 (the builder's
// act_type) in bf16, and then input, output and their gradients need no copy; weight gradients
// are always f32), accumulates the weight gradients into the parameter set (ops/builder.h:
// op_grads_*) and counts each pass's analytic FLOPs. It allocates and tracks the op's outputs (one
// per call) and input gradient in the op's own fields (WeightedOp); the op takes its parameters
// and chooses the descriptors (ops/conv.c and ops/linear.c say why theirs).
#pragma once
#include "ops/builder.h"

typedef enum {
  WEIGHTED_FWD,
  WEIGHTED_BWD_DATA,
  WEIGHTED_BWD_WEIGHTS,
  WEIGHTED_PASSES
} WeightedPass;

// The tensors as the op chooses them; each is the op's to destroy (weighted_descs_destroy).
typedef struct {
  DnnlMd src_in;      // the input as the op is given it (f32, or the activations' type); its
                      // gradient as backward data writes it
  DnnlMd src;         // the input as forward (and backward weights) reads it, in the compute type
  DnnlMd dst;         // the output as the op writes it; the output gradient as it is given
  DnnlMd diff_dst;    // the output gradient as the backward passes read it, in the compute type
  DnnlMd src_f32;     // with bwd_weights_f32: the input as backward weights reads it, f32
  DnnlMd dst_f32;     // with bwd_weights_f32: the output gradient as backward weights reads it
  DnnlMd w_plain;     // the weight as the parameter set holds it, f32
  DnnlMd w_fwd;       // forward's weights in the compute type (format `any`: the primitive's)
  DnnlMd w_bwd_data;  // backward data's
  DnnlMd dw;          // backward weights' gradient, f32 (`any`, or w_plain to write it in place)
  DnnlMd bias;        // (OC) f32; NULL without a bias
} WeightedDescs;

// Destroys each descriptor once (an op may name one descriptor in two roles).
void weighted_descs_destroy(WeightedDescs *d);

typedef struct {
  int conv;             // a convolution (the geometry below), else an inner product
  dnnl_alg_kind_t alg;  // a convolution's algorithm: Winograd falls back to direct per pass
                        // where the library or CPU has no such kernel (oneDNN 3.2 removed them)
  dnnl_dims_t strides, padding;  // a convolution's, (height, width)
  int need_din;                  // backward data runs (training only)
  int bwd_weights_f32;  // backward weights reads the input and output gradient in f32, whatever
                        // the compute type (a strided convolution in bf16 where its bf16 kernel is
                        // slow, ops/conv.c): converted just before it when given in bf16
  double pass_flops;    // analytic FLOPs of one pass, each of the three the same
  double bias_flops;    // what the bias adds forward and its gradient backward
  size_t weight_count, bias_count;  // floats (bias_count 0 without a bias)
} WeightedSpec;

// The op's fields the passes read and write, by address: an op does not move once built (a buffer
// pool fills its buffers in by address too).
typedef struct {
  const char *name;  // the op's kind, for errors
  OpCalls *calls;
  float *const *weight, *const *dweight;  // the parameter set's slices
  float *const *bias, *const *dbias;      // NULL slices without a bias
  const float **in;                       // the input of the call forward or backward works on
  float **out;                            // that call's output, one of...
  float **out_slots;                      // ...one per call (op_out_alloc)
  size_t out_bytes;                       // one output's
  float **din;                            // the input gradient, with need_din (op_din_alloc)
} WeightedOp;

// The WeightedOp of an op whose fields have these names (Conv2d, Linear).
#define WEIGHTED_OP(l, kind, bytes_per_out)                                                 \
  {                                                                                         \
    .name = (kind), .calls = &(l)->calls, .weight = &(l)->weight, .dweight = &(l)->dweight, \
    .bias = &(l)->bias, .dbias = &(l)->dbias, .in = &(l)->in, .out = &(l)->out,             \
    .out_slots = &(l)->out_slots, .out_bytes = (bytes_per_out), .din = &(l)->din            \
  }

typedef struct Weighted Weighted;

// The op's outputs and the passes the builder's mode needs (backward weights in training, backward
// data when spec->need_din too), created once; tells the parameter set the gradients the op's
// calls will bring. Buffers are tagged with the builder's component.
Weighted *weighted_create(Builder *b, const WeightedSpec *spec, const WeightedDescs *d,
                          const WeightedOp *op);
// out = in x weight + bias, the op's next call.
void weighted_forward(Weighted *w, ExecCtx *ctx, const float *in);
// The weight (and bias) gradient of the latest call not yet gone back, into the set's slices; then,
// with need_din, the input gradient.
void weighted_backward(Weighted *w, ExecCtx *ctx, const float *dout);
// Whether the pass ran oneDNN's Winograd kernel.
int weighted_winograd(const Weighted *w, WeightedPass pass);
// Whether backward weights reads the input forward was given (or converts it again just before),
// rather than a converted copy forward kept.
int weighted_reads_input(const Weighted *w);
// Whether backward weights writes the gradient in a layout of its own and reorders it into the
// parameter's.
int weighted_grad_reordered(const Weighted *w);
void weighted_destroy(Weighted *w);
