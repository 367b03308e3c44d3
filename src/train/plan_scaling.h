// `tally plan --from RUN`: what a prediction at N nodes (ledger/scaling.h) starts from, read
// from a finished run and plans of its own configuration.
#pragma once
#include "config.h"
#include "ledger/scaling.h"

// What one step of `objective` under cfg sends, from plans of it on two local replicas (and,
// to tell the sums that grow with the batch from the fixed, of twice its batch). The bucket
// arrays t points to are this module's, valid until the next call. Returns 0, or -1 with
// tl_last_error() set.
int plan_step_traffic(const Config *cfg, const char *objective, StepTraffic *t);

// Fills s's objective, run_dir, run and traffic from the run folder: its checkpoint's
// configuration and objective, its ledger's step times. The link is the caller's. Returns 0, or
// -1 with tl_last_error() set.
int plan_scaling_setup(const char *run_dir, ScalingSetup *s);
