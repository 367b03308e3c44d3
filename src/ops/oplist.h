// A module as one list of op nodes (ggml's design): a node records its op kind, its arguments and
// its inputs (the list's input or earlier nodes' outputs); an op kind (OpKind) says how to build,
// run forward and backward, recompute and destroy it, what its backward reads and whether it may
// write over its input. One build walks the list and declares everything to the builder's
// BufferPool (ops/buffer_pool.h): each node's output, the gradient each backward writes and
// reads, where a value read by two nodes has its gradient summed (an Add the list makes), what a
// backward reads (kept, or recomputed under [train] recompute when the kind can write its output
// again and a reader in the same list may read it in backward). Forward walks the list, backward
// walks it in reverse (recomputing before a backward that reads a recomputed value), destroy
// walks it once.
//
// A module whose pieces are separate lists (a ResNet's stem, blocks and pooling) chains them:
// a list recomputes only for readers in the list, so a value a later list reads is kept.
#pragma once
#include "ops/add.h"
#include "ops/builder.h"

// A tensor's shape: activations (N, H, W, C); tokens (N, T, D) are (N, T, 1, D); the ops over
// rows (linear, layernorm) take N*H*W rows of C features.
typedef struct {
  int N, H, W, C;
} OpShape;

static inline size_t op_shape_elems(OpShape s) { return (size_t)s.N * s.H * s.W * s.C; }

enum {
  OP_ARG_OWN_OUTPUT = 1,  // the output outlives the list's pass (or is read outside it)
  OP_ARG_INPUT_F32 = 2,   // the node reads f32 from outside the network (the images)
  OP_ARG_KEEP = 4,        // a reader's backward reads the output kept, never written again
  OP_ARG_OUTPUT_F32 = 8,  // convert: the node writes f32 for code outside the network
};

// What a node is built with besides its input shapes; each kind reads the fields it names.
typedef struct {
  const char *name;         // its parameters' prefix (conv, batchnorm, layernorm, linear)
  int channels;             // output channels (conv) or features (linear)
  int kernel, stride, pad;  // conv, maxpool
  int groups;               // conv: channels convolved in that many groups apart (0: 1)
  int has_bias;             // conv, linear
  int fuse_relu;            // batchnorm
  int heads;                // attention
  float init_std;           // linear (0: Xavier-uniform)
  float scale_init;         // layerscale: every channel's factor at the start
  unsigned flags;           // OP_ARG_*
} OpArgs;

typedef struct OpKind {
  const char *name;
  size_t size;  // of the op's struct
  int inputs;   // 1 or 2
  // Builds the op for its input shapes (in[0], in[1]) and returns its output's.
  OpShape (*init)(void *op, Builder *b, const OpArgs *a, const OpShape *in, int need_din);
  void (*forward)(void *op, ExecCtx *ctx, const float *in0, const float *in1);
  // NULL: the gradient at the output reaches every input unchanged (a sum).
  void (*backward)(void *op, ExecCtx *ctx, const float *dout);
  // Writes the output of the call backward takes next again (NULL: it cannot).
  void (*recompute)(void *op, ExecCtx *ctx);
  void (*destroy)(void *op);
  float *(*out)(void *op);  // the last forward call's output
  float *(*din)(void *op);  // the input gradient backward wrote
  const OpCalls *(*calls)(const void *op);
  // Whether the built op's backward reads its input (NULL: never), or its output.
  int (*backward_reads_input)(const void *op);
  int backward_reads_output;
  // Whether a backward of this kind may read its input at all: a recomputable output read by one
  // is prepared for recomputing before the reader is built.
  int may_read_input;
  unsigned (*out_flags)(const Builder *b);  // OUT_IN_PLACE, OUT_READS_LATE (NULL: none)
} OpKind;

extern const OpKind op_conv, op_batchnorm, op_relu, op_gelu, op_add, op_layernorm, op_linear,
    op_layerscale, op_attention, op_maxpool, op_avgpool, op_convert;

enum { OPLIST_INPUT = 0 };  // a node's input: the list's input; nodes are 1, 2, ... in order

typedef struct {
  const OpKind *kind;
  void *op;
  int in[2];
  OpArgs args;
  char name[64];
  OpShape shape;            // of the output, once built
  const float *partial[2];  // in backward: the gradient this node sends each input
} OpNode;

// A value: the list's input (0) or node k's output (k). Read by up to two nodes.
typedef struct {
  int readers, reader[2], slot[2];
  Add *sum;  // in training, when two nodes read it: the sum of their gradients
} OpValue;

typedef struct {
  int n, cap;
  OpNode *nodes;    // [1..n]
  OpValue *values;  // [0..n], once built
  int need_din;     // the gradient at the list's input is wanted
  const float *in;  // forward's input
} OpList;

// Appends a node reading in0 (and in1 for a two-input kind); returns its id. Nothing is built
// until oplist_build.
int oplist_add(OpList *l, const OpKind *kind, int in0, int in1, OpArgs args);

// The values the list is declared with to the builder's pool: x, its input (0: none of the
// pool's); dout, the gradient reaching its output; din, where its input gradient goes.
typedef struct {
  BufValue x, dout, din;
} OpListValues;

// Builds every node for input shape `in` (need_din: the input's gradient is wanted, in training)
// and declares them to b->pool; returns the output's value. b is left as it was.
BufValue oplist_build(OpList *l, Builder *b, OpShape in, int need_din, OpListValues v);
// Builds lists one after another, each reading the previous one's output, the first `x` with
// the input gradient `din` (wanted: need_din), the last's output gradient `dout`; returns the
// last output's value and its shape in *shape.
BufValue oplist_build_chain(OpList *lists, int n, Builder *b, OpShape *shape, int need_din,
                            OpListValues v);

OpShape oplist_shape(const OpList *l);  // the output's
float *oplist_out(const OpList *l);     // the output of the last forward call
void *oplist_op(const OpList *l, int node);
// Runs the nodes in order; returns the output (the last node's).
float *oplist_forward(OpList *l, ExecCtx *ctx, const float *in);
// Runs the nodes' backwards in reverse from dout at the output; returns the input's gradient
// (NULL when not wanted).
const float *oplist_backward(OpList *l, ExecCtx *ctx, const float *dout);
void oplist_destroy(OpList *l);

// A chain of `n` lists built by oplist_build_chain, each reading the previous one's output: forward
// through all of them (returns the last output), backward through them in reverse (returns the
// first input's gradient, NULL when not wanted), and destroy.
const float *oplist_chain_forward(OpList *lists, int n, ExecCtx *ctx, const float *in);
const float *oplist_chain_backward(OpList *lists, int n, ExecCtx *ctx, const float *dout);
void oplist_chain_destroy(OpList *lists, int n);
