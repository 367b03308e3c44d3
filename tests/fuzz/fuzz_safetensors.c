// libFuzzer harness: a checkpoint or export file (safetensors), through every reader that takes
// one: st_parse, checkpoint_step and checkpoint_restore (--resume), checkpoint_config (the
// configuration a checkpoint carries), weights_find (--init, tally embed and eval) and
// export_checkpoint (tally export).
// Input: the file's bytes (of odd length, the export takes the head too: --with-head).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_util.h"
#include "objectives/objective.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "encoder/export.h"

// --resume's side: what a replica of the seed checkpoints' tiny models asks for.
static int restore_into_replica(const StFile *have) {
  static float stem[2 * 1 * 3 * 3], running_var[2], queue_keys[8 * 4];
  static int64_t step;
  static const struct {
    const char *name;
    StDtype dtype;
    int ndim;
    int64_t dims[4];
    void *data;
  } wanted[] = {
      {"params.stem.conv.weight", ST_F32, 4, {2, 1, 3, 3}, stem},
      {"params.stem.bn.running_var", ST_F32, 1, {2}, running_var},
      {"moco.queue.keys", ST_F32, 2, {8, 4}, queue_keys},
      {"train.step", ST_I64, 0, {0}, &step},
  };
  StFile want = {0};
  for (size_t i = 0; i < sizeof wanted / sizeof *wanted; i++)
    st_add(&want, wanted[i].name, wanted[i].dtype, wanted[i].ndim, wanted[i].dims, wanted[i].data);
  int rc = checkpoint_restore(&want, have, "fuzz");
  st_free(&want);
  return rc;
}

// --init's side: the parameters the model `spec` describes that depend on the spec (ViT's patch
// embedding is converted from PyTorch's layout), each looked up as weights_find does.
static void find_weights(const StFile *f, const ModelSpec *spec, int channels) {
  const long dim = spec->dim, patch = (long)spec->patch_size * spec->patch_size * channels;
  const long stem = spec->stem_channels;
  if (dim * patch > (1 << 20) || stem * channels * 9 > (1 << 20)) return;
  const struct {
    const char *name;
    int ndim;
    long shape[4];
  } entries[] = {
      {"patch_embed.weight", 2, {dim, patch}},
      {"cls_token", 1, {dim}},
      {"norm.gamma", 1, {dim}},
      {"stem.conv.weight", 4, {stem, channels, 3, 3}},
      {"stem.bn.running_var", 1, {stem}},
  };
  for (size_t i = 0; i < sizeof entries / sizeof *entries; i++) {
    ParamEntry e = {.ndim = entries[i].ndim, .count = 1};
    snprintf(e.name, sizeof e.name, "%s", entries[i].name);
    for (int d = 0; d < e.ndim; d++) e.count *= (size_t)(e.shape[d] = entries[i].shape[d]);
    float *out = malloc(e.count * sizeof *out);
    if (!out) abort();
    weights_find(f, &e, spec, channels, out, "fuzz");
    free(out);
  }
}

// libFuzzer calls it once, before the first input: config reads the objectives' sections.
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  objective_register_config();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = malloc(size ? size : 1);
  if (!buf) abort();
  memcpy(buf, data, size);
  StFile f;
  if (st_parse(&f, buf, size, "fuzz") == 0) {
    checkpoint_step(&f);
    restore_into_replica(&f);
    static Config cfg;
    if (checkpoint_config(&f, "fuzz", &cfg) != 0) config_defaults(&cfg);
    find_weights(&f, &cfg.model.spec, cfg.data.channels);
    st_free(&f);
  }

  // tally export reads the file itself.
  char in[600], out[600];
  fuzz_path(in, sizeof in, "checkpoint.safetensors");
  fuzz_path(out, sizeof out, "export.safetensors");
  fuzz_write(in, data, size);
  export_checkpoint(in, out, size % 2);
  return 0;
}
