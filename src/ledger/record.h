// One step of the resource ledger: what was encoded, what is held for backward, what is cached
// from earlier steps, what the next step must redo, and what it all cost. Objectives fill the
// counts from the code that does the work; the trainer fills memory (from the accounting
// allocator), FLOPs (from the ops' own counters), communication and time.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "core/alloc.h"

typedef struct {
  // identity
  long step;
  int epoch;
  const char *objective;
  int replicas;
  double lr;
  double loss;

  // encoded this step (this replica)
  long images_source;         // distinct source images loaded
  long views_grad;            // views through the online encoder with gradient
  long views_nograd;          // views through the momentum encoder, forward only
  long patches_total;         // patches in the views that were patchified (0 for CNNs)
  long patches_encoded;       // patches the encoder actually processed
  long patches_decoded;       // positions the decoder processed
  long negatives_per_query;   // comparison candidates per query
  long positives_per_query;

  // held (bytes, from the accounting allocator)
  size_t activation_bytes;                  // retained for backward, all components
  size_t activation_bytes_by[COMP_NCOMP];   // by component
  size_t activation_grad_bytes;
  size_t param_bytes, grad_bytes, optimizer_bytes, momentum_encoder_bytes;
  size_t workspace_bytes, data_bytes;

  // cached from earlier steps
  long queue_vectors;             // real keys in the queue (random initial entries excluded)
  long queue_random_vectors;      // initial random entries not yet replaced
  size_t queue_bytes;
  double queue_oldest_age_steps;
  double queue_mean_age_steps;
  double momentum_distance;       // ||theta_k - theta_q|| / ||theta_q||

  // the next step
  long encodings_next_new;     // encodings the next step computes anew
  long encodings_next_reused;  // encodings it takes from cache instead

  // cost
  double flops_forward, flops_backward;
  double flops_forward_by[COMP_NCOMP], flops_backward_by[COMP_NCOMP];
  double comm_bytes;
  double comm_allreduce_bytes, comm_allgather_bytes;
  int shard_samples;     // this replica's samples
  double shard_weight;   // its weight in the gradient average

  // time
  double data_ms, forward_ms, backward_ms, comm_ms, optimizer_ms, step_ms;
  double images_per_s;
  size_t peak_rss_bytes;
} LedgerRecord;

// JSON Lines: one object per record, field names with units.
void ledger_write_json(FILE *f, const LedgerRecord *r);
// CSV: a header line once, then one row per record, same names.
void ledger_write_csv_header(FILE *f);
void ledger_write_csv(FILE *f, const LedgerRecord *r);
