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
// Returns the converted output (l->out), or `in` when the op was never built.
const float *convert_forward(Convert *l, ExecCtx *ctx, const float *in);
// Returns the input gradient (l->din), or `dout` when the op was never built.
const float *convert_backward(Convert *l, ExecCtx *ctx, const float *dout);
void convert_destroy(Convert *l);
