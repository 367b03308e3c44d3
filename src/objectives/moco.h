// What MoCo keeps between steps, for checkpoints, the ledger and tests.
#pragma once
#include "core/params.h"
#include "objectives/key_queue.h"
#include "objectives/objective.h"

const ParamSet *moco_key_params(const Objective *o);
const KeyQueue *moco_queue(const Objective *o);
// Normalized keys of the last step, (n_query, d).
const float *moco_last_keys(const Objective *o);
