// The momentum (EMA) encoder's rule, shared by every objective that keeps a slowly moving copy of
// the online network (moco's key encoder, BYOL's target):
//   theta_target <- m theta_target + (1 - m) theta_online
// over the trainable entries (BatchNorm running statistics stay the copy's own), with m constant
// or rising from its base value to 1 along a half cosine over the run (BYOL; MoCo v3).
#pragma once
#include "core/params.h"

// The copy starts as the online network: target's count floats from the online set's first ones
// (the part it mirrors), at creation and after --init replaced the online parameters.
void ema_copy(ParamSet *target, const ParamSet *online);

// m at 0-based `step` of a run of `total_steps`: "constant" or "cosine".
float ema_momentum_at(float base, const char *schedule, long step, long total_steps);

// One update; returns ||theta_target - theta_online|| / ||theta_online|| after it (the ledger's
// momentum_distance). The two sets must have been built from the same model (same entries).
double ema_update(ParamSet *target, const ParamSet *online, float m);
