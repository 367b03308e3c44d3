// An encoder that maps a batch of images to one feature vector each. Objectives use backbones
// only through this interface, so every objective runs on every backbone. A backbone family
// (resnet, vit) is its own files plus one row of the registry (backbone.c): its BackboneDef.
#pragma once
#include <stddef.h>

#include "config_keys.h"
#include "nn/backbone_type.h"

typedef struct {
  // `[backbone] type`, what it is, its own rows of [backbone] and their checks against the
  // images' side (config_keys.h): config reads and validates a model file through these.
  const BackboneSection *settings;
  // Builds it for N images of side image_size. Takes its parameters from b->params in a fixed
  // order. NULL + tl_fail when the spec cannot describe it (config_validate checks first).
  Backbone *(*create)(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
  int (*feature_dim)(const ModelSpec *spec);
  // Patches per image (token backbones); NULL: none, 0.
  int (*patch_count)(const ModelSpec *spec, int image_size);
  // 1: it can encode a subset of its patches (mae's visible-only encoder, nn/vit.h).
  int masks_tokens;
  // The spec of an instance that sees images of another side (dino's local crops); NULL: the
  // same spec serves any side.
  ModelSpec (*spec_at_size)(const ModelSpec *spec, int image_size);
  // What summarizes its output into the feature, as an export states it (`tally export`).
  const char *(*pool_name)(const ModelSpec *spec);
  // An export's name for the family's parameter `name` under PyTorch's conventions for it
  // (torchvision's module names), into out (cap bytes); returns 0, out untouched, for a name
  // that is not its own (a head's) or that it exports as it is. NULL: every name as it is.
  int (*torch_name)(const char *name, char *out, size_t cap);
} BackboneDef;

// The family named by spec->type (config_validate has checked it is registered).
const BackboneDef *backbone_def(const ModelSpec *spec);
// Gives config the families' model-file sections (config_register_backbones); at startup,
// before any configuration is read (objective_register_config calls it).
void backbone_register_config(void);

// Parameters (and buffers) a backbone takes from its ParamSet: the backbone built once in dry run
// on a counting set (paramset_alloc_counting), so the count is the builders' own.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels);
int backbone_feature_dim(const ModelSpec *spec);
// Patches per image for token backbones (vit), 0 for the others.
int backbone_patch_count(const ModelSpec *spec, int image_size);
// The spec for an instance of the same network at image side `image_size` (BackboneDef).
ModelSpec backbone_spec_at_size(const ModelSpec *spec, int image_size);

// Builds the backbone named by spec->type. Takes its parameters from b->params in a fixed order.
// Its inputs count as unnormalized (pad_value 0) until backbone_set_input_normalization.
Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
// The normalization its images went through, (x - mean_c) / std_c per channel with x in [0, 1]:
// sets pad_value to (0 - mean_c) / std_c (NULL: none, pad_value 0). Every encoder of one model
// (training, momentum copies, evaluation, export) must be told the same normalization to compute
// the same features.
void backbone_set_input_normalization(Backbone *bb, const float *mean, const float *std);
