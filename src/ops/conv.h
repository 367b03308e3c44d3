// 2-D convolution (oneDNN convolution, forward + backward data + backward weights).
// N = batch, IC/OC = channels, IH/IW and OH/OW = spatial sizes, K = square kernel, groups: the
// channels split into that many groups convolved apart (IC = OC = groups: depthwise).
#pragma once
#include "ops/builder.h"
#include "ops/weighted.h"

typedef struct {
  int N, IC, IH, IW, OC, OH, OW, K, stride, pad, has_bias, need_din;
  int groups;    // 1, or oneDNN's grouped convolution (both channel counts divisible by it)
  int winograd;  // forward runs oneDNN's Winograd kernel ([train] conv_algorithm, ops/conv.c)
  OpMode mode;
  MemComponent comp;
  float *weight, *dweight;  // (OC, IC / groups, K, K) plain oihw (goihw: the same bytes)
  float *bias, *dbias;      // (OC), when has_bias
  OpCalls calls;
  const float *in;  // (N, IH, IW, IC), the call forward or backward works on
  float *out;       // (N, OH, OW, OC), the same call's; one per call in out_slots
  float *out_slots;
  float *din;        // (N, IH, IW, IC), when need_din
  Weighted *passes;  // primitives, memories, copies in the compute type and layouts
} Conv2d;

// Weights initialized Kaiming-normal (fan_in, ReLU gain); bias zero. OH = (IH + 2*pad - K)/stride
// + 1.
void conv2d_init(Conv2d *l, Builder *b, const char *name, int N, int IC, int IH, int IW, int OC,
                 int K, int stride, int pad, int has_bias, int need_din);
// The same over `groups` groups of channels (PyTorch's Conv2d groups): output channel o sees input
// channels g IC/G ... (g + 1) IC/G - 1 of its group g = o / (OC/G); Kaiming's fan_in is IC/G K K.
void conv2d_init_grouped(Conv2d *l, Builder *b, const char *name, int N, int IC, int IH, int IW,
                         int OC, int K, int stride, int pad, int groups, int has_bias,
                         int need_din);
void conv2d_forward(Conv2d *l, ExecCtx *ctx, const float *in);
void conv2d_backward(Conv2d *l, ExecCtx *ctx, const float *dout);  // dweight, dbias, din
// Whether backward reads the f32 input forward was given (its weight gradient's source), rather
// than a converted copy forward kept (a compute type other than f32, at stride 1).
int conv2d_backward_reads_input(const Conv2d *l);
// Whether a convolution `b` would build over IC input channels reads the images (nhwc) in a
// blocked network, rather than an activation in the network's layout.
static inline int conv_image_input(const Builder *b, int IC) {
  return builder_layout(b) != dnnl_nhwc && IC % 16 != 0;
}
// Whether a KxK convolution `b` would build at `stride` computes its weight gradient in f32 under a
// bf16 compute type: a strided one wider than 1x1, whose bf16 kernel was measured far slower
// (ops/conv.c).
static inline int conv_bwd_weights_f32(const Builder *b, int K, int stride) {
  return builder_compute_type(b) != dnnl_f32 && stride > 1 && K > 1;
}
// The same as conv2d_backward_reads_input, for a KxK convolution `b` would build over IC channels
// at `stride`, before it is built: its input is given in the compute type and the layout its kernel
// reads (not an f32 image under bf16, nor a 3-channel image a blocked network converts), or its
// weight gradient is computed in f32 from it.
static inline int conv2d_will_read_input(const Builder *b, int IC, int K, int stride) {
  return (builder_input_type(b) == builder_compute_type(b) &&
          !(conv_image_input(b, IC) && IC != 1)) ||
         conv_bwd_weights_f32(b, K, stride);
}
void conv2d_destroy(Conv2d *l);
// [train] conv_algorithm: "auto", "direct" or "winograd" (the config checked the text).
ConvAlgorithm conv_algorithm_parse(const char *text);
