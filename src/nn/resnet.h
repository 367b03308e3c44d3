// ResNet for small images: a 3x3 stem, stages of basic residual blocks (two 3x3 convolutions,
// BatchNorm, ReLU, a 1x1 projection shortcut where the shape changes), global average pooling.
// resnet-small: stem 32, stages 32/64/128 with strides 1/2/2 -> 128-d features.
#pragma once
#include "nn/backbone_type.h"

Backbone *resnet_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
