// Checkpoints are safetensors files (io/safetensors.h): one format for resume and for export.
// A checkpoint is a list of named tensors that point at a replica's live state — parameters
// with BatchNorm running statistics, optimizer state, the objective's own state (moco's key
// encoder and queue), the step — plus metadata: the resolved configuration and model, the
// objective. Saving writes the list; restoring builds the same list from a freshly built
// replica and copies each tensor into place, checking names, dtypes and shapes.
// The tensors and their dtypes are the same whatever [train] precision is (bf16 copies live only
// inside a step): that is what lets --resume switch the precision, so state that outlasts a step
// belongs here in f32 even when a step computes it in bf16.
#pragma once
#include <stddef.h>

#include "core/params.h"
#include "io/param_tensors.h"
#include "io/safetensors.h"

#define CHECKPOINT_FORMAT "tally-checkpoint-1"
#define CHECKPOINT_FILE "checkpoint.safetensors"

// Copies every tensor listed in `want` from `have` into the memory `want` points at. -1 with
// tl_last_error() naming `what` and the first tensor that is missing or whose dtype or shape
// differs; nothing is partially copied when the check fails.
int checkpoint_restore(const StFile *want, const StFile *have, const char *what);

// Reads a checkpoint and checks that it is one (format metadata). -1 with tl_last_error().
int checkpoint_read(StFile *s, const char *path);

// The step a checkpoint was written after (steps done), or -1 if it has none.
long checkpoint_step(const StFile *s);

// The checkpoint `src` names: a run folder's own, anything else taken as the file itself.
void checkpoint_path_of(const char *src, char *out, size_t cap);
