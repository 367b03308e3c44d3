// An encoder that maps a batch of images to one feature vector each. Objectives use backbones
// only through this interface, so every objective runs on every backbone (resnet, vit).
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
  // images: (N, S, S, C) NHWC floats, S = data.image_size.
  void (*forward)(Backbone *bb, DnnlCtx *ctx, const float *images);
  // dfeature: (N, feature_dim). Fills the parameter gradients of the backbone (OP_TRAIN only).
  void (*backward)(Backbone *bb, DnnlCtx *ctx, const float *dfeature);
  void (*destroy)(Backbone *bb);
};

// Parameters (and buffers) a backbone takes from its ParamSet: the backbone built once in dry run
// on a counting set (paramset_alloc_counting), so the count is the builders' own.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels);
int backbone_feature_dim(const ModelSpec *spec);
// Patches per image for token backbones (vit), 0 for the others.
int backbone_patch_count(const ModelSpec *spec, int image_size);
// The side the network sees: [backbone] pad_to when set (images are framed with pad_value,
// centred), else the image side. config_validate keeps pad_to >= the image side.
int backbone_padded_size(const ModelSpec *spec, int image_size);

// Builds the backbone named by spec->type. Takes its parameters from b->params in a fixed order.
// Its inputs count as unnormalized (pad_value 0) until backbone_set_input_normalization.
Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
// The normalization its images went through, (x - mean_c) / std_c per channel with x in [0, 1]:
// sets pad_value to (0 - mean_c) / std_c (NULL: none, pad_value 0). Every encoder of one model
// (training, momentum copies, evaluation, export) must be told the same normalization to compute
// the same features.
void backbone_set_input_normalization(Backbone *bb, const float *mean, const float *std);
