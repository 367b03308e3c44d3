// An encoder that maps a batch of images to one feature vector each. Objectives use backbones
// only through this interface, so every objective runs on every backbone (resnet, vit).
#pragma once
#include "nn/backbone_type.h"

// Parameters (and buffers) a backbone takes from its ParamSet: the backbone built once in dry run
// on a counting set (paramset_alloc_counting), so the count is the builders' own.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels);
int backbone_feature_dim(const ModelSpec *spec);
// Patches per image for token backbones (vit), 0 for the others.
int backbone_patch_count(const ModelSpec *spec, int image_size);

// Builds the backbone named by spec->type. Takes its parameters from b->params in a fixed order.
// Its inputs count as unnormalized (pad_value 0) until backbone_set_input_normalization.
Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
// The normalization its images went through, (x - mean_c) / std_c per channel with x in [0, 1]:
// sets pad_value to (0 - mean_c) / std_c (NULL: none, pad_value 0). Every encoder of one model
// (training, momentum copies, evaluation, export) must be told the same normalization to compute
// the same features.
void backbone_set_input_normalization(Backbone *bb, const float *mean, const float *std);
