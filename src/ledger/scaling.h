// Predicting throughput at N machines before buying them: a measured run gives the compute of a
// step per replica (its ledger's time outside the collectives) and, when it ran several replicas,
// how long one waits for the slower (its own comm_ms: local replicas exchange in memory, so that
// is waiting); the plan gives what the step sends (the gradient block and the buckets it is
// averaged in, the other sums' payload, the gathers' bytes per sample, the collectives per step)
// and the link's rate and latency turn it into time under the algorithms Open MPI runs:
//   gradient buckets (non-blocking, in place): Open MPI 4.1's libnbc picks a binomial reduce then
//     broadcast, 2 ceil(log2 N) times each bucket's bytes in turn through the root's link and as
//     many rounds; a ring (`--mca coll_libnbc_iallreduce_algorithm 1`) moves 2 (N-1)/N of them in
//     2 (N-1) rounds. The buckets are summed while backward goes on, one after another on the
//     link, each from when backward has written it (backward's time taken as its FLOPs): what
//     backward does not hide is exposed.
//   other sums (losses, BatchNorm statistics, inbatch's column gradients, which grow with the
//     global batch): 2 (N-1)/N of their bytes, ceil(log2 N) rounds each (recursive doubling).
//   gathers: N-1 blocks come in, and two exchanges, the counts (ceil(log2 N) rounds) then the
//     blocks (a ring, N-1 rounds).
// Every round waits the link's latency once, so many small collectives are not free at scale.
#pragma once
#include <stdio.h>

// The algorithm of the gradient's non-blocking sums.
typedef enum {
  SCALE_ALLREDUCE_AUTO,      // what Open MPI 4.1 chooses itself (binomial, see above)
  SCALE_ALLREDUCE_RING,      // forced with --mca coll_libnbc_iallreduce_algorithm 1
  SCALE_ALLREDUCE_BINOMIAL,  // reduce up a binomial tree, then broadcast down it
} ScaleAllreduce;

typedef struct {
  int replicas;                   // of the measured run
  int local_batch, global_batch;  // its rank 0's shard and its global batch
  // Medians over its steps (the first, which creates kernels, left out), per replica.
  double data_ms, forward_ms, backward_ms, optimizer_ms, comm_ms, step_ms;
} MeasuredRun;

typedef struct {
  double allreduce_payload_bytes;  // the gradient block every step averages
  // The buckets it is averaged in while backward runs, in the order they start: their bytes,
  // and the share of backward done when backward has written each (from the plan's backward
  // FLOPs). 0 buckets: one of the whole block, ready as backward ends.
  int gradient_buckets;
  const double *bucket_bytes, *bucket_ready;
  // The payload of the step's other sums, all together: a fixed part, and a part that grows
  // with the global batch (inbatch's column gradients), per sample of it.
  double other_allreduce_bytes, other_allreduce_bytes_per_sample;
  double gather_bytes_per_sample;  // what one sample adds to the step's allgathers (0: none)
  // Collectives per step, as the ledger counts them: the gradient average is one of the
  // allreduces, the others sum a few numbers each (losses, BatchNorm statistics).
  long allreduce_calls, allgather_calls;
} StepTraffic;

typedef struct {
  int nodes;
  double link_bytes_per_s;  // what the payload moves at (scaling_payload_rate of a line rate)
  int keep_replica_batch;   // 1: each node keeps the measured per-replica batch (the global batch
                            // grows with N); 0: the measured global batch is split N ways
  double latency_s;         // one message's latency on the link, paid per round of an algorithm
  ScaleAllreduce allreduce;
} ScaleQuestion;

typedef struct {
  int nodes, local_batch, global_batch;
  double link_bytes_per_s;       // the question's payload rate
  ScaleAllreduce allreduce;      // the gradient's algorithm (never AUTO: resolved)
  double compute_ms;             // the step outside collectives, per replica
  double wait_ms;                // waiting for the slower replica, from the measured run
  double gradient_ms;            // the gradient average on the link (latency in), hidden or not
  double gradient_exposed_ms;    // the part of it backward does not hide
  double sums_ms, allgather_ms;  // the other sums and the gathers on the link (never hidden)
  double latency_ms;             // the part of gradient, sums and gathers that is latency
  double link_ms;                // gradient + sums + gathers
  // What the ledger's comm_ms would read on the nodes: the time inside collectives, i.e. the
  // wait, the exposed gradient, the sums and the gathers.
  double comm_ms;
  double step_ms;             // compute + comm
  double step_ms_no_overlap;  // compute + wait + link: nothing hidden
  double images_per_s;        // global batch / step_ms
} ScalePrediction;

// The payload of the step's other sums at a global batch of `global_batch`.
static inline double scaling_other_sum_bytes(const StepTraffic *t, int global_batch) {
  return t->other_allreduce_bytes + t->other_allreduce_bytes_per_sample * global_batch;
}

// Reads a run folder's ledger.jsonl. -1 with tl_last_error() when it has fewer than 2 steps.
int scaling_read_run(const char *dir, MeasuredRun *m);

// The prediction for one question. Compute per replica scales with the samples it holds.
void scaling_predict(const MeasuredRun *m, const StepTraffic *t, const ScaleQuestion *q,
                     ScalePrediction *out);

// "10Gbit", "100Mbit", "1Gbit/s", "125MB/s", "1.25GB/s", "800kbit": bits (kbit, Mbit, Gbit,
// Tbit) or bytes (KB, MB, GB per second), decimal. Returns 0, or -1 with tl_last_error().
int scaling_parse_rate(const char *text, double *bytes_per_s);

// What of a line rate TCP over IPv4 and Ethernet carries as payload at an MTU of mtu bytes:
// each frame takes mtu + 38 bytes of the line (header 14, frame check 4, preamble 8, gap 12)
// and carries mtu - 52 of payload (IPv4 20, TCP 20, its timestamp option 12). At 1500 that is
// 1448 / 1538 = 94.1%. mtu 0: the rate is already the payload's (e.g. measured with iperf).
// Returns 0, or -1 with tl_last_error() for an MTU TCP cannot use (below 576 or above 65536).
int scaling_payload_rate(double line_bytes_per_s, long mtu, double *payload_bytes_per_s);

// "auto", "ring", "binomial". Returns 0, or -1 with tl_last_error().
int scaling_parse_allreduce(const char *text, ScaleAllreduce *out);
const char *scaling_allreduce_name(ScaleAllreduce a);

// "50us", "0.2ms", "2000ns", "0": a latency, >= 0. Returns 0, or -1 with tl_last_error().
int scaling_parse_latency(const char *text, double *seconds);

// A prediction's setting, as `tally plan --from RUN` states it: the measured run, what its step
// sends, and the link; the node count is asked per prediction.
typedef struct {
  char objective[64];  // the measured run's
  const char *run_dir;
  MeasuredRun run;
  StepTraffic traffic;
  double line_bytes_per_s;  // the link's rate as given
  long mtu;                 // 0: that rate is already the payload's
  ScaleQuestion question;   // payload rate, latency, algorithm, batch rule (nodes: unused)
} ScalingSetup;

// The text report's head: the measured run, the link, what a step sends, the column titles.
void scaling_print_setup(FILE *f, const ScalingSetup *s);
// The prediction at `nodes`: a row under scaling_print_setup's titles, or (json) one object a
// line with the prediction's and the setting's numbers.
void scaling_print_prediction(FILE *f, const ScalingSetup *s, long nodes, int json);
