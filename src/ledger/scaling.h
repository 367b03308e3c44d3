// Predicting throughput at N machines before buying them: a measured run gives the compute of a
// step per replica (its ledger's data, forward, backward and optimizer times), the plan gives
// what the step sends (the ledger's own byte counts: the gradient allreduce's payload and the
// gathers' bytes per sample), and the link's rate turns bytes into time under the algorithms the
// collectives use: a ring allreduce moves 2 (N-1)/N of its payload through each node's link; an
// allgather brings each node the other N-1 blocks. Each collective also waits the link's latency
// once per round of its algorithm (the ledger counts the calls), so a step of many small
// collectives is not predicted as free: Open MPI sums a payload under 10 kB by recursive
// doubling (ceil(log2 N) rounds) and a larger one on a ring (2 (N-1) rounds); a gather's ring
// takes N-1.
#pragma once

typedef struct {
  int replicas;                   // of the measured run
  int local_batch, global_batch;  // its rank 0's shard and its global batch
  // Medians over its steps (the first, which creates kernels, left out), per replica.
  double data_ms, forward_ms, backward_ms, optimizer_ms, comm_ms, step_ms;
} MeasuredRun;

typedef struct {
  double allreduce_payload_bytes;  // the gradient block every step averages
  double gather_bytes_per_sample;  // what one sample adds to the step's allgathers (0: none)
  // Collectives per step: the gradient average is one of the allreduces, the others sum a few
  // numbers each (losses, BatchNorm statistics).
  long allreduce_calls, allgather_calls;
} StepTraffic;

typedef struct {
  int nodes;
  double link_bytes_per_s;
  int keep_replica_batch;  // 1: each node keeps the measured per-replica batch (the global batch
                           // grows with N); 0: the measured global batch is split N ways
  double latency_s;        // one message's latency on the link, paid per round of an algorithm
} ScaleQuestion;

typedef struct {
  int nodes, local_batch, global_batch;
  double link_bytes_per_s;
  double compute_ms;                  // data + forward + backward + optimizer, per replica
  double allreduce_ms, allgather_ms;  // on the link, latency included
  double latency_ms;                  // the part of both that is latency, not bytes
  double comm_ms;                     // both
  double step_ms;                     // the allreduce overlapping backward (as on MPI)
  double step_ms_no_overlap;          // everything in sequence
  double images_per_s;                // global batch / step_ms
} ScalePrediction;

// Reads a run folder's ledger.jsonl. -1 with tl_last_error() when it has fewer than 2 steps.
int scaling_read_run(const char *dir, MeasuredRun *m);

// The prediction for one question. Compute per replica scales with the samples it holds.
void scaling_predict(const MeasuredRun *m, const StepTraffic *t, const ScaleQuestion *q,
                     ScalePrediction *out);

// "10Gbit", "100Mbit", "1Gbit/s", "125MB/s", "1.25GB/s", "800kbit": bits (kbit, Mbit, Gbit,
// Tbit) or bytes (KB, MB, GB per second), decimal. Returns 0, or -1 with tl_last_error().
int scaling_parse_rate(const char *text, double *bytes_per_s);

// "50us", "0.2ms", "2000ns", "0": a latency, >= 0. Returns 0, or -1 with tl_last_error().
int scaling_parse_latency(const char *text, double *seconds);
