#include "nn/backbone.h"

#include <string.h>

#include "core/counting.h"

#include "nn/resnet.h"
#include "nn/vit.h"

// Built once in dry run on a counting parameter set: the count is what the builders take.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels) {
  CountingPass pass;
  counting_begin(&pass, 0);
  Builder b = {.ctx = &pass.ctx, .params = &pass.ps, .mode = OP_INFER};
  Backbone *bb = backbone_create(spec, &b, 2, image_size, channels);
  bb->destroy(bb);
  return counting_end(&pass);
}

int backbone_feature_dim(const ModelSpec *spec) {
  if (strcmp(spec->type, "vit") == 0) return spec->dim;
  return spec->stage_channels[model_spec_stages(spec) - 1];
}

int backbone_patch_count(const ModelSpec *spec, int image_size) {
  return strcmp(spec->type, "vit") == 0 ? vit_patch_count(spec, image_size) : 0;
}

Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  if (strcmp(spec->type, "vit") == 0) {
    // config_validate has checked the spec against the data; what is left is the step's size.
    Backbone *bb = vit_create(spec, b, N, image_size, channels);
    if (!bb) tl_fatal_input("%s", tl_last_error());
    return bb;
  }
  return resnet_create(spec, b, N, image_size, channels);
}

void backbone_set_input_normalization(Backbone *bb, const float *mean, const float *std) {
  for (int c = 0; c < bb->channels; c++)
    bb->pad_value[c] = mean && std && !bb->pad_mean ? (0.0f - mean[c]) / std[c] : 0.0f;
}
