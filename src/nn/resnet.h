// ResNet: a stem (small images: 3x3 stride 1; ImageNet's: 7x7 stride 2 and a 3x3 stride-2
// max-pool), stages of residual blocks (basic: two 3x3 convolutions; bottleneck: 1x1, 3x3, 1x1
// to 4x the width; BatchNorm, ReLU, a 1x1 projection shortcut where the shape changes), global
// average pooling. resnet-small: stem 32, basic stages 32/64/128 with strides 1/2/2 -> 128-d
// features; resnet50: torchvision's resnet50 without fc -> 2048-d features.
#pragma once
#include "nn/backbone_type.h"

Backbone *resnet_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
