// A backbone as the model file (models/*.ini, section [backbone]) describes it: the network is
// data, read by the config and built by nn/ (a new architecture of these kinds is a new file).
#pragma once

#define CONFIG_MAX_STAGES 8

typedef struct {
  // [backbone] type = resnet | vit | convnext
  char type[16];
  // resnet: a stem, stages of residual blocks, global average pool.
  char stem[12];      // small (3x3 stride 1) | imagenet (7x7 s2, max-pool)
  int stem_channels;  // 32
  char block[12];     // basic | bottleneck
  // Each list ends at its first 0 (entries are at least 1) or at CONFIG_MAX_STAGES; the config
  // rejects lists of different lengths. model_spec_stages: the count.
  int stage_channels[CONFIG_MAX_STAGES];  // 32,64,128
  int stage_blocks[CONFIG_MAX_STAGES];    // 1,1,1
  int stage_strides[CONFIG_MAX_STAGES];   // 1,2,2
  // vit: patch embedding, pre-norm transformer blocks, fixed 2-D sin-cos positions, cls token.
  int patch_size;    // 4
  int pad_to;        // 0 = no padding; else images are framed (centred) to this size
  char pad_fill[8];  // black | mean: the frame's value, raw 0 or the data's mean
  int dim;           // 128
  int depth;         // 4
  int heads;         // 4
  int mlp_ratio;     // 4
  char pool[8];      // cls | mean: which token summary is the representation
  // convnext: a patchify stem, stages of ConvNeXt blocks, global average pool, LayerNorm. Lists
  // as the resnet's, of their own length (one entry a stage).
  int stage_dims[CONFIG_MAX_STAGES];    // 96,192,384,768: channels of each stage
  int stage_depths[CONFIG_MAX_STAGES];  // 3,3,9,3: blocks in each stage
} ModelSpec;

// Entries of a stage list before its first 0.
static inline int model_spec_list_length(const int *list) {
  int n = 0;
  while (n < CONFIG_MAX_STAGES && list[n] != 0) n++;
  return n;
}

// The resnet's stages: the length of stage_channels (and, once validated, of the other lists).
static inline int model_spec_stages(const ModelSpec *spec) {
  return model_spec_list_length(spec->stage_channels);
}
