// A parameter set as safetensors entries: what checkpoints and the objectives' own state (momentum
// networks) save, one tensor per entry.
#pragma once
#include "core/params.h"
#include "io/safetensors.h"

// Adds one tensor per entry of `ps`, named prefix + entry name, with the entry's shape, pointing
// at its live floats.
void st_add_paramset(StFile *s, const char *prefix, const ParamSet *ps);
