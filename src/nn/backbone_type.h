// What a backbone is, for the backbones themselves (resnet, vit) and for nn/backbone.h, which
// builds them: the Backbone interface and the side of the images it sees. Kept apart from the
// builder so that a backbone's header needs nothing that names every backbone.
#pragma once
#include "nn/model_spec.h"
#include "ops/builder.h"

enum { BACKBONE_MAX_CHANNELS = 3 };

typedef struct Backbone Backbone;
struct Backbone {
  int N;         // images per forward call (fixed at creation)
  int channels;  // C of the images
  int feature_dim;
  float *feature;  // (N, feature_dim), owned by the backbone
  // (C) what pad_to frames the images with. [backbone] pad_fill = black: black as the input
  // normalization maps it, as if the raw image were padded before normalizing (torchvision's
  // Pad(fill=0)); normalized black is not 0 (0 is the data's mean grey), so neither a
  // convolution's zero padding nor a zero fill can stand in for it. pad_fill = mean: 0. 0 until
  // backbone_set_input_normalization says otherwise.
  float pad_value[BACKBONE_MAX_CHANNELS];
  int pad_mean;  // pad_fill = mean
  // Its parameters in its builder's set: the first one's offset and how many floats (buffers
  // included) it took. An objective's online backbone is built first, at 0
  // (objectives/objective.h).
  size_t param_offset, param_floats;
  // images: (N, S, S, C) NHWC floats, S = data.image_size.
  void (*forward)(Backbone *bb, ExecCtx *ctx, const float *images);
  // dfeature: (N, feature_dim). Fills the parameter gradients of the backbone (OP_TRAIN only).
  void (*backward)(Backbone *bb, ExecCtx *ctx, const float *dfeature);
  void (*destroy)(Backbone *bb);
};

// The side the network sees: [backbone] pad_to when set (images are framed with pad_value,
// centred), else the image side. config_validate keeps pad_to >= the image side.
static inline int backbone_padded_size(const ModelSpec *spec, int image_size) {
  return spec->pad_to ? spec->pad_to : image_size;
}
