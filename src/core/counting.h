// A counting pass: a model built once in dry run (oneDNN primitives created, nothing executed,
// large buffers only reserved) on a counting ParamSet, so its parameter count is what its
// builders take. objective_param_count and backbone_param_count are built on it: for a count
// without the model (an export, an evaluation copy, the kNN monitor) and for a replica whose
// build outgrew its growing set. A replica's own build counts as it allocates (core/params.h).
#pragma once
#include <stdint.h>

#include "core/exec_ctx.h"
#include "core/params.h"

typedef struct {
  ExecCtx ctx;  // dry run
  ParamSet ps;  // counting
  int was_untouched;
} CountingPass;

void counting_begin(CountingPass *c, uint64_t seed);
// The floats the build took; releases the pass (the model must be destroyed first).
size_t counting_end(CountingPass *c);
