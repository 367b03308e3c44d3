#include "plan/plan_scaling.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/checkpoint.h"
#include "encoder/export.h"
#include "plan/plan.h"

// What one step sends, from plans: the gradient block every replica averages and the buckets it
// is averaged in, the other sums' payload (a two-replica ring moves 2 (2-1)/2 = 1 times each
// payload each way, so half the allreduce bytes are payload), what a sample adds to the gathers
// (rank 0 sends its block and receives the other, 2 x its block), and the collectives it calls
// (two replicas take every multi-replica path, as N do).
int plan_step_traffic(const Config *cfg, const char *objective, StepTraffic *t) {
  static Config two;
  two = *cfg;
  if (config_set(&two, "parallel.backend=local") != 0 ||
      config_set(&two, "parallel.replicas=2") != 0 ||
      config_set(&two, "eval.knn_train_limit=0") != 0)
    return -1;
  const PlanOptions no_knn = {.no_knn = 1};
  LedgerRecord rec;
  PlanTotals totals;
  if (plan_build(&two, objective, 0, &no_knn, &rec, &totals) != 0) return -1;
  static double bucket_bytes[PLAN_MAX_BUCKETS], bucket_ready[PLAN_MAX_BUCKETS];
  for (int b = 0; b < totals.grad_buckets; b++) {
    bucket_bytes[b] = (double)totals.grad_bucket_floats[b] * sizeof(float);
    bucket_ready[b] = totals.grad_bucket_ready[b];
  }
  t->allreduce_payload_bytes = (double)totals.param_count * sizeof(float);
  t->gradient_buckets = totals.grad_buckets;
  t->bucket_bytes = bucket_bytes;
  t->bucket_ready = bucket_ready;
  const double other = fmax(0, rec.comm_allreduce_bytes / 2.0 - t->allreduce_payload_bytes);
  t->gather_bytes_per_sample = rec.comm_allgather_bytes / 2.0 / totals.local_batch;
  t->allreduce_calls = rec.comm_allreduce_calls;
  t->allgather_calls = rec.comm_allgather_calls;
  // Some sums grow with the global batch (inbatch's column gradients, 2 x batch x d floats): a
  // plan of twice the batch tells that part from the fixed. (Twice keeps every divisibility
  // the batch met: shards, bn_splits; half would not.)
  const int batch = two.train.batch_size;
  static Config doubled;
  LedgerRecord rec2;
  PlanTotals totals2;
  char set[64];
  snprintf(set, sizeof set, "train.batch_size=%d", 2 * batch);
  doubled = two;
  t->other_allreduce_bytes = other, t->other_allreduce_bytes_per_sample = 0;
  if (config_set(&doubled, set) != 0 ||
      plan_build(&doubled, objective, 0, &no_knn, &rec2, &totals2) != 0) {
    fprintf(stderr,
            "tally plan: warning: no plan at twice the batch (%s); every sum is taken as fixed, "
            "at the measured run's global batch\n",
            tl_last_error());
    return 0;
  }
  const double other2 = fmax(0, rec2.comm_allreduce_bytes / 2.0 - t->allreduce_payload_bytes);
  t->other_allreduce_bytes_per_sample = fmax(0, (other2 - other) / batch);
  t->other_allreduce_bytes = fmax(0, other - t->other_allreduce_bytes_per_sample * batch);
  return 0;
}

int plan_scaling_setup(const char *run_dir, ScalingSetup *s) {
  char ckpt[4200];
  snprintf(ckpt, sizeof ckpt, "%s/%s", run_dir, CHECKPOINT_FILE);
  static Config cfg;
  StFile f;
  if (checkpoint_read(&f, ckpt) != 0) return -1;
  const char *name = st_get_meta(&f, "objective");
  snprintf(s->objective, sizeof s->objective, "%s", name ? name : "");
  s->run_dir = run_dir;
  int rc = checkpoint_config(&f, ckpt, &cfg);
  st_free(&f);
  if (rc == 0) rc = scaling_read_run(run_dir, &s->run);
  if (rc == 0) rc = plan_step_traffic(&cfg, s->objective, &s->traffic);
  return rc;
}

// The link and the question from r's texts. 0, or -1 with tl_last_error() naming the option.
static int scaling_link(const ScalingRequest *r, ScalingSetup *s) {
  ScaleQuestion *q = &s->question;
  q->keep_replica_batch = r->keep_replica_batch;
  char *end;
  errno = 0;
  s->mtu = strtol(r->mtu, &end, 10);
  if (end == r->mtu || *end || s->mtu < 0 || errno)
    return tl_fail("--mtu '%s': expected a whole number of at least 0", r->mtu);
  if (scaling_parse_rate(r->link, &s->line_bytes_per_s) != 0 ||
      scaling_payload_rate(s->line_bytes_per_s, s->mtu, &q->link_bytes_per_s) != 0 ||
      scaling_parse_latency(r->latency, &q->latency_s) != 0 ||
      scaling_parse_allreduce(r->allreduce, &q->allreduce) != 0)
    return -1;
  return 0;
}

int plan_scaling_print(FILE *f, const ScalingRequest *r) {
  static ScalingSetup s;
  memset(&s, 0, sizeof s);
  if (scaling_link(r, &s) != 0) return 2;
  if (plan_scaling_setup(r->run_dir, &s) != 0) return 1;
  if (!r->json) scaling_print_setup(f, &s);
  char copy[256];
  snprintf(copy, sizeof copy, "%s", r->nodes);
  for (char *save, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    long nodes = strtol(tok, &end, 10);
    if (end == tok || *end || nodes < 1 || nodes > 1000000) {
      tl_fail("--nodes '%s': expected node counts such as 2,8,64", r->nodes);
      return 2;
    }
    scaling_print_prediction(f, &s, nodes, r->json);
  }
  return 0;
}
