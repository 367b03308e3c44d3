// Checkpoints: the parameter block (with BatchNorm running statistics) and the step, written
// atomically (temporary file, fsync, rename) so a crash or a full disk never leaves a torn file
// where the last good checkpoint was.
#pragma once
#include <stddef.h>

int checkpoint_save(const char *path, long step, const float *params, size_t count);
// Reads into params (count must match). Returns -1 with tl_last_error() on any mismatch.
int checkpoint_load(const char *path, long *step, float *params, size_t count);
