// Multi-crop's student encoder (Caron et al. 2020, SwAV; DINO): the online backbone on the
// global crops (view group 0, data.image_size) and a second instance of it over the same
// weights on the local crops (view group 1, their own smaller side), whose gradients add into
// those weights. Their features, global crops first, are one (rows, D) block for the head that
// follows. The local instance leaves BatchNorm's running statistics to the global crops, the
// size the encoder is evaluated and exported at.
#pragma once
#include "config_keys.h"
#include "objectives/objective.h"

// Multi-crop's views: two global crops at data.image_size taking [global_crop_scale_min,
// augment.crop_scale_max] of the image, then `local_crops` at `local_size` taking
// [local_crop_scale_min, global_crop_scale_min], both otherwise the recipe's augmentation.
typedef struct {
  int local_crops, local_size;
  float global_crop_scale_min, local_crop_scale_min;
} MultiCrop;

enum { MULTICROP_GLOBAL = 2 };

// Their four keys in an objective's section, read into the members of Type named as MultiCrop's,
// with the objective's defaults.
#define MULTICROP_KEYS(Type, sec, local_crops_default, local_size_default, global_min_default, \
                       local_min_default)                                                      \
  INT_KEY(OWN(Type, sec, local_crops), local_crops_default, 0, 16,                             \
          "small crops per image besides the two global ones, encoded with gradient only"),    \
      INT_KEY(OWN(Type, sec, local_size), local_size_default, 1, 4096,                         \
              "the small crops' side in pixels (at most data.image_size)"),                    \
      FLOAT_KEY(OWN(Type, sec, global_crop_scale_min), global_min_default, 0, 1, 1,            \
                "global crops take [this, augment.crop_scale_max] of the image area"),         \
      FLOAT_KEY(OWN(Type, sec, local_crop_scale_min), local_min_default, 0, 1, 1,              \
                "local crops take [this, global_crop_scale_min] of the image area")

// The view groups (one without local crops) from the recipe's augmentation `base`.
void multicrop_views(const MultiCrop *m, const AugmentParams *base, ViewRecipe *out);
// 0 with tl_fail naming [section] when the crops cannot be cut as asked under cfg.
int multicrop_check(const MultiCrop *m, const Config *cfg, const char *section);

typedef struct {
  Backbone *global;     // the online backbone (the objective's base.online), global_rows images
  ParamSet local_view;  // the online backbone's weights again, for its second instance
  Backbone *local;      // local_rows images of local_size pixels; NULL without local crops
  int global_rows, local_rows;
  size_t local_act_bytes;       // the encoder activations held for the local crops
  float *features;              // (global_rows + local_rows, D), global crops first
  LedgerViewGroup local_group;  // the local crops' ledger line at the last step
} MultiCropEncoder;

// Builds the online backbone from `online` (the run's, counted as every objective's encoder),
// then its local instance; returns the online backbone for the objective's base.online.
Backbone *multicrop_encoder_init(MultiCropEncoder *e, const ObjectiveEnv *env, Builder *online,
                                 int global_rows, int local_rows, int local_size);
// Group 0 of the batch through the online backbone, group 1 through the local instance; fills
// `features`.
void multicrop_encoder_forward(MultiCropEncoder *e, ExecCtx *ctx, const Batch *batch);
// dfeatures (rows, D), laid out as `features`: the local crops' rows, then the global ones.
void multicrop_encoder_backward(MultiCropEncoder *e, ExecCtx *ctx, const float *dfeatures);
// The step's view groups in the ledger: group 0 the global crops (their views_nograd are the
// objective's), group 1 the local ones, encoded with gradient only.
void multicrop_encoder_ledger(const MultiCropEncoder *e, LedgerRecord *rec);
// Destroys both instances (the online backbone too) and the features.
void multicrop_encoder_destroy(MultiCropEncoder *e);
