// An encoder that maps a batch of images to one feature vector each. Objectives use backbones
// only through this interface, so every objective runs on every backbone (resnet, vit).
#pragma once
#include "config.h"
#include "ops/builder.h"

typedef struct Backbone Backbone;
struct Backbone {
  const char *kind;  // "resnet" | "vit"
  int N;             // images per forward call (fixed at creation)
  int feature_dim;
  float *feature;  // (N, feature_dim), owned by the backbone
  // images: (N, S, S, C) NHWC floats, S = data.image_size.
  void (*forward)(Backbone *bb, DnnlCtx *ctx, const float *images);
  // dfeature: (N, feature_dim). Fills the parameter gradients of the backbone (OP_TRAIN only).
  void (*backward)(Backbone *bb, DnnlCtx *ctx, const float *dfeature);
  void (*destroy)(Backbone *bb);
};

// Parameters (and buffers) a backbone takes from its ParamSet, computed from the spec alone.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels);
int backbone_feature_dim(const ModelSpec *spec);
// Patches per image for token backbones (vit), 0 for the others.
int backbone_patch_count(const ModelSpec *spec, int image_size);
// The side the network sees: [backbone] pad_to when set (images are zero-padded, centred), else
// the image side. config_validate keeps pad_to >= the image side.
int backbone_padded_size(const ModelSpec *spec, int image_size);

// Builds the backbone named by spec->type. Takes its parameters from b->params in a fixed order.
Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
