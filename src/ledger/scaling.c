#include "ledger/scaling.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
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
  FILE *f = fopen(path, "r");
  if (!f) return tl_fail("%s: cannot read: %s", path, strerror(errno));
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
    if (ledger_read_json(line, &r) < 0) continue;  // a cut-off last line
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

// Open MPI's choice for an allreduce (its tuned component's fixed rule): recursive doubling
// under 10 kB, a ring above. Rounds of messages one node waits for, one after another.
static double allreduce_rounds(int nodes, double payload_bytes) {
  return payload_bytes < 10e3 ? ceil(log2(nodes)) : 2.0 * (nodes - 1);
}

void scaling_predict(const MeasuredRun *m, const StepTraffic *t, const ScaleQuestion *q,
                     ScalePrediction *p) {
  const int N = q->nodes;
  memset(p, 0, sizeof *p);
  p->nodes = N;
  p->link_bytes_per_s = q->link_bytes_per_s;
  p->global_batch = q->keep_replica_batch ? m->local_batch * N : m->global_batch;
  p->local_batch = q->keep_replica_batch ? m->local_batch : (p->global_batch + N - 1) / N;
  // Per-sample work scales with the samples a replica holds; the measured time is one replica's.
  double scale = (double)p->local_batch / m->local_batch;
  double forward = m->forward_ms * scale, backward = m->backward_ms * scale;
  double data = m->data_ms * scale, optimizer = m->optimizer_ms;  // the update is per parameter
  p->compute_ms = data + forward + backward + optimizer;
  const double ms_per_byte = 1e3 / q->link_bytes_per_s, latency_ms = q->latency_s * 1e3;
  // The gradient average; the step's other allreduces carry a few numbers each, so only their
  // latency counts. The gathers' blocks grow with N and their ring takes N - 1 rounds.
  double gradient_ms = 0, small_sums_ms = 0;
  if (N > 1) {
    double gradient_latency_ms = allreduce_rounds(N, t->allreduce_payload_bytes) * latency_ms;
    small_sums_ms = (double)(t->allreduce_calls > 1 ? t->allreduce_calls - 1 : 0) *
                    allreduce_rounds(N, 0) * latency_ms;
    double gather_latency_ms = (double)t->allgather_calls * (N - 1) * latency_ms;
    gradient_ms =
        2.0 * (N - 1) / N * t->allreduce_payload_bytes * ms_per_byte + gradient_latency_ms;
    p->allgather_ms = (double)(N - 1) * p->local_batch * t->gather_bytes_per_sample * ms_per_byte +
                      gather_latency_ms;
    p->latency_ms = gradient_latency_ms + small_sums_ms + gather_latency_ms;
  }
  p->allreduce_ms = gradient_ms + small_sums_ms;
  p->comm_ms = p->allreduce_ms + p->allgather_ms;
  p->step_ms_no_overlap = p->compute_ms + p->comm_ms;
  // Gradient buckets are averaged while backward goes on: the gradient average costs only what
  // backward does not hide. Gathers (projections, keys) sit between forward and the loss, the
  // small sums after backward: not hidden.
  p->step_ms =
      data + forward + fmax(backward, gradient_ms) + optimizer + small_sums_ms + p->allgather_ms;
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
