#include "nn/backbone.h"

#include <string.h>

#include "core/counting.h"

// The registry: a family is its files and its row here.
extern const BackboneDef backbone_resnet;
extern const BackboneDef backbone_vit;
extern const BackboneDef backbone_convnext;

static const BackboneDef *const backbone_table[] = {&backbone_resnet, &backbone_vit,
                                                    &backbone_convnext};
enum { N_BACKBONES = sizeof backbone_table / sizeof backbone_table[0] };

const BackboneDef *backbone_def(const ModelSpec *spec) {
  for (int i = 0; i < N_BACKBONES; i++)
    if (strcmp(backbone_table[i]->settings->name, spec->type) == 0) return backbone_table[i];
  TL_DIE("backbone type '%s' is not in the registry", spec->type);
}

void backbone_register_config(void) {
  _Static_assert(N_BACKBONES <= CONFIG_MAX_BACKBONES, "raise CONFIG_MAX_BACKBONES");
  const BackboneSection *sections[N_BACKBONES];
  for (int i = 0; i < N_BACKBONES; i++) sections[i] = backbone_table[i]->settings;
  config_register_backbones(sections, N_BACKBONES);
}

// Built once in dry run on a counting parameter set: the count is what the builders take.
size_t backbone_param_count(const ModelSpec *spec, int image_size, int channels) {
  CountingPass pass;
  counting_begin(&pass, 0);
  Builder b = {.ctx = &pass.ctx, .params = &pass.ps, .mode = OP_INFER};
  Backbone *bb = backbone_create(spec, &b, 2, image_size, channels);
  bb->destroy(bb);
  return counting_end(&pass);
}

int backbone_feature_dim(const ModelSpec *spec) { return backbone_def(spec)->feature_dim(spec); }

int backbone_patch_count(const ModelSpec *spec, int image_size) {
  const BackboneDef *def = backbone_def(spec);
  return def->patch_count ? def->patch_count(spec, image_size) : 0;
}

ModelSpec backbone_spec_at_size(const ModelSpec *spec, int image_size) {
  const BackboneDef *def = backbone_def(spec);
  return def->spec_at_size ? def->spec_at_size(spec, image_size) : *spec;
}

Backbone *backbone_create(const ModelSpec *spec, Builder *b, int N, int image_size, int channels) {
  // config_validate has checked the spec against the data; what is left is the step's size.
  const size_t at = b->params->used;
  Backbone *bb = backbone_def(spec)->create(spec, b, N, image_size, channels);
  if (!bb) tl_fatal_input("%s", tl_last_error());
  bb->param_offset = at;
  bb->param_floats = b->params->used - at;
  return bb;
}

void backbone_set_input_normalization(Backbone *bb, const float *mean, const float *std) {
  for (int c = 0; c < bb->channels; c++)
    bb->pad_value[c] = mean && std && !bb->pad_mean ? (0.0f - mean[c]) / std[c] : 0.0f;
}
