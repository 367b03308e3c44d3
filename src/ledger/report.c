#include "ledger/report.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ini.h>

#include "core/error.h"
#include "eval/quality.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
#include "io/json_read.h"
#include "ledger/bytes.h"
#include "ledger/chart.h"
#include "ledger/record.h"

typedef struct {
  double step, top1, top1_k20;  // top1 NaN without labels
  double linear_top1;           // NaN when the run did not fit the probe
  // The label-free quality (NaN when the record has none: a run from before it was measured).
  double rankme, embedding_std, embedding_std_reference;
  double flops_total, seconds;  // training compute spent when it was taken (NaN: unknown)
} Eval;

// One key of a run's resolved configuration (config.ini), "section.key" = value; the model
// file's keys (written there as comments) as "backbone.key".
typedef struct {
  char key[96];
  char value[256];
} ConfigEntry;

typedef struct {
  const char *dir;
  char name[256];  // the folder's last component
  char objective[32];
  char backbone[32];
  LedgerRecord *recs;  // (n_recs) ledger.jsonl
  int n_recs;
  Eval *evals;  // (n_evals) encoder evaluations from eval.jsonl
  int n_evals;
  double knn_raw;       // raw-pixel baseline, NaN when absent
  double linear_raw;    // the raw-pixel linear probe, NaN when absent
  double knn_final;     // summary.json's knn_top1, NaN when absent
  double peak_rss;      // summary.json, NaN when absent
  double planned_peak;  // summary.json's planned_peak_bytes, NaN when absent
  // summary.json's label-free quality of the last evaluation (NaN when absent)
  double rankme, embedding_std, embedding_std_reference;
  int finished;  // summary.json exists
  int batch_size;
  ConfigEntry *config;  // (n_config) config.ini, in file order; none without the file
  int n_config;
  char recipe[256];        // the recipe config.ini says it was resolved from ("" when not said)
  time_t started;          // config.ini's time: when the run started (0 without it)
  LedgerOwnLookup lookup;  // the objectives' own ledger fields
} Run;

// DIR/FILE whole as a string (regular_read_text: 0, 1 when absent, -1 on error).
static int read_text(const char *dir, const char *file, char **text, size_t *len_out) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  return regular_read_text(path, text, len_out);
}

// Hands each line of DIR/FILE (text, len bytes) to `take`, which returns -1 when the line is not
// a whole record. A run killed mid-write (kill -9, a full disk) leaves a last line without its
// newline, or one that does not parse: it is skipped with a note on stderr. A bad line anywhere
// else is corruption, and an error naming the file and line. Empty lines are skipped.
static int each_line(char *text, size_t len, const char *dir, const char *file,
                     int (*take)(Run *run, const char *line), Run *run) {
  int line_no = 0;
  for (char *line = text, *end = text + len, *next; line < end; line = next) {
    line_no++;
    char *newline = memchr(line, '\n', (size_t)(end - line));
    next = newline ? newline + 1 : end;
    size_t line_len = (size_t)(next - line) - (newline != NULL);
    line[line_len] = 0;
    if (line_len == 0) continue;
    // A NUL byte (a file system that zero-fills after a crash) makes the line unreadable too.
    if (newline && strlen(line) == line_len && take(run, line) == 0) continue;
    if (next < end) return tl_fail("%s/%s:%d: not a whole record", dir, file, line_no);
    fprintf(stderr, "tally report: %s/%s: ignored a cut-off last line (line %d)\n", dir, file,
            line_no);
  }
  return 0;
}

// Lines in text (the last may lack its newline), or -1 (error set) beyond what an int counts.
static int lines_in(const char *text, size_t len, const char *dir, const char *file) {
  size_t lines = 1;
  for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p))); p++)
    lines++;
  if (lines > INT_MAX) return tl_fail("%s/%s: more than %d lines", dir, file, INT_MAX);
  return (int)lines;
}

// One line of ledger.jsonl into the next record; the run's objective is the first record's.
static int take_record(Run *run, const char *line) {
  if (ledger_read_json(line, &run->recs[run->n_recs], run->lookup) < 0) return -1;
  if (!run->n_recs) json_flat_string(line, "objective", run->objective, sizeof run->objective);
  run->n_recs++;
  return 0;
}

// One line of eval.jsonl, {"step", "what", "knn_top1", "knn_top1_k20", ..., "rankme",
// "embedding_std", "embedding_std_reference", "seconds"}: the raw-pixel baseline, or the next
// evaluation of the encoder (null for a value the run did not have, such as kNN without labels).
static int take_eval(Run *run, const char *line) {
  size_t n = strlen(line);
  while (n && (line[n - 1] == ' ' || line[n - 1] == '\r')) n--;
  char what[32];
  json_flat_string(line, "what", what, sizeof what);
  if (line[0] != '{' || line[n - 1] != '}' || !what[0] || !json_flat_value(line, "knn_top1") ||
      !isfinite(json_flat_number(line, "step")))
    return -1;
  double linear =
      json_flat_value(line, "linear_top1") ? json_flat_number(line, "linear_top1") : NAN;
  if (strcmp(what, "raw_pixels") == 0) {
    run->knn_raw = json_flat_number(line, "knn_top1");
    run->linear_raw = linear;
    return 0;
  }
  Eval *e = &run->evals[run->n_evals++];
  e->step = json_flat_number(line, "step");
  e->top1 = json_flat_number(line, "knn_top1");
  e->top1_k20 = json_flat_number(line, "knn_top1_k20");
  e->linear_top1 = linear;
  e->rankme = json_flat_number(line, "rankme");
  e->embedding_std = json_flat_number(line, "embedding_std");
  e->embedding_std_reference = json_flat_number(line, "embedding_std_reference");
  e->flops_total = e->seconds = NAN;
  return 0;
}

// Each evaluation after step S (S steps done) is placed at the training compute the ledger had
// spent by then: the record of step S - 1 (records and evaluations are both in step order).
static void attach_compute(Run *run) {
  int flops = ledger_field_find("flops_total"), seconds = ledger_field_find("train_seconds");
  int step = ledger_field_find("step"), i = 0;
  for (int e = 0; e < run->n_evals; e++) {
    Eval *ev = &run->evals[e];
    if (ev->step <= 0) {
      ev->flops_total = ev->seconds = 0;
      continue;
    }
    while (i + 1 < run->n_recs && ledger_field_value(&run->recs[i + 1], step) <= ev->step - 1) i++;
    if (i < run->n_recs && ledger_field_value(&run->recs[i], step) == ev->step - 1) {
      ev->flops_total = ledger_field_value(&run->recs[i], flops);
      ev->seconds = ledger_field_value(&run->recs[i], seconds);
    }
  }
}

static int take_config_entry(void *user, const char *section, const char *key, const char *value) {
  Run *run = user;
  if ((run->n_config & (run->n_config - 1)) == 0 && run->n_config >= 16) {
    ConfigEntry *grown = realloc(run->config, sizeof *grown * 2 * (size_t)run->n_config);
    if (!grown) TL_DIE("out of memory");
    run->config = grown;
  }
  ConfigEntry *e = &run->config[run->n_config++];
  snprintf(e->key, sizeof e->key, "%s.%s", section, key);
  snprintf(e->value, sizeof e->value, "%s", value);
  return 1;
}

// config.ini as `tally train` writes it: the resolved keys, the recipe's name in a comment
// ("; Recipe: FILE"), and the model file's keys as comment lines ("; key = value") after
// "; Model file FILE, as read:". A run without one (or with one inih cannot read) has no
// configuration to show; that is not an error.
static int load_config(Run *run) {
  char *text;
  int rc = read_text(run->dir, "config.ini", &text, NULL);
  if (rc != 0) return rc < 0 ? -1 : 0;
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/config.ini", run->dir);
  if (stat(path, &st) == 0) run->started = st.st_mtime;
  run->config = malloc(sizeof *run->config * 16);
  if (!run->config) TL_DIE("out of memory");
  const char *recipe = strstr(text, "; Recipe: ");
  if (recipe) sscanf(recipe + 10, "%255[^\n]", run->recipe);
  char *model = strstr(text, "\n; Model file ");
  if (model) *model++ = 0;                         // the recipe's keys end there
  ini_parse_string(text, take_config_entry, run);  // a line it cannot read is left out
  if (model) {
    // The model's lines without their "; ", one by one in place.
    char *out = model;
    for (char *line = strchr(model, '\n'); line && *line; line = strchr(line, '\n')) {
      line++;
      if (strncmp(line, "; ", 2) != 0) continue;
      char *end = strchr(line, '\n');
      size_t len = end ? (size_t)(end - line) : strlen(line);
      memmove(out, line + 2, len - 2);
      out += len - 2;
      *out++ = '\n';
    }
    *out = 0;
    ini_parse_string(model, take_config_entry, run);
  }
  free(text);
  return 0;
}

// The value of "section.key" in the run's configuration, or NULL.
static const char *config_value(const Run *run, const char *key) {
  for (int i = 0; i < run->n_config; i++)
    if (strcmp(run->config[i].key, key) == 0) return run->config[i].value;
  return NULL;
}

static int load_run(Run *run, const char *dir, LedgerOwnLookup lookup) {
  memset(run, 0, sizeof *run);
  run->dir = dir;
  run->lookup = lookup;
  run->knn_raw = run->linear_raw = run->knn_final = run->peak_rss = run->planned_peak = NAN;
  run->rankme = run->embedding_std = run->embedding_std_reference = NAN;
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/') len--;
  const char *start = dir + len;
  while (start > dir && start[-1] != '/') start--;
  snprintf(run->name, sizeof run->name, "%.*s", (int)(dir + len - start), start);

  size_t text_len;
  char *ledger;
  int rc = read_text(dir, "ledger.jsonl", &ledger, &text_len), n_lines;
  if (rc > 0) return tl_fail("%s/ledger.jsonl: no such file", dir);
  if (rc < 0 || (n_lines = lines_in(ledger, text_len, dir, "ledger.jsonl")) < 0) {
    free(ledger);
    return -1;
  }
  run->recs = calloc((size_t)n_lines, sizeof *run->recs);
  if (!run->recs) TL_DIE("out of memory");
  rc = each_line(ledger, text_len, dir, "ledger.jsonl", take_record, run);
  free(ledger);
  if (rc != 0) return -1;
  if (run->n_recs == 0) return tl_fail("%s/ledger.jsonl: no records", dir);

  char *evals;
  rc = read_text(dir, "eval.jsonl", &evals, &text_len);
  if (rc < 0) return -1;
  if (rc == 0) {
    if ((n_lines = lines_in(evals, text_len, dir, "eval.jsonl")) < 0) {
      free(evals);
      return -1;
    }
    run->evals = calloc((size_t)n_lines, sizeof *run->evals);
    if (!run->evals) TL_DIE("out of memory");
    rc = each_line(evals, text_len, dir, "eval.jsonl", take_eval, run);
    free(evals);
    if (rc != 0) return -1;
  }
  char *summary;
  rc = read_text(dir, "summary.json", &summary, NULL);
  if (rc < 0) return -1;
  if (rc == 0) {
    json_flat_string(summary, "backbone", run->backbone, sizeof run->backbone);
    run->knn_final = json_flat_number(summary, "knn_top1");
    run->peak_rss = json_flat_number(summary, "peak_rss_bytes");
    run->planned_peak = json_flat_number(summary, "planned_peak_bytes");
    run->rankme = json_flat_number(summary, "rankme");
    run->embedding_std = json_flat_number(summary, "embedding_std");
    run->embedding_std_reference = json_flat_number(summary, "embedding_std_reference");
    run->finished = 1;
    double batch = json_flat_number(summary, "batch_size");  // NaN when absent: no cast then
    run->batch_size = batch >= 1 && batch <= INT_MAX ? (int)batch : 0;
    free(summary);
  }
  attach_compute(run);
  return load_config(run);
}

static void run_free(Run *run) {
  free(run->recs);
  free(run->evals);
  free(run->config);
}

// ---- charts ----

typedef struct {
  const char *label;
  const char *color;
  int n;
  const double *x, *y;  // (n); a point with a NaN or infinite coordinate is not drawn
  int dashed;           // a reference line (a baseline), drawn dashed without markers
} Series;

static int drawable(const Series *s, int i) { return isfinite(s->x[i]) && isfinite(s->y[i]); }

static void line_chart(FILE *f, const char *title, const char *x_label, const Series *s, int ns,
                       ChartScale x_scale, ChartScale y_scale, int from_zero) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = from_zero ? 0 : INFINITY, y1 = -INFINITY;
  long points = 0, not_drawn = 0;
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (!drawable(&s[k], i)) {
        not_drawn++;
        continue;
      }
      points++;
      x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
      y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
    }
  if (points == 0) {
    fputs("<p class=\"none\">", f);
    html_put_text(f, title);
    fputs(": nothing recorded", f);
    if (not_drawn) fprintf(f, " (%ld values NaN or infinite)", not_drawn);
    fputs(".</p>\n", f);
    return;
  }
  // One x alone (a run evaluated once) is drawn from 0 up to it, not on an axis of its own
  // making (25 to 50 for a 25-step run).
  if (x0 == x1 && x0 > 0) x0 = 0;
  ChartPlot p = chart_plot(x0, x1, x_scale, y0, y1, y_scale);
  chart_open(f, title, x_label, &p);
  for (int k = 0; k < ns; k++) {
    fprintf(f, "<polyline class=\"series%s\" stroke=\"%s\" points=\"",
            s[k].dashed ? " reference" : "", s[k].color);
    for (int i = 0; i < s[k].n; i++)
      if (drawable(&s[k], i))
        fprintf(f, "%.1f,%.1f ", chart_px_x(&p, s[k].x[i]), chart_px_y(&p, s[k].y[i]));
    fputs("\"/>\n", f);
    // Markers where points are few enough to tell apart (evaluations, short runs).
    if (s[k].n <= 60 && !s[k].dashed)
      for (int i = 0; i < s[k].n; i++)
        if (drawable(&s[k], i))
          fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                  chart_px_x(&p, s[k].x[i]), chart_px_y(&p, s[k].y[i]), s[k].color);
  }
  fputs("</svg>\n", f);
  const char *labels[16], *colors[16];
  for (int k = 0; k < ns && k < 16; k++) labels[k] = s[k].label, colors[k] = s[k].color;
  chart_legend(f, ns < 16 ? ns : 16, labels, colors, not_drawn);
}

// What a run's progress is measured in. Runs of equal compute take different numbers of steps
// (a moco step costs less than an inbatch one), so charts against compute and time line them up
// where charts against steps do not.
typedef enum { AXIS_STEP, AXIS_FLOPS, AXIS_SECONDS, N_AXES } AxisKind;
static const struct {
  const char *label, *field;  // the ledger's cumulative field
  ChartScale scale;
} axes[N_AXES] = {{"step", "step", CHART_WHOLE},
                  {"training compute (every replica)", "flops_total", CHART_FLOPS},
                  {"training time (evaluation excluded)", "train_seconds", CHART_SECONDS}};

static const char *run_color(int k) { return chart_palette[k % CHART_N_COLORS]; }

// 1 when some run's ledger counts along axis a. A ledger from before compute and time were
// counted reads 0 for them at every step: charts against them would draw a vertical line.
static int axis_recorded(const Run *runs, int n, AxisKind a) {
  int field = ledger_field_find(axes[a].field);
  for (int k = 0; k < n; k++)
    for (int i = 0; a != AXIS_STEP && i < runs[k].n_recs; i++)
      if (ledger_field_value(&runs[k].recs[i], field) > 0) return 1;
  return a == AXIS_STEP;
}

// Says once which axes no ledger counts (so their charts are left out).
static void unrecorded_axes_note(FILE *f, const Run *runs, int n) {
  for (int a = AXIS_FLOPS; a < N_AXES; a++)
    if (!axis_recorded(runs, n, (AxisKind)a))
      fprintf(f,
              "<p class=\"none\">The ledgers count no %s (%s): nothing is drawn against it.</p>\n",
              axes[a].label, axes[a].field);
}

// Run k's ledger field `y_field` against axis x, as a series labelled `label` (its arrays to free).
static Series record_series(const Run *run, int k, const char *label, AxisKind x,
                            const char *y_field) {
  double *xs = malloc(sizeof(double) * run->n_recs), *ys = malloc(sizeof(double) * run->n_recs);
  if (!xs || !ys) TL_DIE("out of memory");
  int xf = ledger_field_find(axes[x].field), yf = ledger_field_find(y_field);
  for (int i = 0; i < run->n_recs; i++) {
    xs[i] = ledger_field_value(&run->recs[i], xf);
    ys[i] = ledger_field_value(&run->recs[i], yf);
  }
  return (Series){label, run_color(k), run->n_recs, xs, ys, 0};
}

static void series_free(Series *s, int n) {
  for (int k = 0; k < n; k++) free((void *)s[k].x), free((void *)s[k].y);
}

// One chart per objective and axis: objectives' losses are different quantities (a contrastive
// cross-entropy over thousands of negatives, a pixel reconstruction error), so only runs of the
// same objective share an axis.
static void loss_charts(FILE *f, const Run *runs, int n, char (*labels)[300]) {
  fputs(
      "<h2>Loss</h2>\n<p class=\"sub\">One row per objective: the losses of different "
      "objectives are different quantities and are not drawn on one axis. Against compute and "
      "time, runs of different step counts line up.</p>\n",
      f);
  unrecorded_axes_note(f, runs, n);
  Series *s = calloc((size_t)n, sizeof *s);
  if (!s) TL_DIE("out of memory");
  for (int k = 0; k < n; k++) {
    int first = 1;
    for (int j = 0; j < k; j++) first &= strcmp(runs[j].objective, runs[k].objective) != 0;
    if (!first) continue;
    fputs("<div class=\"grid\">\n", f);
    for (int a = 0; a < N_AXES; a++) {
      if (!axis_recorded(runs, n, (AxisKind)a)) continue;
      int ns = 0;
      for (int j = k; j < n; j++)
        if (strcmp(runs[j].objective, runs[k].objective) == 0)
          s[ns++] = record_series(&runs[j], j, labels[j], (AxisKind)a, "loss");
      char title[200];
      snprintf(title, sizeof title, "%s loss against %s",
               runs[k].objective[0] ? runs[k].objective : "training", axes[a].label);
      line_chart(f, title, axes[a].label, s, ns, axes[a].scale, CHART_PLAIN, 0);
      series_free(s, ns);
    }
    fputs("</div>\n", f);
  }
  free(s);
}

// Images per second and the scheduled learning rate over the steps, every run on one axis each.
static void pace_charts(FILE *f, const Run *runs, int n, char (*labels)[300]) {
  static const struct {
    const char *title, *field;
  } charts[] = {{"Images per second against step", "images_per_s"},
                {"Learning rate (scheduled) against step", "lr"}};
  Series *s = calloc((size_t)n, sizeof *s);
  if (!s) TL_DIE("out of memory");
  fputs("<h2>Throughput and learning rate</h2>\n<div class=\"grid\">\n", f);
  for (size_t c = 0; c < sizeof charts / sizeof *charts; c++) {
    for (int k = 0; k < n; k++)
      s[k] = record_series(&runs[k], k, labels[k], AXIS_STEP, charts[c].field);
    line_chart(f, charts[c].title, "step", s, n, CHART_WHOLE, CHART_PLAIN, 1);
    series_free(s, n);
  }
  fputs("</div>\n", f);
  free(s);
}

// ---- quality ----

static double eval_x(const Eval *e, AxisKind x) {
  return x == AXIS_STEP ? e->step : x == AXIS_FLOPS ? e->flops_total : e->seconds;
}

// Accuracy after each evaluation (kNN top-1 at the configured k, or the linear probe's), one line
// per run, against steps, training FLOPs or training seconds, with the raw-pixel baseline dashed
// (one line when every run has the same, i.e. the same data). The accuracy axis spans the data.
static void accuracy_chart(FILE *f, const Run *runs, int n, char (*labels)[300], AxisKind x,
                           int linear) {
  Series *s = calloc(2 * (size_t)n, sizeof *s);
  double **xs = calloc((size_t)n, sizeof *xs), **ys = calloc((size_t)n, sizeof *ys);
  double(*base)[4] = calloc((size_t)n, sizeof *base);  // x0, x1, y, y
  if (!s || !xs || !ys || !base) TL_DIE("out of memory");
  int ns = 0, same_baseline = 1, any = 0;
  double x_end = 0;
  for (int k = 0; k < n; k++) {
    double raw = linear ? runs[k].linear_raw : runs[k].knn_raw;
    double raw0 = linear ? runs[0].linear_raw : runs[0].knn_raw;
    same_baseline &= raw == raw0 || (isnan(raw) && isnan(raw0));
    xs[k] = malloc(sizeof(double) * ((size_t)runs[k].n_evals + 1));
    ys[k] = malloc(sizeof(double) * ((size_t)runs[k].n_evals + 1));
    if (!xs[k] || !ys[k]) TL_DIE("out of memory");
    for (int i = 0; i < runs[k].n_evals; i++) {
      const Eval *e = &runs[k].evals[i];
      xs[k][i] = eval_x(e, x);
      ys[k][i] = linear ? e->linear_top1 : e->top1;
      any |= isfinite(ys[k][i]);
      if (isfinite(xs[k][i])) x_end = fmax(x_end, xs[k][i]);
    }
    s[ns++] = (Series){labels[k], run_color(k), runs[k].n_evals, xs[k], ys[k], 0};
  }
  static char raw_label[] = "raw pixels (baseline)";
  for (int k = 0; any && k < (same_baseline ? 1 : n); k++) {
    double raw = linear ? runs[k].linear_raw : runs[k].knn_raw;
    if (!isfinite(raw)) continue;
    base[k][0] = 0, base[k][1] = x_end, base[k][2] = base[k][3] = raw;
    s[ns++] = (Series){same_baseline ? raw_label : labels[k],
                       same_baseline ? "#777777" : run_color(k),
                       2,
                       base[k],
                       base[k] + 2,
                       1};
  }
  if (any) {
    char title[160];
    snprintf(title, sizeof title, "%s top-1 accuracy against %s", linear ? "Linear probe" : "kNN",
             axes[x].label);
    line_chart(f, title, axes[x].label, s, ns, axes[x].scale, CHART_PERCENT, 0);
  }
  for (int k = 0; k < n; k++) free(xs[k]), free(ys[k]);
  free(xs);
  free(ys);
  free(s);
  free(base);
}

static double eval_knn(const Eval *e) { return e->top1; }
static double eval_linear(const Eval *e) { return e->linear_top1; }
static double eval_rankme(const Eval *e) { return e->rankme; }
// embedding_std against what embeddings spread evenly over the sphere read: 1 then, 0 collapsed.
static double eval_spread(const Eval *e) { return e->embedding_std / e->embedding_std_reference; }

// The run's last evaluation whose `get` is finite, or NULL.
static const Eval *last_eval(const Run *run, double (*get)(const Eval *)) {
  for (int i = run->n_evals - 1; i >= 0; i--)
    if (isfinite(get(&run->evals[i]))) return &run->evals[i];
  return NULL;
}

// The run's last label-free quality: its last evaluation's, else summary.json's.
static Eval last_quality(const Run *run) {
  const Eval *e = last_eval(run, eval_rankme);
  if (e) return *e;
  Eval q = {.step = NAN, .top1 = NAN, .linear_top1 = NAN};
  q.rankme = run->rankme;
  q.embedding_std = run->embedding_std;
  q.embedding_std_reference = run->embedding_std_reference;
  return q;
}

static double last_knn(const Run *run) {
  const Eval *e = last_eval(run, eval_knn);
  return e ? e->top1 : run->knn_final;
}

// 1 when some run has an evaluation whose `get` is finite.
static int any_eval(const Run *runs, int n, double (*get)(const Eval *)) {
  for (int k = 0; k < n; k++)
    if (last_eval(&runs[k], get)) return 1;
  return 0;
}

static void cell(FILE *f, const char *text);

// One row per run: what its last evaluation measured. A column no run has is left out; what
// is missing is said once, in the note after the table.
static void quality_table(FILE *f, const Run *runs, int n) {
  int has[6] = {0};  // kNN, raw kNN, linear, raw linear, RankMe, spread
  for (int k = 0; k < n; k++) {
    const Eval q = last_quality(&runs[k]);
    has[0] |= isfinite(last_knn(&runs[k]));
    has[1] |= isfinite(runs[k].knn_raw);
    has[2] |= last_eval(&runs[k], eval_linear) != NULL;
    has[3] |= isfinite(runs[k].linear_raw);
    has[4] |= isfinite(q.rankme);
    has[5] |= isfinite(eval_spread(&q));
  }
  static const char *const heads[6] = {
      "kNN top-1", "kNN on raw pixels",         "linear probe top-1", "linear probe on raw pixels",
      "RankMe",    "embedding_std of 1/sqrt(d)"};
  int columns = 0;
  for (int c = 0; c < 6; c++) columns += has[c];
  if (!columns) return;
  fputs(
      "<div class=\"scroll\"><table class=\"quality\">\n<thead><tr><th>run</th>"
      "<th>evaluations</th>",
      f);
  for (int c = 0; c < 6; c++)
    if (has[c]) fprintf(f, "<th>%s</th>", heads[c]);
  fputs("</tr></thead>\n<tbody>\n", f);
  for (int k = 0; k < n; k++) {
    const Run *r = &runs[k];
    const Eval q = last_quality(r);
    const Eval *lin = last_eval(r, eval_linear);
    const double v[6] = {last_knn(r),   r->knn_raw, lin ? lin->linear_top1 : NAN,
                         r->linear_raw, q.rankme,   eval_spread(&q)};
    fprintf(f, "<tr><th><span class=\"swatch\" style=\"background:%s\"></span>", run_color(k));
    html_put_text(f, r->name);
    fprintf(f, "</th><td>%d</td>", r->n_evals);
    for (int c = 0; c < 6; c++) {
      if (!has[c]) continue;
      char buf[48] = "-";
      if (isfinite(v[c]))
        snprintf(buf, sizeof buf,
                 c < 4    ? "%.2f%%"
                 : c == 4 ? "%.2f"
                          : "%.3f",
                 c < 4 ? 100 * v[c] : v[c]);
      if (c == 5 && v[c] < QUALITY_COLLAPSED_FRACTION) strcat(buf, " (collapsed)");
      cell(f, buf);
    }
    fputs("</tr>\n", f);
  }
  fputs("</tbody></table></div>\n", f);
}

// Appends run k's name to the list of runs that lack something for `reason`.
static void missing_add(char *names, size_t size, const Run *run) {
  size_t len = strlen(names);
  snprintf(names + len, size - len, "%s%s", len ? ", " : "", run->name);
}

// What the evaluations did not measure, once for the page: the runs that lack each measure,
// grouped by why (from config.ini when it tells).
static void missing_note(FILE *f, const Run *runs, int n) {
  enum { NO_EVALS, NO_LABELS, NO_KNN, NO_LINEAR, NO_QUALITY, N_REASONS };
  static const char *const reasons[N_REASONS] = {
      "no encoder evaluations recorded (trained with --no-knn, or stopped before the first)",
      "no kNN accuracy or linear probe: the data has no labels (data.labels = none)",
      "no kNN accuracy recorded", "no linear probe (eval.linear = 0)",
      "no label-free quality (RankMe, embedding_std) recorded"};
  static char names[N_REASONS][1024];
  int any_linear = any_eval(runs, n, eval_linear);
  for (int r = 0; r < N_REASONS; r++) names[r][0] = 0;
  for (int k = 0; k < n; k++) {
    const Run *run = &runs[k];
    const char *labels = config_value(run, "data.labels");
    const char *linear = config_value(run, "eval.linear");
    const Eval q = last_quality(run);
    if (run->n_evals == 0 && !isfinite(last_knn(run)) && !isfinite(q.rankme)) {
      missing_add(names[NO_EVALS], sizeof names[NO_EVALS], run);
      continue;
    }
    if (!isfinite(last_knn(run))) {
      int unlabeled = labels && strcmp(labels, "none") == 0;
      missing_add(names[unlabeled ? NO_LABELS : NO_KNN], sizeof names[0], run);
    } else if (!last_eval(run, eval_linear) && (any_linear || (linear && !strcmp(linear, "0")))) {
      missing_add(names[NO_LINEAR], sizeof names[0], run);
    }
    if (!isfinite(q.rankme)) missing_add(names[NO_QUALITY], sizeof names[0], run);
  }
  int said = 0;
  for (int r = 0; r < N_REASONS; r++) {
    if (!names[r][0]) continue;
    fputs(said++ ? "; " : "<p class=\"missing\">Not measured: ", f);
    fputs("<b>", f);
    html_put_text(f, names[r]);
    fputs("</b>: ", f);
    html_put_text(f, reasons[r]);
  }
  if (said) fputs(".</p>\n", f);
}

// The quality measured without labels at each evaluation, against steps: RankMe, and
// embedding_std as a fraction of 1/sqrt(d) with the collapse threshold dashed; then the step at
// which each run that collapsed was first found so.
static void quality_charts(FILE *f, const Run *runs, int n, char (*labels)[300]) {
  Series *s = calloc((size_t)n + 1, sizeof *s);
  double **xs = calloc((size_t)n, sizeof *xs), **ys = calloc((size_t)n, sizeof *ys);
  if (!s || !xs || !ys) TL_DIE("out of memory");
  double last_step = 0;
  for (int k = 0; k < n; k++) {
    xs[k] = malloc(sizeof(double) * ((size_t)runs[k].n_evals + 1));
    ys[k] = malloc(sizeof(double) * ((size_t)runs[k].n_evals + 1));
    if (!xs[k] || !ys[k]) TL_DIE("out of memory");
    for (int i = 0; i < runs[k].n_evals; i++) {
      xs[k][i] = runs[k].evals[i].step;
      last_step = fmax(last_step, xs[k][i]);
    }
  }
  static char threshold_label[] = "collapse threshold";
  const double threshold_x[2] = {0, last_step},
               threshold_y[2] = {QUALITY_COLLAPSED_FRACTION, QUALITY_COLLAPSED_FRACTION};
  static const struct {
    const char *title;
    double (*get)(const Eval *);
  } charts[] = {
      {"RankMe (effective rank of the embeddings) against step", eval_rankme},
      {"embedding_std as a fraction of 1/sqrt(d) against step", eval_spread},
  };
  fputs("<div class=\"grid\">\n", f);
  for (int c = 0; c < 2; c++) {
    for (int k = 0; k < n; k++) {
      for (int i = 0; i < runs[k].n_evals; i++) ys[k][i] = charts[c].get(&runs[k].evals[i]);
      s[k] = (Series){labels[k], run_color(k), runs[k].n_evals, xs[k], ys[k], 0};
    }
    int ns = n;
    if (charts[c].get == eval_spread)
      s[ns++] = (Series){threshold_label, "#777777", 2, threshold_x, threshold_y, 1};
    line_chart(f, charts[c].title, "step", s, ns, CHART_WHOLE, CHART_PLAIN, 1);
  }
  fputs("</div>\n", f);
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < runs[k].n_evals; i++) {
      const Eval *e = &runs[k].evals[i];
      if (!(eval_spread(e) < QUALITY_COLLAPSED_FRACTION)) continue;
      fputs("<p class=\"sub\">", f);
      html_put_text(f, labels[k]);
      fprintf(f, ": collapsed at step %.0f (embedding_std %.3g of 1/sqrt(d), rankme %.2f)</p>\n",
              e->step, eval_spread(e), e->rankme);
      break;
    }
    free(xs[k]), free(ys[k]);
  }
  fprintf(f,
          "<p class=\"sub\">RankMe and embedding_std are measured on a fixed sample of the "
          "training images at every evaluation, without labels. embedding_std reads 1/sqrt(d) when "
          "the embeddings spread evenly over the sphere; an encoder is taken as collapsed when it "
          "falls below %g of that.</p>\n",
          QUALITY_COLLAPSED_FRACTION);
  free(xs);
  free(ys);
  free(s);
}

// The quality section: a table of each run's last evaluation, one note of what was not measured,
// then accuracy against steps, compute and time, and the label-free quality over the steps.
static void quality_section(FILE *f, const Run *runs, int n, char (*labels)[300]) {
  fputs("<h2>Quality of the encoder</h2>\n", f);
  quality_table(f, runs, n);
  missing_note(f, runs, n);
  for (int linear = 0; linear < 2; linear++) {
    if (!any_eval(runs, n, linear ? eval_linear : eval_knn)) continue;
    fputs("<div class=\"grid\">\n", f);
    for (int a = 0; a < N_AXES; a++)
      if (axis_recorded(runs, n, (AxisKind)a))
        accuracy_chart(f, runs, n, labels, (AxisKind)a, linear);
    fputs("</div>\n", f);
  }
  if (any_eval(runs, n, eval_rankme)) quality_charts(f, runs, n, labels);
}

// ---- memory ----

static double measured_peak(const Run *run) {
  if (isfinite(run->peak_rss)) return run->peak_rss;
  int field = ledger_field_find("peak_rss_bytes");
  double most = NAN;
  for (int i = 0; i < run->n_recs; i++) {
    double v = ledger_field_value(&run->recs[i], field);
    if (isfinite(v) && !(v <= most)) most = v;
  }
  return most;
}

// Peak memory, one group of bars per run on one axis: the planned peak (`tally plan`'s total,
// recorded when the run started) beside the measured one (the process' peak resident set).
static void memory_bars(FILE *f, const Run *runs, int n) {
  fputs("<h2>Memory</h2>\n", f);
  double top = 0;
  for (int k = 0; k < n; k++) {
    const double v[2] = {runs[k].planned_peak, measured_peak(&runs[k])};
    for (int b = 0; b < 2; b++)
      if (isfinite(v[b])) top = fmax(top, v[b]);
  }
  if (!(top > 0)) {
    fputs("<p class=\"none\">No peak memory recorded.</p>\n", f);
    return;
  }
  ChartPlot p = chart_plot(0, n, CHART_PLAIN, 0, top, CHART_BYTES);
  p.x.n_ticks = 0;  // the runs are named under their bars instead
  fputs("<div class=\"wide\">", f);
  chart_open(f, "Peak memory: planned beside measured", "", &p);
  const double group_px = chart_px_x(&p, 1) - chart_px_x(&p, 0);
  const double bar_px = fmin(group_px * 0.32, 90);
  static const char *const kinds[2] = {"planned", "measured"};
  for (int k = 0; k < n; k++) {
    const double v[2] = {runs[k].planned_peak, measured_peak(&runs[k])};
    const double centre = chart_px_x(&p, k + 0.5);
    for (int b = 0; b < 2; b++) {
      const double x = centre + (b ? 2 : -2 - bar_px);
      if (!isfinite(v[b])) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">no %s "
                "peak</text>\n",
                x + bar_px / 2, chart_px_y(&p, 0) - 6, kinds[b]);
        continue;
      }
      char text[48];
      format_bytes(v[b], text, sizeof text);
      const double y = chart_px_y(&p, v[b]), height = chart_px_y(&p, 0) - y;
      fprintf(f,
              "<rect class=\"bar %s\" data-bytes=\"%.0f\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
              "height=\"%.1f\" fill=\"%s\" stroke=\"%s\"><title>",
              kinds[b], v[b], x, y, bar_px, height, run_color(k), run_color(k));
      html_put_text(f, runs[k].name);
      fprintf(f, ": %s peak %s</title></rect>\n", kinds[b], text);
      fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"value\" text-anchor=\"middle\">%s</text>\n",
              x + bar_px / 2, y - 4, text);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tick x\" text-anchor=\"middle\">", centre,
            CHART_H - CHART_MARGIN_B + 16);
    html_put_text(f, runs[k].name);
    fputs("</text>\n", f);
  }
  fputs(
      "</svg>\n<figcaption><span class=\"key\"><span class=\"swatch planned\"></span>planned "
      "peak (<code>tally plan</code>'s total, drawn up before the run started)</span> "
      "<span class=\"key\"><span class=\"swatch measured\"></span>measured peak resident "
      "memory</span></figcaption></figure></div>\n",
      f);
  for (int k = 0; k < n; k++) {
    const double planned = runs[k].planned_peak, measured = measured_peak(&runs[k]);
    char a[48], b[48];
    format_bytes(measured, a, sizeof a);
    format_bytes(planned, b, sizeof b);
    fputs("<p class=\"sub\"><b>", f);
    html_put_text(f, runs[k].name);
    fputs("</b>: ", f);
    if (isfinite(planned) && isfinite(measured))
      fprintf(f, "measured %s, %.0f%% of the planned %s", a, 100 * measured / planned, b);
    else if (isfinite(measured))
      fprintf(f,
              "measured %s; no planned peak recorded (a run from before summary.json kept it, "
              "an unfinished one, or one under mpi)",
              a);
    else if (isfinite(planned))
      fprintf(f, "planned %s; no measured peak recorded", b);
    else
      fputs("no peak memory recorded", f);
    fputs("</p>\n", f);
  }
}

// ---- the cost table ----

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The median of a field's finite values over the run (n log n: ledgers may hold 100k records).
static double median_field(const Run *run, const char *name) {
  int field = ledger_field_find(name), n = 0;
  double *v = malloc(sizeof(double) * run->n_recs);
  if (!v) TL_DIE("out of memory");
  for (int i = 0; i < run->n_recs; i++) {
    double x =
        field >= 0 ? ledger_field_value(&run->recs[i], field) : ledger_value(&run->recs[i], name);
    if (isfinite(x)) v[n++] = x;
  }
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  double m = n == 0 ? NAN : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  free(v);
  return m;
}

static double last_field(const Run *run, const char *name) {
  return ledger_value(&run->recs[run->n_recs - 1], name);
}

static void cell(FILE *f, const char *text) {
  fputs("<td>", f);
  html_put_text(f, text);
  fputs("</td>", f);
}

// The fields only some runs' objectives declare (moco's queue, mae's patches) that answer
// `group`, a row each in the order the runs declare them, at the last step; "-" for a run whose
// objective has none.
static void own_field_rows(FILE *f, const Run *runs, int n, LedgerGroup group) {
  for (int k = 0; k < n; k++) {
    const LedgerOwnFields *own = runs[k].n_recs ? runs[k].recs[0].own_fields : NULL;
    for (int i = 0; own && i < own->n; i++) {
      const LedgerFieldInfo *fi = &own->field[i];
      if (fi->group != group) continue;
      int shown = 0;  // by an earlier run
      for (int j = 0; j < k && !shown; j++)
        shown = runs[j].n_recs && !isnan(last_field(&runs[j], fi->name));
      if (shown) continue;
      fputs("<tr><th>", f);
      html_put_text(f, fi->name);
      fputs("</th>", f);
      for (int j = 0; j < n; j++) {
        const double v = runs[j].n_recs ? last_field(&runs[j], fi->name) : NAN;
        char buf[32];
        if (isnan(v))
          snprintf(buf, sizeof buf, "-");
        else if (fi->unit == UNIT_BYTES)
          format_bytes(v, buf, sizeof buf);
        else
          snprintf(buf, sizeof buf, "%.4g", v);
        cell(f, buf);
      }
      fputs("</tr>\n", f);
    }
  }
}

// What each group of views cost (multi-crop: a few large crops and several small ones).
static void view_group_rows(FILE *f, const Run *runs, int n) {
  int groups = 0;
  for (int k = 0; k < n; k++)
    if (runs[k].recs[runs[k].n_recs - 1].view_groups > groups)
      groups = runs[k].recs[runs[k].n_recs - 1].view_groups;
  for (int g = 0; g < groups && groups > 1; g++) {
    fprintf(f, "<tr><th>view group %d: views, FLOPs forward + backward, activations</th>", g);
    for (int k = 0; k < n; k++) {
      const LedgerRecord *r = &runs[k].recs[runs[k].n_recs - 1];
      if (g >= r->view_groups) {
        cell(f, "-");
        continue;
      }
      const LedgerViewGroup *v = &r->view_group[g];
      char bytes[32], flops[32], text[160];
      format_bytes((double)v->activation_bytes, bytes, sizeof bytes);
      format_quantity(QTY_FLOPS, v->flops_forward + v->flops_backward, flops, sizeof flops);
      snprintf(text, sizeof text, "%d × %d px: %ld + %ld without gradient, %s, %s", v->count,
               v->size, v->views_grad, v->views_nograd, flops, bytes);
      cell(f, text);
    }
    fputs("</tr>\n", f);
  }
}

// How a row of the cost table reads its runs' ledgers: the last record's value (counts and bytes
// hold for every step), the median over the run (times), or the sum of the model's bytes.
typedef enum { ROW_LAST, ROW_MEDIAN, ROW_MODEL_BYTES } RowKind;

// A row of the cost table: its question and its unit are its field's (the ledger's field table).
static const struct {
  const char *label, *field;
  RowKind kind;
} cost_rows[] = {
    {"views with gradient", "views_grad", ROW_LAST},
    {"views without gradient", "views_nograd", ROW_LAST},
    {"negatives per query", "negatives_per_query", ROW_LAST},
    {"activations held for backward", "activation_bytes", ROW_LAST},
    {"&nbsp;&nbsp;of which encoder", "activation_encoder_bytes", ROW_LAST},
    {"&nbsp;&nbsp;head", "activation_head_bytes", ROW_LAST},
    {"&nbsp;&nbsp;decoder", "activation_decoder_bytes", ROW_LAST},
    {"&nbsp;&nbsp;loss", "activation_loss_bytes", ROW_LAST},
    {"activation gradients", "activation_grad_bytes", ROW_LAST},
    {"parameters + gradients + optimizer", "param_bytes", ROW_MODEL_BYTES},
    {"momentum encoder", "momentum_encoder_bytes", ROW_LAST},
    {"workspace", "workspace_bytes", ROW_LAST},
    {"data buffers", "data_bytes", ROW_LAST},
    {"queue", "queue_bytes", ROW_LAST},
    {"encodings made anew", "encodings_next_new", ROW_LAST},
    {"encodings reused (cached)", "encodings_next_reused", ROW_LAST},
    {"FLOPs forward", "flops_forward", ROW_LAST},
    {"FLOPs backward", "flops_backward", ROW_LAST},
    {"bytes communicated", "comm_bytes", ROW_LAST},
    {"waiting for data (median)", "data_ms", ROW_MEDIAN},
    {"forward (median)", "forward_ms", ROW_MEDIAN},
    {"backward (median)", "backward_ms", ROW_MEDIAN},
    {"communicating (median)", "comm_ms", ROW_MEDIAN},
    {"in the optimizer (median)", "optimizer_ms", ROW_MEDIAN},
    {"step (median)", "step_ms", ROW_MEDIAN},
    {"images/s (median)", "images_per_s", ROW_MEDIAN},
};

static double row_value(const Run *run, size_t row) {
  switch (cost_rows[row].kind) {
    case ROW_MODEL_BYTES:
      return last_field(run, "param_bytes") + last_field(run, "grad_bytes") +
             last_field(run, "optimizer_bytes");
    case ROW_MEDIAN:
      return median_field(run, cost_rows[row].field);
    default:
      return last_field(run, cost_rows[row].field);
  }
}

static void question_row(FILE *f, const char *title, int n) {
  fprintf(f, "<tr class=\"question\"><th colspan=\"%d\">", n + 1);
  html_put_text(f, title);
  fputs("</th></tr>\n", f);
}

// What a step of each run costs, side by side, its rows under the ledger's questions (what was
// encoded, what is held, what is cached from earlier steps, what the next step must redo), then
// cost and time, then what the whole run spent.
static void cost_table(FILE *f, const Run *runs, int n) {
  fputs(
      "<h2>Cost of a step</h2>\n<div class=\"scroll\"><table class=\"cost\">\n"
      "<thead><tr><th>per step</th>",
      f);
  for (int k = 0; k < n; k++) {
    fprintf(f, "<th><span class=\"swatch\" style=\"background:%s\"></span>", run_color(k));
    html_put_text(f, runs[k].objective);
    fputs("<br><span class=\"sub\">", f);
    html_put_text(f, runs[k].name);
    fputs("</span></th>", f);
  }
  fputs("</tr></thead>\n<tbody>\n", f);
  static const LedgerGroup questions[] = {LEDGER_ENCODED, LEDGER_HELD, LEDGER_CACHED,
                                          LEDGER_NEXT,    LEDGER_COST, LEDGER_TIME};
  char buf[64];
  for (size_t q = 0; q < sizeof questions / sizeof *questions; q++) {
    question_row(f, ledger_group_title(questions[q]), n);
    for (size_t i = 0; i < sizeof cost_rows / sizeof *cost_rows; i++) {
      if (ledger_field_info(ledger_field_find(cost_rows[i].field))->group != questions[q]) continue;
      int any = 0;
      for (int k = 0; k < n; k++) any |= isfinite(row_value(&runs[k], i));
      if (!any) continue;
      fprintf(f, "<tr><th>%s</th>", cost_rows[i].label);
      for (int k = 0; k < n; k++) {
        ledger_format_value(ledger_field_info(ledger_field_find(cost_rows[i].field))->unit,
                            row_value(&runs[k], i), buf, sizeof buf);
        cell(f, buf);
      }
      fputs("</tr>\n", f);
    }
    own_field_rows(f, runs, n, questions[q]);
    if (questions[q] == LEDGER_ENCODED) view_group_rows(f, runs, n);
  }
  // What the run spent in all, and what a unit of compute bought (the accuracy gained over raw
  // pixels per PFLOP).
  question_row(f, "What the whole run spent", n);
  static const char *const labels[] = {"training compute (every replica)", "training time",
                                       "kNN gain over raw pixels per PFLOP", "peak resident memory",
                                       "planned peak memory"};
  for (int row = 0; row < 5; row++) {
    fprintf(f, "<tr><th>%s</th>", labels[row]);
    for (int k = 0; k < n; k++) {
      const Run *r = &runs[k];
      double flops = last_field(r, "flops_total"), seconds = last_field(r, "train_seconds");
      double v = row == 0   ? flops
                 : row == 1 ? seconds
                 : row == 2 ? (last_knn(r) - r->knn_raw) / (flops / 1e15)
                 : row == 3 ? measured_peak(r)
                            : r->planned_peak;
      if (!isfinite(v))
        snprintf(buf, sizeof buf, "-");
      else if (row < 2)
        format_quantity(row == 0 ? QTY_FLOPS : QTY_SECONDS, v, buf, sizeof buf);
      else if (row == 2)
        snprintf(buf, sizeof buf, "%+.2f points", 100 * v);
      else
        format_bytes(v, buf, sizeof buf);
      cell(f, buf);
    }
    fputs("</tr>\n", f);
  }
  fputs(
      "</tbody></table></div>\n"
      "<p class=\"sub\">Counts, bytes and FLOPs are the last ledger record's; times are "
      "medians over the run. Every counted quantity can be drawn up before training with "
      "<code>tally plan</code>.</p>\n",
      f);
}

// ---- the runs and their configurations ----

// A term and its description in a run's card; `text` escaped.
static void card_item(FILE *f, const char *term, const char *text) {
  fprintf(f, "<dt>%s</dt><dd>", term);
  html_put_text(f, text);
  fputs("</dd>\n", f);
}

static const char *config_or(const Run *run, const char *key, const char *otherwise) {
  const char *v = config_value(run, key);
  return v && v[0] ? v : otherwise;
}

// What the run is: objective and model, data, batch, optimizer, length, what it ran, when.
static void run_card(FILE *f, const Run *run, int k) {
  fprintf(f,
          "<section class=\"card\" style=\"border-top-color:%s\"><h3>"
          "<span class=\"swatch\" style=\"background:%s\"></span>",
          run_color(k), run_color(k));
  html_put_text(f, run->name);
  fputs("</h3>\n<dl>\n", f);
  char text[2400];
  const char *model = config_value(run, "model.file");
  snprintf(text, sizeof text, "%s on %s%s%s%s", run->objective[0] ? run->objective : "?",
           run->backbone[0] ? run->backbone : config_or(run, "backbone.type", "?"),
           model ? " (" : "", model ? model : "", model ? ")" : "");
  card_item(f, "objective", text);
  if (run->n_config) {
    const char *labels = config_or(run, "data.labels", ""),
               *dataset = config_or(run, "data.dataset", "");
    snprintf(text, sizeof text, "%s%s%s, %s px, %s channel%s%s", dataset, dataset[0] ? ": " : "",
             config_or(run, "data.train", "?"), config_or(run, "data.image_size", "?"),
             config_or(run, "data.channels", "?"),
             strcmp(config_or(run, "data.channels", ""), "1") ? "s" : "",
             strcmp(labels, "none") == 0 ? ", unlabeled" : "");
    card_item(f, "data", text);
  }
  const char *batch = config_value(run, "train.batch_size");
  const char *replicas = config_or(run, "parallel.replicas", "1");
  if (run->batch_size > 0 || batch) {
    snprintf(text, sizeof text, "%d%s%s%s", run->batch_size > 0 ? run->batch_size : atoi(batch),
             strcmp(replicas, "1") ? " over " : "", strcmp(replicas, "1") ? replicas : "",
             strcmp(replicas, "1") ? " replicas" : "");
    card_item(f, "batch", text);
  }
  if (run->n_config) {
    const char *lr_batch = config_or(run, "optim.lr_batch", "0");
    snprintf(text, sizeof text, "%s, lr %s%s%s, %s schedule, %s warm-up steps, %s",
             config_or(run, "optim.name", "?"), config_or(run, "optim.lr", "?"),
             strcmp(lr_batch, "0") ? " × batch / " : "", strcmp(lr_batch, "0") ? lr_batch : "",
             config_or(run, "optim.schedule", "?"), config_or(run, "optim.warmup_steps", "?"),
             config_or(run, "train.precision", "fp32"));
    card_item(f, "optimizer", text);
    const char *budget = config_or(run, "train.budget", "");
    const char *steps = config_or(run, "train.steps", "0");
    if (budget[0])
      snprintf(text, sizeof text, "budget %s", budget);
    else if (strcmp(steps, "0"))
      snprintf(text, sizeof text, "%s steps", steps);
    else
      snprintf(text, sizeof text, "%s epochs", config_or(run, "train.epochs", "?"));
    card_item(f, "length", text);
  }
  const LedgerRecord *last = &run->recs[run->n_recs - 1];
  char flops[32] = "-", seconds[32] = "-";
  double v = ledger_value(last, "flops_total");
  if (isfinite(v)) format_quantity(QTY_FLOPS, v, flops, sizeof flops);
  v = ledger_value(last, "train_seconds");
  if (isfinite(v)) format_quantity(QTY_SECONDS, v, seconds, sizeof seconds);
  snprintf(text, sizeof text, "%d ledger records to step %ld, %s, %s; %s", run->n_recs, last->step,
           flops, seconds,
           run->finished ? "finished" : "no summary.json (interrupted, or still running)");
  card_item(f, "ran", text);
  if (run->started) {
    struct tm tm;
    localtime_r(&run->started, &tm);
    strftime(text, sizeof text, "%Y-%m-%d %H:%M %Z", &tm);
    card_item(f, "started", text);
  }
  if (run->recipe[0]) card_item(f, "recipe", run->recipe);
  if (!run->n_config) card_item(f, "configuration", "no config.ini in the run folder");
  fputs("</dl></section>\n", f);
}

// 1 when `section` is the own section of some run's objective ([moco], [mae], ...).
static int objective_section(const Run *runs, int n, const char *key) {
  for (int k = 0; k < n; k++) {
    size_t len = strlen(runs[k].objective);
    if (len && strncmp(key, runs[k].objective, len) == 0 && key[len] == '.') return 1;
  }
  return 0;
}

// Whether run k uses `key`: an objective's own section is read by runs of that objective only.
static int uses_key(const Run *runs, int n, int k, const char *key) {
  if (!runs[k].n_config) return 0;
  if (!objective_section(runs, n, key)) return 1;
  size_t len = strlen(runs[k].objective);
  return strncmp(key, runs[k].objective, len) == 0 && key[len] == '.';
}

// The configuration keys (config.ini, the model file's too) whose values differ between the runs
// that use them, a row each; the recipe first.
static void differences(FILE *f, const Run *runs, int n) {
  if (n < 2) return;
  fputs("<h2>What differs between these runs</h2>\n", f);
  int with_config = 0;
  for (int k = 0; k < n; k++) with_config += runs[k].n_config > 0;
  if (with_config < 2) {
    fputs(
        "<p class=\"none\">Fewer than two of the runs have a config.ini: there is no "
        "configuration to compare.</p>\n",
        f);
    return;
  }
  int rows = 0;
  for (int k = 0; k < n; k++)
    for (int i = 0; i < runs[k].n_config; i++) {
      const char *key = runs[k].config[i].key;
      int seen = 0, users = 0, differ = 0;
      const char *first = NULL;
      for (int j = 0; j < k && !seen; j++) seen = config_value(&runs[j], key) != NULL;
      if (seen) continue;
      for (int j = 0; j < n; j++) {
        if (!uses_key(runs, n, j, key)) continue;
        const char *v = config_value(&runs[j], key);
        users++;
        if (!first) first = v ? v : "";
        differ |= strcmp(first, v ? v : "") != 0;
      }
      if (!differ || users < 2) continue;
      if (!rows++) {
        fputs("<div class=\"scroll\"><table class=\"differences\">\n<thead><tr><th>key</th>", f);
        for (int j = 0; j < n; j++) {
          fprintf(f, "<th><span class=\"swatch\" style=\"background:%s\"></span>", run_color(j));
          html_put_text(f, runs[j].name);
          fputs("</th>", f);
        }
        fputs("</tr></thead>\n<tbody>\n", f);
      }
      fputs("<tr><th>", f);
      html_put_text(f, key);
      fputs("</th>", f);
      for (int j = 0; j < n; j++) {
        const char *v = config_value(&runs[j], key);
        if (!runs[j].n_config)
          fputs("<td class=\"none\">no config.ini</td>", f);
        else if (!uses_key(runs, n, j, key))
          fputs("<td class=\"none\">not used</td>", f);
        else
          cell(f, v ? v : "(absent)");
      }
      fputs("</tr>\n", f);
    }
  if (rows)
    fputs(
        "</tbody></table></div>\n<p class=\"sub\">Keys of config.ini (every key, defaults "
        "included, and the model file's as <code>backbone.*</code>) whose values differ; an "
        "objective's own section only between runs of that objective.</p>\n",
        f);
  else
    fputs("<p>The runs' resolved configurations (config.ini) are the same.</p>\n", f);
}

static void write_page(FILE *f, const Run *runs, int n) {
  fprintf(f,
          "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
          "<title>Tally report</title>\n<style>%s</style></head><body>\n",
          chart_page_style);
  fputs("<h1>Tally report</h1>\n<div class=\"cards\">\n", f);
  for (int k = 0; k < n; k++) run_card(f, &runs[k], k);
  fputs("</div>\n", f);
  differences(f, runs, n);

  char(*labels)[300] = calloc((size_t)n, sizeof *labels);
  if (!labels) TL_DIE("out of memory");
  for (int k = 0; k < n; k++)
    snprintf(labels[k], sizeof labels[k], "%s (%s)", runs[k].name, runs[k].objective);
  quality_section(f, runs, n, labels);
  loss_charts(f, runs, n, labels);
  pace_charts(f, runs, n, labels);
  memory_bars(f, runs, n);
  cost_table(f, runs, n);
  fputs("</body></html>\n", f);
  free(labels);
}

int report_write(int n_runs, const char *const *run_dirs, const char *out_path,
                 LedgerOwnLookup lookup) {
  Run *runs = calloc((size_t)n_runs, sizeof *runs);
  if (!runs) TL_DIE("out of memory");
  int rc = -1, loaded = 0;
  for (; loaded < n_runs; loaded++)
    if (load_run(&runs[loaded], run_dirs[loaded], lookup) != 0) goto out;
  AtomicFile a;
  if (output_path_check(out_path) != 0 || atomic_open(&a, out_path) != 0) goto out;
  write_page(a.f, runs, n_runs);
  if (atomic_commit(&a) != 0) goto out;
  rc = 0;
out:
  for (int k = 0; k < loaded; k++) run_free(&runs[k]);
  if (loaded < n_runs) run_free(&runs[loaded]);
  free(runs);
  return rc;
}

void report_default_path(const char *run_dir, char *out, size_t cap) {
  snprintf(out, cap, "%s/report.html", run_dir);
}
