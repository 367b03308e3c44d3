// A trained encoder outside training: built for inference from a checkpoint or an export (its
// own configuration and input normalization travel in the file), run over a dataset in
// batches. `tally embed` and `tally eval` use it.
#pragma once
#include "config.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "nn/backbone.h"

typedef struct {
  Config cfg;          // the run's, from the file
  char source[4200];   // the file read
  char objective[32];  // "" when the file does not say
  long step;           // steps trained, -1 when unknown
  char crc32[16];      // the file's own CRC-32 (its "crc32" metadata), "" when it has none
  AugmentParams norm;  // the evaluation transform: resize and the training normalization
  ExecCtx ctx;
  ParamSet ps;        // the backbone's parameters and running statistics
  Backbone *encoder;  // OP_INFER, `batch` images per call
  int batch;
  float *images;  // (batch, S, S, C) MEM_EVAL
} FeatureEncoder;

// `src`: a run folder (its checkpoint.safetensors), a checkpoint, or an export; `sets` (n_sets
// "section.key=value" assignments, may be NULL) change its configuration before the encoder is
// built, which encodes eval.batch_size images a pass. -1 with tl_last_error() on a missing,
// corrupt or mismatched file or a bad assignment.
int feature_encoder_open(FeatureEncoder *e, const char *src, const char *const *sets, int n_sets);
int feature_encoder_dim(const FeatureEncoder *e);
// Features (n, D) of the first n images of ds (evaluation transform; ds must have the run's
// image size and channels). -1 with tl_last_error() naming the image when a feature is not
// finite: nothing downstream (kNN, a probe, an embedding file) may score or keep one.
int feature_encoder_run(FeatureEncoder *e, const Dataset *ds, int n, float *feat);
void feature_encoder_close(FeatureEncoder *e);

// Loads a dataset the encoder can take: IDX images file or ImageFolder root (a directory),
// resized to the run's image size and channels. `labels` 0 accepts a folder of images without
// class subfolders (labels all 0, n_classes 0).
// `unlabeled`: its subfolders are not classes (DATASET_UNLABELED: every image under it, at any
// depth, unlabeled), as for a run of data.labels = none.
int feature_dataset_load(const FeatureEncoder *e, Dataset *ds, const char *path, int limit,
                         int unlabeled);
// The same for a configuration's encoder ([data] image_size, channels, stream): a dataset named
// by its path alone, as `tally eval`'s and the monitor's own labeled set ([eval] train, test)
// are. -1 with tl_last_error() naming the path.
int dataset_load_path(const Config *cfg, Dataset *ds, const char *path, int limit, int unlabeled);
