// The tiny networks the model, op and objective tests build, as a model file would describe
// them: built in milliseconds, yet with every kind of layer the families have (a ResNet stage at
// stride 1 and one at stride 2; a ViT block of more than one head).
#pragma once
#include <stdio.h>
#include <string.h>

#include "nn/model_spec.h"

// "vit": 4 x 4 patches, width 8, one block of 2 heads, an MLP of twice the width, the cls token
// as the representation. "resnet": a stem of 4 channels, then two stages of one block each, 4
// channels at stride 1 and 8 at stride 2 (the lists end at their first 0). Both unframed
// (pad_to 0) with the default black fill. A test changes after it what it is about.
static inline ModelSpec tiny_model_spec(const char *type) {
  ModelSpec m;
  memset(&m, 0, sizeof m);
  snprintf(m.type, sizeof m.type, "%s", type);
  snprintf(m.pad_fill, sizeof m.pad_fill, "black");
  snprintf(m.pool, sizeof m.pool, "cls");
  if (strcmp(type, "vit") == 0) {
    m.patch_size = 4;
    m.dim = 8;
    m.depth = 1;
    m.heads = 2;
    m.mlp_ratio = 2;
  } else {
    m.stem_channels = 4;
    m.stage_channels[0] = 4;
    m.stage_channels[1] = 8;
    m.stage_blocks[0] = m.stage_blocks[1] = 1;
    m.stage_strides[0] = 1;
    m.stage_strides[1] = 2;
  }
  return m;
}
