// `tally plan --from RUN`: what a prediction at N nodes (ledger/scaling.h) starts from, read
// from a finished run and plans of its own configuration.
#pragma once
#include <stdio.h>

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

// `tally plan --from RUN --nodes N[,N...] --link RATE`, its options as given.
typedef struct {
  const char *run_dir;
  const char *nodes;      // "2,8,64"
  const char *link;       // the line rate: "10Gbit", "125MB/s"
  const char *mtu;        // bytes; "0" when the rate is the payload's already
  const char *latency;    // per round of a collective: "50us"
  const char *allreduce;  // the gradient buckets' algorithm: ring, binomial, auto
  int keep_replica_batch, json;
} ScalingRequest;

// Prints the setup (unless json) and a prediction for each node count in turn. Returns 0; 1 with
// tl_last_error() when the run cannot be read or planned; 2 with tl_last_error() for an option
// that does not parse (a bad node count after good ones, once theirs are printed).
int plan_scaling_print(FILE *f, const ScalingRequest *r);
