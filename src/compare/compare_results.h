// What a finished compare found: every run's own outputs (its summary.json, its last ledger
// record, its `tally eval --json`) gathered per objective and budget into means over seeds with
// 95% intervals, written as compare.json and compare.html, and a verdict a person can act on.
#pragma once
#include <stdio.h>

#include "ledger/record.h"
#include "compare/compare_spec.h"

// The measures, one table for compare.json, compare.html and the verdict.
typedef enum {
  M_KNN,    // tally eval: kNN top-1 (k = eval.knn_k, capped by the classes' sizes)
  M_KNN_K,  // that k
  M_KNN20,  // kNN top-1 at k = 20
  M_LINEAR,
  M_COLLAPSED,  // 1 when the run's embeddings collapsed (eval/quality.h), else 0
  M_RANKME,
  M_EMBEDDING_STD,
  M_FLOPS,  // summary.json: training FLOPs (every replica), seconds, peak RSS
  M_SECONDS,
  M_PEAK_RSS,
  M_VIEWS_GRAD,  // the last ledger record's answers
  M_VIEWS_NOGRAD,
  M_ACTIVATION_BYTES,
  M_QUEUE_VECTORS,
  M_ENCODINGS_NEW,
  M_ENCODINGS_REUSED,
  M_KNN_RAW,  // tally eval's raw-pixel baselines (first seed only: they depend on the data)
  M_KNN20_RAW,
  M_LINEAR_RAW,
  M_EVAL_SECONDS,
  N_MEASURES
} CompareMeasure;

// A measure over seeds: values NaN where a run has none (no labels: no accuracy). Over the n
// finite ones: the mean and, for n >= 2, the 95% interval mean -/+ t(0.975, n-1) s / sqrt(n) with
// s the sample standard deviation; lo = hi = NaN for n < 2, mean NaN for n = 0. An accuracy (a
// fraction, `bounded`) takes that interval on the logit scale, each value clamped to
// [COMPARE_FRACTION_EPS, 1 - COMPARE_FRACTION_EPS] first, and maps it back: inside (0, 1) always,
// widened to hold the mean. Other measures, none of them negative, have lo clipped at 0.
typedef struct {
  double values[COMPARE_MAX_SEEDS];
  int n_values;
  int n;
  double mean, lo, hi;
} SeedStats;

// The 0.975 quantile of Student's t with df degrees of freedom, 1 <= df <= 29 (a table); NaN
// outside it.
double t_quantile_975(int df);
#define COMPARE_FRACTION_EPS 1e-4
void seed_stats(SeedStats *s, int bounded);  // mean, n, lo, hi from values[0..n_values)

typedef struct {
  const char *objective, *budget;
  SeedStats m[N_MEASURES];
} CompareCell;

enum { COMPARE_VERDICT_MAX = 4096 };

// Gathers every run's outputs: cells[o * n_budgets + b]. -1 with tl_last_error() naming the file
// when one is missing or unreadable.
int compare_collect(const CompareSpec *spec, CompareCell *cells);

// What the compare reads of the scored run in `dir`, each file whole and tied to the run's
// checkpoint: compare-eval.json (`tally eval --json` of that checkpoint: its step and CRC-32),
// summary.json (of as many steps) and ledger.jsonl (the ledger the checkpoint saw; its last
// record into *last, which may be NULL). *eval and *summary are malloc'ed texts. -1 with
// tl_last_error() naming the file that is missing, cut off, another kind of file or another
// run's; nothing is read as "not measured".
int compare_read_run(const char *dir, char **eval, char **summary, LedgerRecord *last);
// The verdict of budget b, one paragraph of plain text.
void compare_verdict(const CompareSpec *spec, const CompareCell *cells, int b, char *out, size_t n);
// compare.json and compare.html in the compare's folder (written atomically).
int compare_write_json(const CompareSpec *spec, const CompareCell *cells, const char *path);
int compare_write_html(const CompareSpec *spec, const CompareCell *cells, const char *path);
// The table of means and intervals, for the terminal.
void compare_print_table(FILE *f, const CompareSpec *spec, const CompareCell *cells);
