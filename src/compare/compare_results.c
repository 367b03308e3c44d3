#include "compare/compare_results.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "eval/quality.h"
#include "io/atomic_file.h"
#include "io/json_read.h"
#include "io/json_write.h"
#include "io/regular_file.h"
#include "ledger/chart.h"
#include "ledger/record.h"
#include "objectives/objective.h"
#include "train/checkpoint.h"

typedef enum { FROM_EVAL, FROM_SUMMARY, FROM_LEDGER } Source;

// Where each measure is read and how compare.json groups it: at the cell's top, under
// "per_step" (the ledger's answers for one step) or under "raw_pixels" (the baselines).
static const struct {
  const char *name;   // in compare.json
  const char *group;  // NULL, "per_step" or "raw_pixels"
  const char *label;  // in compare.html's table
  Source source;
  const char *field;  // in tally eval --json, summary.json or the ledger
  int first_seed_only;
  LedgerUnit unit;  // how the terminal and compare.html show it (ledger_format_value)
} measures[N_MEASURES] = {
    [M_KNN] = {"knn_top1", NULL, "kNN top-1", FROM_EVAL, "knn_top1", 0, UNIT_FRACTION},
    [M_KNN_K] = {"knn_k", NULL, "kNN k", FROM_EVAL, "knn_k", 0, UNIT_RATIO},
    [M_KNN20] = {"knn_top1_k20", NULL, "kNN top-1 (k=20)", FROM_EVAL, "knn_top1_k20", 0,
                 UNIT_FRACTION},
    [M_LINEAR] = {"linear_top1", NULL, "linear probe", FROM_EVAL, "linear_top1", 0, UNIT_FRACTION},
    [M_COLLAPSED] = {"collapsed", NULL, "collapsed", FROM_EVAL, "collapsed", 0, UNIT_FLAG},
    [M_RANKME] = {"rankme", NULL, "rankme", FROM_EVAL, "rankme", 0, UNIT_RATIO},
    [M_EMBEDDING_STD] = {"embedding_std", NULL, "embedding std", FROM_EVAL, "embedding_std", 0,
                         UNIT_RATIO},
    // The ledger's cumulative count, to 9 digits (summary.json's has 6).
    [M_FLOPS] = {"flops_total", NULL, "training FLOP", FROM_LEDGER, "flops_total", 0, UNIT_FLOPS},
    [M_SECONDS] = {"train_seconds", NULL, "training s", FROM_SUMMARY, "train_seconds", 0,
                   UNIT_SECONDS},
    [M_PEAK_RSS] = {"peak_rss_bytes", NULL, "peak RSS", FROM_SUMMARY, "peak_rss_bytes", 0,
                    UNIT_BYTES},
    [M_VIEWS_GRAD] = {"views_grad", "per_step", "views with gradient", FROM_LEDGER, "views_grad", 0,
                      UNIT_COUNT},
    [M_VIEWS_NOGRAD] = {"views_nograd", "per_step", "views without", FROM_LEDGER, "views_nograd", 0,
                        UNIT_COUNT},
    [M_ACTIVATION_BYTES] = {"activation_bytes", "per_step", "activations", FROM_LEDGER,
                            "activation_bytes", 0, UNIT_BYTES},
    [M_QUEUE_VECTORS] = {"queue_vectors", "per_step", "cached vectors", FROM_LEDGER,
                         "queue_vectors", 0, UNIT_COUNT},
    [M_ENCODINGS_NEW] = {"encodings_next_new", "per_step", "encodings anew", FROM_LEDGER,
                         "encodings_next_new", 0, UNIT_COUNT},
    [M_ENCODINGS_REUSED] = {"encodings_next_reused", "per_step", "encodings reused", FROM_LEDGER,
                            "encodings_next_reused", 0, UNIT_COUNT},
    [M_KNN_RAW] = {"knn_top1", "raw_pixels", "kNN on raw pixels", FROM_EVAL, "knn_top1_raw_pixels",
                   1, UNIT_FRACTION},
    [M_KNN20_RAW] = {"knn_top1_k20", "raw_pixels", "kNN (k=20) on raw pixels", FROM_EVAL,
                     "knn_top1_k20_raw_pixels", 1, UNIT_FRACTION},
    [M_LINEAR_RAW] = {"linear_top1", "raw_pixels", "linear probe on raw pixels", FROM_EVAL,
                      "linear_top1_raw_pixels", 1, UNIT_FRACTION},
    [M_EVAL_SECONDS] = {"eval_seconds", NULL, "evaluation s", FROM_EVAL, "seconds", 0,
                        UNIT_SECONDS},
};

// ---- statistics ----

// Student's t, 0.975 quantile, for 1..29 degrees of freedom (scipy.stats.t.ppf(0.975, df), to 4
// decimals): a compare has at most 30 seeds.
static const double t975[] = {12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060,
                              2.2622,  2.2281, 2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199,
                              2.1098,  2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
                              2.0595,  2.0555, 2.0518, 2.0484, 2.0452};

double t_quantile_975(int df) {
  const int n = (int)(sizeof t975 / sizeof *t975);
  return df >= 1 && df <= n ? t975[df - 1] : NAN;
}

static double logit(double p) {
  p = fmin(fmax(p, COMPARE_FRACTION_EPS), 1 - COMPARE_FRACTION_EPS);
  return log(p / (1 - p));
}

void seed_stats(SeedStats *s, int bounded) {
  double sum = 0, sum_t = 0;
  s->n = 0;
  for (int i = 0; i < s->n_values; i++)
    if (isfinite(s->values[i]))
      sum += s->values[i], sum_t += bounded ? logit(s->values[i]) : s->values[i], s->n++;
  s->mean = s->n ? sum / s->n : NAN;
  s->lo = s->hi = NAN;
  if (s->n < 2) return;
  const double mean_t = sum_t / s->n;
  double squares = 0;
  for (int i = 0; i < s->n_values; i++)
    if (isfinite(s->values[i])) {
      const double t = bounded ? logit(s->values[i]) : s->values[i];
      squares += (t - mean_t) * (t - mean_t);
    }
  double half = t_quantile_975(s->n - 1) * sqrt(squares / (s->n - 1)) / sqrt(s->n);
  if (bounded) {
    s->lo = fmin(1 / (1 + exp(-(mean_t - half))), s->mean);
    s->hi = fmax(1 / (1 + exp(-(mean_t + half))), s->mean);
  } else {
    s->lo = fmax(0, mean_t - half);
    s->hi = mean_t + half;
  }
}

// ---- reading the runs ----

// The last whole record of DIR/ledger.jsonl into *r.
static int last_ledger_record(const char *dir, LedgerRecord *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
  FILE *f = regular_fopen(path, "r");
  if (!f) return -1;
  char *line = NULL;
  size_t cap = 0;
  int found = 0;
  while (getline(&line, &cap, f) > 0) {
    LedgerRecord rec = {0};
    if (ledger_read_json(line, &rec, objective_ledger_fields) >= 0) *r = rec, found = 1;
  }
  free(line);
  fclose(f);
  return found ? 0 : tl_fail("%s: no ledger record", path);
}

// A file of the run folder `dir`, whole: 0, or -1 with tl_last_error() naming it (missing, cut
// off, another kind of file, a member missing).
static int read_whole(const char *dir, const char *name, const JsonMember *members, int n,
                      char **text) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int rc = regular_read_text(path, text, NULL);
  if (rc > 0) return tl_fail("%s: missing", path);
  if (rc == 0 && json_flat_require(*text, path, members, n) != 0) rc = -1;
  if (rc != 0) free(*text), *text = NULL;
  return rc;
}

static const JsonMember eval_members[] = {{"source", JSON_STRING},
                                          {"step", JSON_NUMBER},
                                          {"source_crc32", JSON_STRING},
                                          {"n_train", JSON_NUMBER},
                                          {"knn_top1", JSON_NUMBER_OR_NULL},
                                          {"knn_top1_k20", JSON_NUMBER_OR_NULL},
                                          {"knn_top1_raw_pixels", JSON_NUMBER_OR_NULL},
                                          {"knn_top1_k20_raw_pixels", JSON_NUMBER_OR_NULL},
                                          {"linear_top1", JSON_NUMBER_OR_NULL},
                                          {"linear_top1_raw_pixels", JSON_NUMBER_OR_NULL},
                                          {"rankme", JSON_NUMBER_OR_NULL},
                                          {"embedding_std", JSON_NUMBER_OR_NULL},
                                          {"collapsed", JSON_BOOL},
                                          {"seconds", JSON_NUMBER}};
static const JsonMember summary_members[] = {
    {"steps", JSON_NUMBER}, {"train_seconds", JSON_NUMBER}, {"peak_rss_bytes", JSON_NUMBER}};

// The checkpoint's own word on what it is: its step, its CRC-32, and the ledger line it saw.
typedef struct {
  long step, ledger_step;
  unsigned long ledger_crc;
  char crc32[16];
} CheckpointId;

static int checkpoint_id(const char *dir, CheckpointId *id) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_FILE);
  StFile f;
  if (checkpoint_read(&f, path) != 0) return -1;
  const char *crc = st_get_meta(&f, "crc32"), *ledger_step = st_get_meta(&f, "ledger_last_step"),
             *ledger_crc = st_get_meta(&f, "ledger_last_crc");
  id->step = checkpoint_step(&f);
  snprintf(id->crc32, sizeof id->crc32, "%s", crc ? crc : "");
  id->ledger_step = ledger_step && ledger_crc ? strtol(ledger_step, NULL, 10) : -1;
  id->ledger_crc = ledger_crc ? strtoul(ledger_crc, NULL, 10) : 0;
  st_free(&f);
  return 0;
}

int compare_read_run(const char *dir, char **eval, char **summary, LedgerRecord *last) {
  *eval = *summary = NULL;
  CheckpointId id;
  char path[4200], crc[16];
  if (checkpoint_id(dir, &id) != 0 ||
      read_whole(dir, COMPARE_EVAL_FILE, eval_members,
                 (int)(sizeof eval_members / sizeof *eval_members), eval) != 0)
    return -1;
  json_flat_string(*eval, "source_crc32", crc, sizeof crc);
  const double step = json_flat_number(*eval, "step");
  snprintf(path, sizeof path, "%s/%s", dir, COMPARE_EVAL_FILE);
  int rc = 0;
  if (step != id.step || strcmp(crc, id.crc32) != 0)
    rc = tl_fail(
        "%s: is not the evaluation of this run's checkpoint (step %.0f, CRC-32 %s; the "
        "checkpoint's: step %ld, CRC-32 %s); remove it, and the compare evaluates the run anew",
        path, step, crc[0] ? crc : "none", id.step, id.crc32[0] ? id.crc32 : "none");
  if (rc == 0)
    rc = read_whole(dir, "summary.json", summary_members,
                    (int)(sizeof summary_members / sizeof *summary_members), summary);
  snprintf(path, sizeof path, "%s/summary.json", dir);
  if (rc == 0 && json_flat_number(*summary, "steps") != id.step)
    rc = tl_fail("%s: is the summary of %.0f steps, the checkpoint holds %ld", path,
                 json_flat_number(*summary, "steps"), id.step);
  snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
  if (rc == 0 && id.ledger_step >= 0) rc = ledger_check_own(path, id.ledger_step, id.ledger_crc);
  if (rc == 0 && last) rc = last_ledger_record(dir, last);
  if (rc != 0) {
    free(*eval);
    free(*summary);
    *eval = *summary = NULL;
  }
  return rc;
}

int compare_collect(const CompareSpec *spec, CompareCell *cells) {
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      CompareCell *c = &cells[o * spec->n_budgets + b];
      memset(c, 0, sizeof *c);
      c->objective = spec->objectives[o];
      c->budget = spec->budgets[b];
      for (int s = 0; s < spec->n_seeds; s++) {
        char dir[4096], *eval = NULL, *summary = NULL;
        LedgerRecord rec;
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        if (compare_read_run(dir, &eval, &summary, &rec) != 0) return -1;
        for (int m = 0; m < N_MEASURES; m++) {
          SeedStats *st = &c->m[m];
          if (measures[m].first_seed_only && s > 0) continue;
          double v = m == M_COLLAPSED                  ? json_flat_bool(eval, measures[m].field)
                     : measures[m].source == FROM_EVAL ? json_flat_number(eval, measures[m].field)
                     : measures[m].source == FROM_SUMMARY
                         ? json_flat_number(summary, measures[m].field)
                         : ledger_value(&rec, measures[m].field);
          // A field only some objectives declare (moco's queue_vectors): the others cache none.
          // A common field stays NaN when the record lacks it, as any missing measure does.
          if (measures[m].source == FROM_LEDGER && isnan(v) &&
              ledger_field_find(measures[m].field) < 0 &&
              ledger_own_find(rec.own_fields, measures[m].field) < 0)
            v = 0;
          st->values[st->n_values++] = v;
        }
        free(eval);
        free(summary);
      }
      for (int m = 0; m < N_MEASURES; m++) seed_stats(&c->m[m], measures[m].unit == UNIT_FRACTION);
    }
  return 0;
}

// ---- the verdict ----

static const char *measure_words(int m) { return m == M_LINEAR ? "the linear probe" : "kNN"; }

// "81.2% (95% interval 79.5-82.9%, 3 seeds)" or "81.2% (1 seed, no interval)".
static void describe(const SeedStats *s, char *out, size_t n) {
  if (s->n >= 2)
    snprintf(out, n, "%.1f%% (95%% interval %.1f-%.1f%%, %d seeds)", 100 * s->mean, 100 * s->lo,
             100 * s->hi, s->n);
  else
    snprintf(out, n, "%.1f%% (%d seed, no interval)", 100 * s->mean, s->n);
}

// An objective's cell at budget b.
static const CompareCell *cell_at(const CompareSpec *spec, const CompareCell *cells, int o, int b) {
  return &cells[o * spec->n_budgets + b];
}

// Collapsed in any seed: such an encoder is never recommended, whatever it scores.
static int collapsed(const CompareCell *c) {
  return c->m[M_COLLAPSED].n > 0 && c->m[M_COLLAPSED].mean > 0;
}

// The objectives with a score on measure m at budget b, best mean first, into order[]; returns
// how many.
static int rank_by(const CompareSpec *spec, const CompareCell *cells, int b, int m, int *order) {
  int k = 0;
  for (int o = 0; o < spec->n_objectives; o++)
    if (cell_at(spec, cells, o, b)->m[m].n > 0) order[k++] = o;
  for (int i = 1; i < k; i++)  // insertion sort: a handful of objectives
    for (int j = i; j > 0 && cell_at(spec, cells, order[j], b)->m[m].mean >
                                 cell_at(spec, cells, order[j - 1], b)->m[m].mean;
         j--) {
      const int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  return k;
}

static double raw_baseline(const CompareSpec *spec, const CompareCell *cells, int b, int raw_m) {
  for (int o = 0; o < spec->n_objectives; o++)
    if (isfinite(cell_at(spec, cells, o, b)->m[raw_m].mean))
      return cell_at(spec, cells, o, b)->m[raw_m].mean;
  return NAN;
}

#define APPEND(...) (void)(at < n ? at += (size_t)snprintf(out + at, n - at, __VA_ARGS__) : 0)

// One measure's sentences: the best objective that did not collapse, how sure the seeds are of
// the order, and where raw pixels stand. Returns the objective it names best, or -1.
static int verdict_measure(const CompareSpec *spec, const CompareCell *cells, int b, int m,
                           char *out, size_t n, size_t *at_io) {
  size_t at = *at_io;
  int order[COMPARE_MAX_OBJECTIVES];
  const int k = rank_by(spec, cells, b, m, order);
  char text[160], what[64];
  int best = -1;
  for (int i = 0; i < k && best < 0; i++)
    if (!collapsed(cell_at(spec, cells, order[i], b))) best = order[i];
  if (m == M_KNN) {
    const SeedStats *ks = &cell_at(spec, cells, order[0], b)->m[M_KNN_K];
    snprintf(what, sizeof what, "kNN (cosine, k = %.0f)", ks->n ? ks->mean : NAN);
  } else {
    snprintf(what, sizeof what, "%s", measure_words(m));
  }
  if (best < 0) {
    APPEND(" By %s: every objective's encoder collapsed; none is recommended.", what);
    *at_io = at;
    return -1;
  }
  const SeedStats *top = &cell_at(spec, cells, best, b)->m[m];
  describe(top, text, sizeof text);
  APPEND(" By %s: %s scores best, %s", what, spec->objectives[best], text);
  if (best != order[0]) APPEND(" (%s scores higher but collapsed)", spec->objectives[order[0]]);
  APPEND(".");
  int min_n = COMPARE_MAX_SEEDS;
  for (int i = 0; i < k; i++) {
    const int seeds = cell_at(spec, cells, order[i], b)->m[m].n;
    if (seeds < min_n) min_n = seeds;
  }
  int within = 0;
  for (int i = 0; i < k; i++) {
    const SeedStats *s = &cell_at(spec, cells, order[i], b)->m[m];
    if (order[i] == best || collapsed(cell_at(spec, cells, order[i], b))) continue;
    if (min_n >= 2 && s->hi >= top->lo) {
      describe(s, text, sizeof text);
      APPEND("%s %s, %s", within++ ? ";" : " Within its interval:", spec->objectives[order[i]],
             text);
    }
  }
  if (k == 1)
    APPEND(" It is the only objective with a score.");
  else if (min_n < 2)
    APPEND(
        " With one seed there is no interval: the order is a single draw and may not repeat; "
        "run more seeds (--seeds 3 or more) before choosing.");
  else if (min_n == 2 && within)
    APPEND(
        ". Two seeds give intervals too wide to tell objectives apart (Student's t is 12.7 at "
        "one degree of freedom): run --seeds 3 or more before choosing.");
  else if (within)
    APPEND(
        ". These differences are within the 95%% intervals: the seeds do not tell %s apart "
        "from %s; more seeds narrow the intervals.",
        within == 1 ? "it" : "them", spec->objectives[best]);
  else
    APPEND(" Its interval is clear of every other objective's: the lead holds over these seeds.");
  const double raw = raw_baseline(spec, cells, b, m == M_LINEAR ? M_LINEAR_RAW : M_KNN_RAW);
  if (isfinite(raw)) {
    int below = 0;
    for (int i = 0; i < k; i++) below += cell_at(spec, cells, order[i], b)->m[m].mean < raw;
    if (below == k)
      APPEND(
          " Every objective is below raw pixels (%.1f%%) by %s: at this budget the encoders "
          "are worse features than the images themselves; train longer (a larger --budget).",
          100 * raw, measure_words(m));
    else if (below) {
      APPEND(" Below raw pixels (%.1f%%):", 100 * raw);
      for (int i = k - below, j = 0; i < k; i++, j++)
        APPEND("%s %s", j ? "," : "", spec->objectives[order[i]]);
      APPEND(".");
    } else {
      APPEND(" No objective is below raw pixels (%.1f%%).", 100 * raw);
    }
  }
  *at_io = at;
  return best;
}

void compare_verdict(const CompareSpec *spec, const CompareCell *cells, int b, char *out,
                     size_t n) {
  size_t at = 0;
  out[0] = 0;
  APPEND("%s:", spec->budgets[b]);
  int n_collapsed = 0;
  for (int o = 0; o < spec->n_objectives; o++) {
    const SeedStats *c = &cell_at(spec, cells, o, b)->m[M_COLLAPSED];
    if (!collapsed(cell_at(spec, cells, o, b))) continue;
    APPEND("%s %s collapsed in %.0f of %d seed%s",
           n_collapsed++ ? ";" : " Collapsed encoders:", spec->objectives[o], c->mean * c->n, c->n,
           c->n == 1 ? "" : "s");
  }
  if (n_collapsed)
    APPEND(
        " (embedding_std below %.0f%% of 1/sqrt(d): every image maps to nearly one point); "
        "%s not recommended, whatever %s accuracy.",
        100 * QUALITY_COLLAPSED_FRACTION, n_collapsed == 1 ? "it is" : "they are",
        n_collapsed == 1 ? "its" : "their");
  const CompareMeasure accuracies[] = {M_LINEAR, M_KNN};
  int best[2] = {-1, -1}, scored = 0;
  for (int i = 0; i < 2; i++) {
    int any = 0;
    for (int o = 0; o < spec->n_objectives; o++)
      any |= cell_at(spec, cells, o, b)->m[accuracies[i]].n > 0;
    if (!any) continue;
    scored = 1;
    best[i] = verdict_measure(spec, cells, b, accuracies[i], out, n, &at);
  }
  if (!scored) {
    APPEND(
        " No run had labels, so nothing scores accuracy; compare rankme and embedding_std "
        "(a collapsed encoder reads near 0).");
    return;
  }
  if (best[0] >= 0 && best[1] >= 0 && best[0] == best[1])
    APPEND(" Both measures name %s.", spec->objectives[best[0]]);
  else if (best[0] >= 0 && best[1] >= 0)
    APPEND(
        " The measures disagree: for nearest-neighbour retrieval take %s (kNN), for a linear "
        "classifier on the features %s (the probe).",
        spec->objectives[best[1]], spec->objectives[best[0]]);
}

// ---- compare.json ----

static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.17g", v);
  else
    fputs("null", f);
}

static void json_stats(FILE *f, const SeedStats *s) {
  fputs("{\"mean\": ", f);
  json_num(f, s->mean);
  fputs(", \"ci95\": ", f);
  if (s->n >= 2) {
    fputc('[', f);
    json_num(f, s->lo);
    fputs(", ", f);
    json_num(f, s->hi);
    fputc(']', f);
  } else {
    fputs("null", f);
  }
  fprintf(f, ", \"n\": %d, \"values\": [", s->n);
  for (int i = 0; i < s->n_values; i++) {
    if (i) fputs(", ", f);
    json_num(f, s->values[i]);
  }
  fputs("]}", f);
}

// The measures of one group ("" for the cell's top level), as members of an open object.
static void json_group(FILE *f, const CompareCell *c, const char *group, const char *indent) {
  int first = 1;
  for (int m = 0; m < N_MEASURES; m++) {
    const char *g = measures[m].group ? measures[m].group : "";
    if (strcmp(g, group) != 0) continue;
    fprintf(f, "%s%s\"%s\": ", first ? "" : ",\n", indent, measures[m].name);
    json_stats(f, &c->m[m]);
    first = 0;
  }
}

int compare_write_json(const CompareSpec *spec, const CompareCell *cells, const char *path) {
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  FILE *f = a.f;
  fputs("{\n  \"objectives\": [", f);
  for (int o = 0; o < spec->n_objectives; o++) {
    if (o) fputs(", ", f);
    json_put_string(f, spec->objectives[o]);
  }
  fputs("],\n  \"budgets\": [", f);
  for (int b = 0; b < spec->n_budgets; b++) {
    if (b) fputs(", ", f);
    json_put_string(f, spec->budgets[b]);
  }
  fprintf(f, "],\n  \"seeds\": %d,\n", spec->n_seeds);
  fputs(
      "  \"interval\": \"ci95: mean -/+ t(0.975, n-1) * s / sqrt(n) over the n seeds with a "
      "value, s the sample standard deviation; null for n < 2. Accuracies (knn_top1, "
      "knn_top1_k20, linear_top1) take it on the logit scale, values clamped to [1e-4, 1 - 1e-4], "
      "mapped back and widened to hold the mean; other measures have lo clipped at 0. collapsed: "
      "1 for a seed whose embeddings collapsed, its mean the fraction of seeds\",\n",
      f);
  fputs("  \"results\": {\n", f);
  for (int o = 0; o < spec->n_objectives; o++) {
    fputs("    ", f);
    json_put_string(f, spec->objectives[o]);
    fputs(": {\n", f);
    for (int b = 0; b < spec->n_budgets; b++) {
      const CompareCell *c = &cells[o * spec->n_budgets + b];
      fputs("      ", f);
      json_put_string(f, spec->budgets[b]);
      fputs(": {\n        \"runs\": [", f);
      for (int s = 0; s < spec->n_seeds; s++) {
        char dir[4096];
        compare_run_dir(spec, o, b, s, dir, sizeof dir);
        if (s) fputs(", ", f);
        json_put_string(f, strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir);
      }
      fputs("],\n", f);
      json_group(f, c, "", "        ");
      fputs(",\n        \"per_step\": {\n", f);
      json_group(f, c, "per_step", "          ");
      fputs("\n        },\n        \"raw_pixels\": {\n", f);
      json_group(f, c, "raw_pixels", "          ");
      fprintf(f, "\n        }\n      }%s\n", b + 1 < spec->n_budgets ? "," : "");
    }
    fprintf(f, "    }%s\n", o + 1 < spec->n_objectives ? "," : "");
  }
  fputs("  },\n  \"verdict\": [\n", f);
  for (int b = 0; b < spec->n_budgets; b++) {
    char text[COMPARE_VERDICT_MAX];
    compare_verdict(spec, cells, b, text, sizeof text);
    fputs("    ", f);
    json_put_string(f, text);
    fputs(b + 1 < spec->n_budgets ? ",\n" : "\n", f);
  }
  fputs("  ]\n}\n", f);
  return atomic_commit(&a);
}

// ---- the terminal's table and compare.html ----

// "81.2% [79.5-82.9]" / "2.41 ± 0.08" / "1.20 GiB ± 12.0 MiB" / "1 of 3": the mean in its unit
// (ledger_format_value, as the plan and the report show values), and the 95% interval
// (accuracies) or half of it (other measures) when there is one.
static void show(const SeedStats *s, LedgerUnit unit, char *out, size_t n) {
  if (s->n == 0) {
    snprintf(out, n, "-");
    return;
  }
  if (unit == UNIT_FLAG) {
    snprintf(out, n, "%.0f of %d", s->mean * s->n, s->n);
    return;
  }
  ledger_format_value(unit, s->mean, out, n);
  if (s->n < 2) return;
  size_t at = strlen(out);
  if (unit == UNIT_FRACTION) {
    if (at < n) snprintf(out + at, n - at, " [%.1f-%.1f]", 100 * s->lo, 100 * s->hi);
    return;
  }
  const double half = (s->hi - s->lo) / 2;
  if (!isfinite(half) || !(half > 0)) return;
  char h[48];
  if (unit == UNIT_RATIO || unit == UNIT_COUNT)  // a plain number: two significant digits
    snprintf(h, sizeof h, "%.2g", half);
  else
    ledger_format_value(unit, half, h, sizeof h);
  if (at < n) snprintf(out + at, n - at, " ± %s", h);
}

// A measure's column label; kNN's names its k when every run voted with the same one.
static void label_of(const CompareSpec *spec, const CompareCell *cells, int m, char *out,
                     size_t n) {
  double k = NAN;
  int same = 1;
  for (int i = 0; m == M_KNN && i < spec->n_objectives * spec->n_budgets; i++) {
    const SeedStats *s = &cells[i].m[M_KNN_K];
    if (s->n == 0) continue;
    if ((isfinite(k) && s->mean != k) || (s->n >= 2 && s->lo != s->hi)) same = 0;
    k = s->mean;
  }
  if (m == M_KNN && isfinite(k) && same)
    snprintf(out, n, "kNN top-1 (k=%.0f)", k);
  else
    snprintf(out, n, "%s", measures[m].label);
}

void compare_print_table(FILE *f, const CompareSpec *spec, const CompareCell *cells) {
  static const CompareMeasure shown[] = {M_KNN,       M_KNN20, M_LINEAR,  M_RANKME,
                                         M_COLLAPSED, M_FLOPS, M_SECONDS, M_PEAK_RSS};
  fprintf(f, "%-10s %-10s", "objective", "budget");
  for (size_t k = 0; k < sizeof shown / sizeof *shown; k++) {
    char label[64];
    label_of(spec, cells, shown[k], label, sizeof label);
    fprintf(f, " %18s", label);
  }
  fputc('\n', f);
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      fprintf(f, "%-10s %-10s", spec->objectives[o], spec->budgets[b]);
      for (size_t k = 0; k < sizeof shown / sizeof *shown; k++) {
        char text[64];
        show(&cells[o * spec->n_budgets + b].m[shown[k]], measures[shown[k]].unit, text,
             sizeof text);
        fprintf(f, " %18s", text);
      }
      fputc('\n', f);
    }
  fprintf(f,
          "accuracies: mean over seeds [95%% interval, on the logit scale so inside 0-100%%]; "
          "other measures: mean ± half the 95%% interval; training FLOP of every replica\n");
}

// One point per (objective, budget): x the mean of a cost, y the mean accuracy.
typedef struct {
  double x, y, lo, hi;
  int objective, budget;
} Point;

// 1 when no other point costs at most as much and scores at least as well, one of them strictly.
static int on_front(const Point *p, int n, int i) {
  for (int j = 0; j < n; j++)
    if (j != i && p[j].x <= p[i].x && p[j].y >= p[i].y && (p[j].x < p[i].x || p[j].y > p[i].y))
      return 0;
  return 1;
}

static int by_x(const void *a, const void *b) {
  const Point *p = a, *q = b;
  return (p->x > q->x) - (p->x < q->x);
}

// Accuracy (measure m) against a cost (measure x_m, its axis of x_scale): a point per objective and
// budget with its interval as an error bar, each objective's budgets joined, the Pareto front
// (nothing cheaper scores as well) ringed and joined dashed, the raw-pixel baseline dashed.
static void scatter_chart(FILE *f, const CompareSpec *spec, const CompareCell *cells, int m,
                          int x_m, ChartScale x_scale, const char *x_label) {
  Point p[COMPARE_MAX_OBJECTIVES * COMPARE_MAX_BUDGETS];
  int n = 0;
  long not_drawn = 0;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  const int raw_m = m == M_LINEAR ? M_LINEAR_RAW : M_KNN_RAW;
  double raw = NAN;
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      const CompareCell *c = &cells[o * spec->n_budgets + b];
      if (!isfinite(raw)) raw = c->m[raw_m].mean;
      Point q = {c->m[x_m].mean, c->m[m].mean, c->m[m].lo, c->m[m].hi, o, b};
      if (!isfinite(q.x) || !isfinite(q.y)) {
        not_drawn++;
        continue;
      }
      p[n++] = q;
      x0 = fmin(x0, q.x), x1 = fmax(x1, q.x);
      y0 = fmin(y0, isfinite(q.lo) ? q.lo : q.y), y1 = fmax(y1, isfinite(q.hi) ? q.hi : q.y);
    }
  if (n == 0) return;
  if (isfinite(raw)) y0 = fmin(y0, raw), y1 = fmax(y1, raw);
  // Accuracies that all agree (a task every encoder solves) get a few points of room below;
  // an accuracy axis never leaves 0-100%.
  if (y1 - y0 < 0.01) y0 = y1 - 0.05;
  y0 = fmax(0, y0), y1 = fmin(1, y1);
  // Costs that nearly agree (runs of one budget) are drawn from 0, not on an axis a few percent
  // wide whose ticks all read the same; else room either side of the first and last points.
  double pad = x1 > x0 ? (x1 - x0) * 0.08 : fmax(fabs(x0) * 0.1, 1e-9);
  if (x1 - x0 < 0.25 * x1) x0 = 0, pad = 0.05 * x1;
  ChartPlot plot = chart_plot(fmax(0, x0 - pad), x1 + pad, x_scale, y0, y1, CHART_PERCENT);
  char title[200];
  snprintf(title, sizeof title, "%s top-1 against %s", m == M_LINEAR ? "Linear probe" : "kNN",
           x_label);
  chart_open(f, title, x_label, &plot);
  if (isfinite(raw))
    fprintf(f,
            "<polyline class=\"series reference\" stroke=\"#777777\" points=\"%.1f,%.1f "
            "%.1f,%.1f\"/>\n",
            (double)CHART_MARGIN_L, chart_px_y(&plot, raw), (double)(CHART_W - CHART_MARGIN_R),
            chart_px_y(&plot, raw));
  qsort(p, (size_t)n, sizeof *p, by_x);
  for (int o = 0; o < spec->n_objectives; o++) {  // an objective's budgets, joined
    int count = 0;
    for (int i = 0; i < n; i++) count += p[i].objective == o;
    if (count < 2) continue;
    fprintf(f, "<polyline class=\"series budgets\" stroke=\"%s\" points=\"",
            chart_palette[o % CHART_N_COLORS]);
    for (int i = 0; i < n; i++)
      if (p[i].objective == o)
        fprintf(f, "%.1f,%.1f ", chart_px_x(&plot, p[i].x), chart_px_y(&plot, p[i].y));
    fputs("\"/>\n", f);
  }
  fputs("<polyline class=\"front\" points=\"", f);
  for (int i = 0; i < n; i++)
    if (on_front(p, n, i))
      fprintf(f, "%.1f,%.1f ", chart_px_x(&plot, p[i].x), chart_px_y(&plot, p[i].y));
  fputs("\"/>\n", f);
  for (int i = 0; i < n; i++) {
    const char *color = chart_palette[p[i].objective % CHART_N_COLORS];
    double px = chart_px_x(&plot, p[i].x), py = chart_px_y(&plot, p[i].y);
    if (isfinite(p[i].lo))
      fprintf(f,
              "<path class=\"errbar\" stroke=\"%s\" d=\"M%.1f,%.1f V%.1f M%.1f,%.1f H%.1f "
              "M%.1f,%.1f H%.1f\"/>\n",
              color, px, chart_px_y(&plot, p[i].lo), chart_px_y(&plot, p[i].hi), px - 4,
              chart_px_y(&plot, p[i].lo), px + 4, px - 4, chart_px_y(&plot, p[i].hi), px + 4);
    if (on_front(p, n, i))
      fprintf(f, "<circle class=\"pareto\" cx=\"%.1f\" cy=\"%.1f\" r=\"7\"/>\n", px, py);
    const int fell = collapsed(cell_at(spec, cells, p[i].objective, p[i].budget));
    fprintf(f,
            "<circle class=\"point%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" "
            "stroke=\"%s\"><title>",
            fell ? " collapsed" : "", px, py, fell ? "none" : color, color);
    html_put_text(f, spec->objectives[p[i].objective]);
    fputs(" at ", f);
    html_put_text(f, spec->budgets[p[i].budget]);
    if (fell) fputs(" (collapsed: not recommended)", f);
    fprintf(f, "</title></circle>\n<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">", px + 7, py - 6);
    html_put_text(f, spec->budgets[p[i].budget]);
    fputs("</text>\n", f);
  }
  fputs("</svg>\n", f);
  const char *labels[COMPARE_MAX_OBJECTIVES + 2], *colors[COMPARE_MAX_OBJECTIVES + 2];
  int k = 0;
  for (int o = 0; o < spec->n_objectives; o++)
    labels[k] = spec->objectives[o], colors[k++] = chart_palette[o % CHART_N_COLORS];
  if (isfinite(raw)) labels[k] = "raw pixels (baseline, dashed)", colors[k++] = "#777777";
  labels[k] = "Pareto front (ringed)", colors[k++] = "#000000";
  chart_legend(f, k, labels, colors, not_drawn);
}

// A row per objective and budget, a column per measure.
static void html_table(FILE *f, const CompareSpec *spec, const CompareCell *cells,
                       const CompareMeasure *columns, int n_columns) {
  fputs("<table>\n<thead><tr><th>objective</th><th>budget</th><th>seeds</th>", f);
  for (int k = 0; k < n_columns; k++) {
    char label[64];
    label_of(spec, cells, columns[k], label, sizeof label);
    fputs("<th>", f);
    html_put_text(f, label);
    fputs("</th>", f);
  }
  fputs("</tr></thead>\n<tbody>\n", f);
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      const CompareCell *c = &cells[o * spec->n_budgets + b];
      fputs("<tr class=\"cell\"><th>", f);
      html_put_text(f, c->objective);
      fputs("</th><td>", f);
      html_put_text(f, c->budget);
      fprintf(f, "</td><td>%d</td>", spec->n_seeds);
      for (int k = 0; k < n_columns; k++) {
        char text[64];
        show(&c->m[columns[k]], measures[columns[k]].unit, text, sizeof text);
        fputs("<td>", f);
        html_put_text(f, text);
        fputs("</td>", f);
      }
      fputs("</tr>\n", f);
    }
  fputs("</tbody></table>\n", f);
}

static const char compare_style[] =
    "svg .budgets{stroke-width:1;opacity:.5}svg .front{fill:none;stroke:#000;"
    "stroke-dasharray:3 3;stroke-width:1}svg .pareto{fill:none;stroke:#000;stroke-width:1.5}"
    "svg .errbar{fill:none;stroke-width:1.5}p.verdict{background:#f7f7f2;padding:.6em .8em}";

int compare_write_html(const CompareSpec *spec, const CompareCell *cells, const char *path) {
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  FILE *f = a.f;
  fprintf(f,
          "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<title>Tally compare</title>\n<style>%s%s</style></head><body>\n"
          "<h1>Tally compare</h1>\n",
          chart_page_style, compare_style);
  fprintf(f,
          "<p>%d objective%s, %d budget%s, %d seed%s each; each point is the mean over "
          "seeds, its bar the 95%% interval (Student's t over the seeds, on the logit scale). "
          "A collapsed encoder's point is hollow.</p>\n",
          spec->n_objectives, spec->n_objectives == 1 ? "" : "s", spec->n_budgets,
          spec->n_budgets == 1 ? "" : "s", spec->n_seeds, spec->n_seeds == 1 ? "" : "s");
  fputs("<h2>Verdict</h2>\n", f);
  for (int b = 0; b < spec->n_budgets; b++) {
    char text[COMPARE_VERDICT_MAX];
    compare_verdict(spec, cells, b, text, sizeof text);
    fputs("<p class=\"verdict\">", f);
    html_put_text(f, text);
    fputs("</p>\n", f);
  }
  static const struct {
    CompareMeasure x;
    ChartScale scale;
    const char *label;
  } axes[] = {{M_FLOPS, CHART_FLOPS, "training compute (every replica)"},
              {M_SECONDS, CHART_SECONDS, "training time (evaluation excluded)"},
              {M_PEAK_RSS, CHART_BYTES, "peak resident memory"}};
  const CompareMeasure accuracies[] = {M_LINEAR, M_KNN};
  for (int k = 0; k < 2; k++) {
    int any = 0;
    for (int i = 0; i < spec->n_objectives * spec->n_budgets; i++)
      any |= cells[i].m[accuracies[k]].n > 0;
    if (!any) continue;
    fprintf(f, "<h2>%s</h2>\n", accuracies[k] == M_LINEAR ? "Linear probe" : "kNN");
    for (size_t x = 0; x < sizeof axes / sizeof *axes; x++)
      scatter_chart(f, spec, cells, accuracies[k], axes[x].x, axes[x].scale, axes[x].label);
  }
  static const CompareMeasure scores[] = {M_KNN,    M_KNN20,         M_LINEAR,
                                          M_RANKME, M_EMBEDDING_STD, M_COLLAPSED};
  static const CompareMeasure costs[] = {M_FLOPS,         M_SECONDS,         M_PEAK_RSS,
                                         M_VIEWS_GRAD,    M_VIEWS_NOGRAD,    M_ACTIVATION_BYTES,
                                         M_QUEUE_VECTORS, M_ENCODINGS_REUSED};
  fputs("<h2>What each objective scored</h2>\n", f);
  html_table(f, spec, cells, scores, sizeof scores / sizeof *scores);
  fputs("<h2>What it cost</h2>\n", f);
  html_table(f, spec, cells, costs, sizeof costs / sizeof *costs);
  fputs(
      "<p class=\"sub\">Accuracies: mean over seeds [95% interval, Student's t on the logit "
      "scale, so inside 0-100%]; other measures: mean ± half the 95% interval. Per-step counts "
      "and bytes are each run's last ledger record; compare.json holds every value.</p>\n"
      "</body></html>\n",
      f);
  return atomic_commit(&a);
}
