#include "ledger/scaling.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "io/regular_file.h"
#include "ledger/record.h"

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int scaling_read_run(const char *dir, MeasuredRun *m) {
  char path[4200];
  snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
  FILE *f = regular_fopen(path, "r");
  if (!f) return -1;
  enum { N_TIMES = 6 };
  static const char *const names[N_TIMES] = {"data_ms",      "forward_ms", "backward_ms",
                                             "optimizer_ms", "comm_ms",    "step_ms"};
  int fields[N_TIMES];
  for (int k = 0; k < N_TIMES; k++) fields[k] = ledger_field_find(names[k]);
  double *times[N_TIMES] = {0};
  int n = 0, cap = 0;
  char *line = NULL;
  size_t line_cap = 0;
  memset(m, 0, sizeof *m);
  while (getline(&line, &line_cap, f) > 0) {
    LedgerRecord r;
    if (ledger_read_json(line, &r, NULL) < 0) continue;  // a cut-off last line
    m->replicas = r.replicas;
    m->local_batch = r.shard_samples;
    m->global_batch = r.shard_weight > 0 ? (int)lround(r.shard_samples / r.shard_weight) : 0;
    if (r.step == 0) continue;  // kernel creation and first-touch page faults
    if (n == cap) {
      cap = cap ? 2 * cap : 256;
      for (int k = 0; k < N_TIMES; k++)
        if (!(times[k] = realloc(times[k], sizeof(double) * (size_t)cap))) TL_DIE("out of memory");
    }
    for (int k = 0; k < N_TIMES; k++) times[k][n] = ledger_field_value(&r, fields[k]);
    n++;
  }
  free(line);
  fclose(f);
  int rc = 0;
  if (n < 1 || m->local_batch < 1 || m->global_batch < 1) {
    rc = tl_fail("%s: needs at least 2 steps of a run to measure", path);
  } else {
    double *out[N_TIMES] = {&m->data_ms,      &m->forward_ms, &m->backward_ms,
                            &m->optimizer_ms, &m->comm_ms,    &m->step_ms};
    for (int k = 0; k < N_TIMES; k++) *out[k] = median(times[k], n);
  }
  for (int k = 0; k < N_TIMES; k++) free(times[k]);
  return rc;
}

static double log2_rounds(int nodes) { return ceil(log2(nodes)); }

// libnbc (Open MPI 4.1, nbc_iallreduce.c) takes its binomial algorithm whenever the buffer is in
// place, as each gradient bucket is, and also on fewer than 4 ranks or under 64 kB: for Tally's
// buckets that is every N. It would choose otherwise only for separate send and receive buffers.
static ScaleAllreduce resolve(ScaleAllreduce asked) {
  return asked == SCALE_ALLREDUCE_AUTO ? SCALE_ALLREDUCE_BINOMIAL : asked;
}

// The gradient average over N > 1 nodes: its time on the link (*link_ms, latency included) and
// the part of it that outlasts backward (*exposed_ms). Each bucket can start once backward has
// written it, and the link carries the buckets one after another: the last bucket is always
// exposed, and a link slower than backward exposes the backlog too.
static void gradient_on_link(const StepTraffic *t, int N, ScaleAllreduce alg, double backward_ms,
                             double ms_per_byte, double latency_ms, double *link_ms,
                             double *exposed_ms, double *latency_total_ms) {
  *link_ms = *exposed_ms = *latency_total_ms = 0;
  if (!(t->allreduce_payload_bytes > 0)) return;
  // Bytes through the busiest link per payload byte, and rounds, one bucket's sum.
  const double through = alg == SCALE_ALLREDUCE_RING ? 2.0 * (N - 1) / N : 2 * log2_rounds(N);
  const double rounds = alg == SCALE_ALLREDUCE_RING ? 2.0 * (N - 1) : 2 * log2_rounds(N);
  const int K = t->gradient_buckets > 0 ? t->gradient_buckets : 1;
  double done_ms = 0;
  for (int k = 0; k < K; k++) {
    const double bytes = t->gradient_buckets > 0 ? t->bucket_bytes[k] : t->allreduce_payload_bytes;
    const double ready = t->gradient_buckets > 0 ? t->bucket_ready[k] : 1;
    const double bucket_ms = through * bytes * ms_per_byte + rounds * latency_ms;
    done_ms = fmax(done_ms, backward_ms * ready) + bucket_ms;
    *link_ms += bucket_ms;
    *latency_total_ms += rounds * latency_ms;
  }
  *exposed_ms = fmax(0, done_ms - backward_ms);
}

void scaling_predict(const MeasuredRun *m, const StepTraffic *t, const ScaleQuestion *q,
                     ScalePrediction *p) {
  const int N = q->nodes;
  memset(p, 0, sizeof *p);
  p->nodes = N;
  p->link_bytes_per_s = q->link_bytes_per_s;
  p->allreduce = resolve(q->allreduce);
  p->global_batch = q->keep_replica_batch ? m->local_batch * N : m->global_batch;
  p->local_batch = q->keep_replica_batch ? m->local_batch : (p->global_batch + N - 1) / N;
  // Per-sample work scales with the samples a replica holds; the measured time is one replica's.
  // Compute is the step outside its collectives (the measured run's own were in memory); the
  // update is per parameter and does not scale.
  const double scale = (double)p->local_batch / m->local_batch;
  const double per_sample_ms = fmax(0, m->step_ms - m->comm_ms - m->optimizer_ms);
  p->compute_ms = per_sample_ms * scale + m->optimizer_ms;
  if (N > 1) {
    const double ms_per_byte = 1e3 / q->link_bytes_per_s, latency_ms = q->latency_s * 1e3;
    // Replicas of the measured run waited for the slowest at their collectives: compute that
    // varies from replica to replica, so it scales with the samples. Not extrapolated in N.
    p->wait_ms = m->replicas > 1 ? m->comm_ms * scale : 0;
    double gradient_latency_ms;
    gradient_on_link(t, N, p->allreduce, m->backward_ms * scale, ms_per_byte, latency_ms,
                     &p->gradient_ms, &p->gradient_exposed_ms, &gradient_latency_ms);
    const long other_sums = t->allreduce_calls > 1 ? t->allreduce_calls - 1 : 0;
    const double sums_latency_ms = (double)other_sums * log2_rounds(N) * latency_ms;
    p->sums_ms = 2.0 * (N - 1) / N * scaling_other_sum_bytes(t, p->global_batch) * ms_per_byte +
                 sums_latency_ms;
    const double gather_latency_ms =
        (double)t->allgather_calls * (log2_rounds(N) + (N - 1)) * latency_ms;
    p->allgather_ms = (double)(N - 1) * p->local_batch * t->gather_bytes_per_sample * ms_per_byte +
                      gather_latency_ms;
    p->latency_ms = gradient_latency_ms + sums_latency_ms + gather_latency_ms;
  }
  p->link_ms = p->gradient_ms + p->sums_ms + p->allgather_ms;
  p->comm_ms = p->wait_ms + p->gradient_exposed_ms + p->sums_ms + p->allgather_ms;
  p->step_ms = p->compute_ms + p->comm_ms;
  p->step_ms_no_overlap = p->compute_ms + p->wait_ms + p->link_ms;
  p->images_per_s = p->global_batch / (p->step_ms / 1e3);
}

int scaling_parse_rate(const char *text, double *bytes_per_s) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || errno || !(v > 0) || !isfinite(v))
    return tl_fail("--link '%s': expected a rate such as 10Gbit, 100Mbit or 125MB/s", text);
  while (*end == ' ') end++;
  char unit[32];
  snprintf(unit, sizeof unit, "%s", end);
  size_t len = strlen(unit);
  if (len > 2 && strcasecmp(unit + len - 2, "/s") == 0) unit[len - 2] = 0;
  if (len > 2 && strcasecmp(unit + len - 2, "ps") == 0) unit[len - 2] = 0;
  static const struct {
    const char *unit;
    double bytes;
  } units[] = {{"bit", 0.125}, {"kbit", 125}, {"mbit", 125e3}, {"gbit", 125e6}, {"tbit", 125e9},
               {"b", 1},       {"kb", 1e3},   {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (strcasecmp(unit, units[i].unit) == 0) {
      // Bits and bytes differ only by case in "Mb"/"MB": a lone b is bytes, as MB/s and GB/s.
      *bytes_per_s = v * units[i].bytes;
      return 0;
    }
  return tl_fail("--link '%s': unknown unit (kbit, Mbit, Gbit, Tbit; KB/s, MB/s, GB/s)", text);
}

int scaling_payload_rate(double line_bytes_per_s, long mtu, double *payload_bytes_per_s) {
  if (mtu == 0) {
    *payload_bytes_per_s = line_bytes_per_s;
    return 0;
  }
  if (mtu < 576 || mtu > 65536)
    return tl_fail(
        "--mtu %ld: expected 576 to 65536 bytes (1500 for Ethernet, 9000 for jumbo "
        "frames), or 0 when the rate is already TCP's payload rate",
        mtu);
  *payload_bytes_per_s = line_bytes_per_s * (double)(mtu - 52) / (double)(mtu + 38);
  return 0;
}

static const char *const allreduce_names[] = {"auto", "ring", "binomial"};

int scaling_parse_allreduce(const char *text, ScaleAllreduce *out) {
  for (int a = 0; a < 3; a++)
    if (strcasecmp(text, allreduce_names[a]) == 0) {
      *out = (ScaleAllreduce)a;
      return 0;
    }
  return tl_fail("--allreduce '%s': expected ring, binomial or auto", text);
}

const char *scaling_allreduce_name(ScaleAllreduce a) {
  return a >= 0 && a < 3 ? allreduce_names[a] : "?";
}

int scaling_parse_latency(const char *text, double *seconds) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || errno || !(v >= 0) || !isfinite(v))
    return tl_fail("--latency '%s': expected a time such as 50us or 0.2ms", text);
  while (*end == ' ') end++;
  static const struct {
    const char *unit;
    double seconds;
  } units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (strcasecmp(end, units[i].unit) == 0) {
      *seconds = v * units[i].seconds;
      return 0;
    }
  // A bare 0 needs no unit; any other bare number is ambiguous.
  if (!*end && v == 0) {
    *seconds = 0;
    return 0;
  }
  return tl_fail("--latency '%s': unknown unit (ns, us, ms, s)", text);
}

void scaling_print_setup(FILE *f, const ScalingSetup *s) {
  const MeasuredRun *m = &s->run;
  const StepTraffic *t = &s->traffic;
  const ScaleQuestion *q = &s->question;
  fprintf(f,
          "tally plan: %s from %s (%d replica%s of %d images; per step: compute %.1f ms, "
          "backward %.1f ms, waiting for the slower replica %.1f ms),\n",
          s->objective, s->run_dir, m->replicas, m->replicas == 1 ? "" : "s", m->local_batch,
          m->step_ms - m->comm_ms, m->backward_ms, m->replicas > 1 ? m->comm_ms : 0.0);
  char framing[64];
  if (s->mtu)
    snprintf(framing, sizeof framing, "TCP payload %.4g Gbit/s at MTU %ld",
             q->link_bytes_per_s * 8 / 1e9, s->mtu);
  else
    snprintf(framing, sizeof framing, "taken as TCP payload");
  fprintf(f,
          "link %.4g Gbit/s (%s) with %.3g us latency, one "
          "replica per node, %s; gradient allreduce %.2f MB in %d bucket%s (%s), other sums %.0f "
          "bytes (%.0f a sample of the global batch), gathers %.0f bytes per sample; %ld "
          "allreduces and %ld gathers per step\n",
          s->line_bytes_per_s * 8 / 1e9, framing, q->latency_s * 1e6,
          q->keep_replica_batch ? "each keeps the measured per-replica batch"
                                : "the measured global batch split over the nodes",
          t->allreduce_payload_bytes / 1e6, t->gradient_buckets,
          t->gradient_buckets == 1 ? "" : "s", scaling_allreduce_name(resolve(q->allreduce)),
          scaling_other_sum_bytes(t, m->global_batch), t->other_allreduce_bytes_per_sample,
          t->gather_bytes_per_sample, t->allreduce_calls, t->allgather_calls);
  fprintf(f, "gradient buckets in the order they start (MB, written by this share of backward):");
  for (int b = 0; b < t->gradient_buckets; b++)
    fprintf(f, " %.2f (%.0f%%)", t->bucket_bytes[b] / 1e6, 100 * t->bucket_ready[b]);
  fprintf(f, "\n");
  // Efficiency: the share of a step spent computing, i.e. images/s against N nodes that never
  // wait for the link.
  fprintf(f, "%7s %7s %7s %11s %9s %11s %11s %13s %11s %10s\n", "nodes", "batch", "/node",
          "compute ms", "link ms", "comm ms", "step ms", "no-overlap ms", "images/s", "efficiency");
}

void scaling_print_prediction(FILE *f, const ScalingSetup *s, long nodes, int json) {
  ScaleQuestion q = s->question;
  q.nodes = (int)nodes;
  ScalePrediction p;
  scaling_predict(&s->run, &s->traffic, &q, &p);
  if (json)
    fprintf(f,
            "{\"objective\":\"%s\",\"nodes\":%ld,\"link_bytes_per_s\":%.6g,\"mtu\":%ld,"
            "\"payload_bytes_per_s\":%.6g,\"latency_s\":%.6g,\"allreduce\":\"%s\","
            "\"local_batch\":%d,\"global_batch\":%d,"
            "\"predicted_compute_ms\":%.3f,\"predicted_wait_ms\":%.3f,"
            "\"predicted_link_ms\":%.3f,\"predicted_comm_ms\":%.3f,\"predicted_step_ms\":%.3f,"
            "\"predicted_step_ms_no_overlap\":%.3f,\"predicted_images_per_s\":%.2f}\n",
            s->objective, nodes, s->line_bytes_per_s, s->mtu, q.link_bytes_per_s, q.latency_s,
            scaling_allreduce_name(p.allreduce), p.local_batch, p.global_batch, p.compute_ms,
            p.wait_ms, p.link_ms, p.comm_ms, p.step_ms, p.step_ms_no_overlap, p.images_per_s);
  else
    fprintf(f, "%7ld %7d %7d %11.1f %9.1f %11.1f %11.1f %13.1f %11.0f %9.0f%%\n", nodes,
            p.global_batch, p.local_batch, p.compute_ms, p.link_ms, p.comm_ms, p.step_ms,
            p.step_ms_no_overlap, p.images_per_s, 100 * p.compute_ms / p.step_ms);
}
