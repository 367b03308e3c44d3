// A change of data type between two ops (a oneDNN reorder): forward converts the input into the
// output's type, backward converts the output gradient back into the input's. A network whose
// activations are bf16 between its layers converts once at each edge where it meets f32 code (a
// transformer stack: the tokens enter f32 from the patch embedding and leave f32 to the pooling
// and the heads). Counts no FLOPs.
//
// An op never built (zeroed) passes its input through, so a network calls it whether or not its
// activations needed the conversion.
#pragma once
#include "ops/builder.h"

typedef struct {
  size_t n;                    // elements; the tensor is treated as flat
  size_t in_bytes, out_bytes;  // of the input (and its gradient), of the output (and its gradient)
  int need_din;
  OpCalls calls;
  float *out;  // (n) in `to`, the call forward works on; one per call in out_slots
  float *out_slots;
  float *din;  // (n) in `from`, OP_TRAIN with need_din
  DnnlReorder forward, backward;
} Convert;

void convert_init(Convert *l, Builder *b, size_t n, dnnl_data_type_t from, dnnl_data_type_t to,
                  int need_din);
// Declared to b's pool as its next op and built: the conversion of a network's f32 input (a
// buffer outside the pool) into b->act_type, whose input gradient is the value `din` and whose
// backward reads the value it sets *dout to (the next op's input gradient). Returns its output
// value.
BufValue convert_in_init(Convert *l, Builder *b, size_t n, BufValue din, BufValue *dout);
// Declared and built likewise: the conversion of the value `in` (b->act_type) into an f32 output
// of its own, read outside the pool; its backward reads the f32 gradient given it and writes the
// value `din`.
void convert_out_init(Convert *l, Builder *b, size_t n, BufValue in, BufValue din);
// Returns the converted output (l->out), or `in` when the op was never built.
const float *convert_forward(Convert *l, ExecCtx *ctx, const float *in);
// Returns the input gradient (l->din), or `dout` when the op was never built.
const float *convert_backward(Convert *l, ExecCtx *ctx, const float *dout);
void convert_destroy(Convert *l);
