// ConvNeXt (v1, torchvision's convnext_tiny and its kin): a patchify stem (4x4 convolution of
// stride 4 with bias, LayerNorm over channels), stages of ConvNeXt blocks (depthwise 7x7
// convolution, LayerNorm over channels, Linear C -> 4C, GELU, Linear 4C -> C, layer scale, plus
// the block's input), between stages a LayerNorm over channels and a 2x2 convolution of stride
// 2, then global average pooling and a LayerNorm: the feature torchvision's classifier feeds to
// its Linear. convnext_tiny: dims 96, 192, 384, 768, depths 3, 3, 9, 3 -> 768-d features.
#pragma once
#include "nn/backbone_type.h"

Backbone *convnext_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels);
