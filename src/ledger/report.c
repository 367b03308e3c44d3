#include "ledger/report.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

typedef struct {
  const char *dir;
  char name[256];  // the folder's last component
  char objective[32];
  char backbone[32];
  LedgerRecord *recs;  // (n_recs) ledger.jsonl
  int n_recs;
  Eval *evals;  // (n_evals) encoder evaluations from eval.jsonl
  int n_evals;
  double knn_raw;     // raw-pixel baseline, NaN when absent
  double linear_raw;  // the raw-pixel linear probe, NaN when absent
  double knn_final;   // summary.json's knn_top1, NaN when absent
  double peak_rss;    // summary.json, NaN when absent
  int batch_size;
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

static int load_run(Run *run, const char *dir, LedgerOwnLookup lookup) {
  memset(run, 0, sizeof *run);
  run->dir = dir;
  run->lookup = lookup;
  run->knn_raw = run->linear_raw = run->knn_final = run->peak_rss = NAN;
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
    double batch = json_flat_number(summary, "batch_size");  // NaN when absent: no cast then
    run->batch_size = batch >= 1 && batch <= INT_MAX ? (int)batch : 0;
    free(summary);
  }
  attach_compute(run);
  return 0;
}

static void run_free(Run *run) {
  free(run->recs);
  free(run->evals);
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
                       ChartTickFormat fmt, int from_zero, int x_whole) {
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
  ChartPlot p = chart_plot(x0, x1, y0, y1, fmt, x_whole);
  chart_open(f, title, x_label, &p, fmt);
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

// The memory categories of the ledger, bottom of the stack first.
static const struct {
  const char *field, *label;
} memory_bands[] = {
    {"param_bytes", "parameters"},
    {"grad_bytes", "gradients"},
    {"optimizer_bytes", "optimizer"},
    {"momentum_encoder_bytes", "momentum encoder"},
    {"activation_bytes", "activations"},
    {"activation_grad_bytes", "activation gradients"},
    {"queue_bytes", "queue"},
    {"workspace_bytes", "workspace"},
    {"data_bytes", "data"},
    {"eval_bytes", "evaluation"},
};
enum { N_BANDS = sizeof memory_bands / sizeof memory_bands[0] };

static void memory_chart(FILE *f, const Run *run) {
  const int n = run->n_recs;
  double *x = malloc(sizeof(double) * n), *lower = calloc((size_t)n, sizeof(double));
  double *upper = malloc(sizeof(double) * n);
  if (!x || !lower || !upper) TL_DIE("out of memory");
  int step_field = ledger_field_find("step"), band_field[N_BANDS];
  for (int b = 0; b < N_BANDS; b++) band_field[b] = ledger_field_find(memory_bands[b].field);
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0;
  for (int i = 0; i < n; i++) {
    x[i] = ledger_field_value(&run->recs[i], step_field);
    x0 = fmin(x0, x[i]), x1 = fmax(x1, x[i]);
    double total = 0;
    for (int b = 0; b < N_BANDS; b++) {
      double v = ledger_field_value(&run->recs[i], band_field[b]);
      total += isfinite(v) ? v : 0;
    }
    y1 = fmax(y1, total);
  }
  char title[400];
  snprintf(title, sizeof title, "Memory by category: %s (%s)", run->name, run->objective);
  ChartPlot p = chart_plot(x0, x1, 0, y1, chart_fmt_bytes, 1);
  chart_open(f, title, "step", &p, chart_fmt_bytes);
  const char *labels[N_BANDS], *colors[N_BANDS];
  int shown = 0;
  for (int b = 0; b < N_BANDS; b++) {
    double most = 0;
    for (int i = 0; i < n; i++) {
      double v = ledger_field_value(&run->recs[i], band_field[b]);
      upper[i] = lower[i] + (isfinite(v) ? v : 0);
      most = fmax(most, upper[i] - lower[i]);
    }
    if (most > 0) {
      const char *color = chart_palette[b % CHART_N_COLORS];
      // A band: along the top edge, then back along the bottom edge. A single record is drawn
      // as a bar of the plot's width so it still shows.
      fprintf(f, "<path class=\"band\" fill=\"%s\" d=\"", color);
      double xl = n == 1 ? CHART_MARGIN_L : 0, xr = n == 1 ? CHART_W - CHART_MARGIN_R : 0;
      if (n == 1) {
        fprintf(f, "M%.1f,%.1f L%.1f,%.1f L%.1f,%.1f L%.1f,%.1f Z", xl, chart_px_y(&p, upper[0]),
                xr, chart_px_y(&p, upper[0]), xr, chart_px_y(&p, lower[0]), xl,
                chart_px_y(&p, lower[0]));
      } else {
        for (int i = 0; i < n; i++)
          fprintf(f, "%c%.1f,%.1f ", i ? 'L' : 'M', chart_px_x(&p, x[i]), chart_px_y(&p, upper[i]));
        for (int i = n - 1; i >= 0; i--)
          fprintf(f, "L%.1f,%.1f ", chart_px_x(&p, x[i]), chart_px_y(&p, lower[i]));
        fputc('Z', f);
      }
      fputs("\"/>\n", f);
      labels[shown] = memory_bands[b].label;
      colors[shown++] = color;
    }
    memcpy(lower, upper, sizeof(double) * n);
  }
  fputs("</svg>\n", f);
  chart_legend(f, shown, labels, colors, 0);
  free(x);
  free(lower);
  free(upper);
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

static void cell(FILE *f, const char *text);

// The fields only some runs' objectives declare (moco's queue, mae's patches), a row each in
// the order the runs declare them, at the last step; "-" for a run whose objective has none.
static void own_field_rows(FILE *f, const Run *runs, int n) {
  for (int k = 0; k < n; k++) {
    const LedgerOwnFields *own = runs[k].n_recs ? runs[k].recs[0].own_fields : NULL;
    for (int i = 0; own && i < own->n; i++) {
      const LedgerFieldInfo *fi = &own->field[i];
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

static void cell(FILE *f, const char *text) {
  fputs("<td>", f);
  html_put_text(f, text);
  fputs("</td>", f);
}

static void cost_table(FILE *f, const Run *runs, int n) {
  fputs("<table>\n<thead><tr><th>per step</th>", f);
  for (int k = 0; k < n; k++) {
    fputs("<th>", f);
    html_put_text(f, runs[k].objective);
    fputs("<br><span class=\"sub\">", f);
    html_put_text(f, runs[k].name);
    fputs("</span></th>", f);
  }
  fputs("</tr></thead>\n<tbody>\n<tr><th>backbone</th>", f);
  for (int k = 0; k < n; k++) cell(f, runs[k].backbone[0] ? runs[k].backbone : "-");
  fputs("</tr>\n", f);
  static const struct {
    const char *label, *field;
    int kind;  // 0 count, 1 bytes, 2 flops, 3 ms, 4 rate, 5 the model's own bytes (sum)
  } rows[] = {
      {"views with gradient", "views_grad", 0},
      {"views without gradient", "views_nograd", 0},
      {"negatives per query", "negatives_per_query", 0},
      {"next step: encodings made anew", "encodings_next_new", 0},
      {"next step: encodings reused (cached)", "encodings_next_reused", 0},
      {"activations held for backward", "activation_bytes", 1},
      {"&nbsp;&nbsp;of which encoder", "activation_encoder_bytes", 1},
      {"&nbsp;&nbsp;head", "activation_head_bytes", 1},
      {"&nbsp;&nbsp;decoder", "activation_decoder_bytes", 1},
      {"&nbsp;&nbsp;loss", "activation_loss_bytes", 1},
      {"activation gradients", "activation_grad_bytes", 1},
      {"parameters + gradients + optimizer", NULL, 5},
      {"momentum encoder", "momentum_encoder_bytes", 1},
      {"queue", "queue_bytes", 1},
      {"FLOPs forward", "flops_forward", 2},
      {"FLOPs backward", "flops_backward", 2},
      {"ms waiting for data (median)", "data_ms", 3},
      {"ms forward (median)", "forward_ms", 3},
      {"ms backward (median)", "backward_ms", 3},
      {"ms communicating (median)", "comm_ms", 3},
      {"ms in the optimizer (median)", "optimizer_ms", 3},
      {"ms per step (median)", "step_ms", 3},
      {"images/s (median)", "images_per_s", 4},
  };
  char buf[64];
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    fprintf(f, "<tr><th>%s</th>", rows[i].label);
    for (int k = 0; k < n; k++) {
      double v = rows[i].kind == 5
                     ? last_field(&runs[k], "param_bytes") + last_field(&runs[k], "grad_bytes") +
                           last_field(&runs[k], "optimizer_bytes")
                 : rows[i].kind >= 3 ? median_field(&runs[k], rows[i].field)
                                     : last_field(&runs[k], rows[i].field);
      if (!isfinite(v))
        snprintf(buf, sizeof buf, "-");
      else if (rows[i].kind == 1 || rows[i].kind == 5)
        format_bytes(v, buf, sizeof buf);
      else if (rows[i].kind == 2)
        snprintf(buf, sizeof buf, "%.2f GFLOP", v / 1e9);
      else if (rows[i].kind == 3)
        snprintf(buf, sizeof buf, "%.1f", v);
      else
        snprintf(buf, sizeof buf, "%.0f", v);
      cell(f, buf);
    }
    fputs("</tr>\n", f);
  }
  own_field_rows(f, runs, n);
  // What each group of views cost (multi-crop: a few large crops and several small ones).
  int groups = 0;
  for (int k = 0; k < n; k++)
    if (runs[k].n_recs && runs[k].recs[runs[k].n_recs - 1].view_groups > groups)
      groups = runs[k].recs[runs[k].n_recs - 1].view_groups;
  for (int g = 0; g < groups && groups > 1; g++) {
    fprintf(f, "<tr><th>view group %d: views, FLOPs forward + backward, activations</th>", g);
    for (int k = 0; k < n; k++) {
      const LedgerRecord *r = runs[k].n_recs ? &runs[k].recs[runs[k].n_recs - 1] : NULL;
      if (!r || g >= r->view_groups) {
        cell(f, "-");
        continue;
      }
      const LedgerViewGroup *v = &r->view_group[g];
      char bytes[32], text[160];
      format_bytes((double)v->activation_bytes, bytes, sizeof bytes);
      snprintf(text, sizeof text, "%d × %d px: %ld + %ld without gradient, %.2f GFLOP, %s",
               v->count, v->size, v->views_grad, v->views_nograd,
               (v->flops_forward + v->flops_backward) / 1e9, bytes);
      cell(f, text);
    }
    fputs("</tr>\n", f);
  }
  // Per run: the last evaluation, what training spent, and what a unit of compute bought (the
  // accuracy gained over raw pixels per PFLOP).
  static const char *const labels[] = {"kNN top-1 (last evaluation)",
                                       "training compute (every replica)", "training time",
                                       "kNN gain over raw pixels per PFLOP"};
  for (int row = 0; row < 4; row++) {
    fprintf(f, "<tr><th>%s</th>", labels[row]);
    for (int k = 0; k < n; k++) {
      const Run *r = &runs[k];
      double knn = r->n_evals ? r->evals[r->n_evals - 1].top1 : r->knn_final;
      double flops = last_field(r, "flops_total"), seconds = last_field(r, "train_seconds");
      double v = row == 0   ? knn
                 : row == 1 ? flops
                 : row == 2 ? seconds
                            : (knn - r->knn_raw) / (flops / 1e15);
      static const char *const formats[] = {"%.2f%%", "%.3g PFLOP", "%.0f s", "%+.2f points"};
      static const double scales[] = {100, 1e-15, 1, 100};
      if (isfinite(v))
        snprintf(buf, sizeof buf, formats[row], v * scales[row]);
      else
        snprintf(buf, sizeof buf, "-");
      cell(f, buf);
    }
    fputs("</tr>\n", f);
  }
  fputs("<tr><th>peak resident memory</th>", f);
  for (int k = 0; k < n; k++) {
    double v =
        isfinite(runs[k].peak_rss) ? runs[k].peak_rss : last_field(&runs[k], "peak_rss_bytes");
    format_bytes(v, buf, sizeof buf);
    cell(f, buf);
  }
  fputs("</tr>\n</tbody></table>\n", f);
}

typedef enum { AXIS_STEP, AXIS_PFLOP, AXIS_SECONDS } AxisKind;

static double eval_x(const Eval *e, AxisKind x) {
  return x == AXIS_STEP ? e->step : x == AXIS_PFLOP ? e->flops_total / 1e15 : e->seconds;
}

// Accuracy after each evaluation (kNN top-1 at the configured k, or the linear probe's), one line
// per run, against steps, training FLOPs or training seconds, with the raw-pixel baseline dashed
// (one line when every run has the same, i.e. the same data). The accuracy axis spans the data.
static void accuracy_chart(FILE *f, const Run *runs, int n, char (*labels)[300], AxisKind x,
                           const char *x_label, int linear) {
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
    s[ns++] =
        (Series){labels[k], chart_palette[k % CHART_N_COLORS], runs[k].n_evals, xs[k], ys[k], 0};
  }
  static char raw_label[] = "raw pixels (baseline)";
  for (int k = 0; any && k < (same_baseline ? 1 : n); k++) {
    double raw = linear ? runs[k].linear_raw : runs[k].knn_raw;
    if (!isfinite(raw)) continue;
    base[k][0] = 0, base[k][1] = x_end, base[k][2] = base[k][3] = raw;
    s[ns++] = (Series){same_baseline ? raw_label : labels[k],
                       same_baseline ? "#777777" : chart_palette[k % CHART_N_COLORS],
                       2,
                       base[k],
                       base[k] + 2,
                       1};
  }
  if (any) {
    char title[160];
    snprintf(title, sizeof title, "%s top-1 accuracy against %s", linear ? "Linear probe" : "kNN",
             x_label);
    line_chart(f, title, x_label, s, ns, chart_fmt_percent, 0, x == AXIS_STEP);
  }
  for (int k = 0; k < n; k++) free(xs[k]), free(ys[k]);
  free(xs);
  free(ys);
  free(s);
  free(base);
}

static double eval_knn(const Eval *e) { return e->top1; }
static double eval_rankme(const Eval *e) { return e->rankme; }
// embedding_std against what embeddings spread evenly over the sphere read: 1 then, 0 collapsed.
static double eval_spread(const Eval *e) { return e->embedding_std / e->embedding_std_reference; }

// 1 when some run has an evaluation whose `get` is finite.
static int any_eval(const Run *runs, int n, double (*get)(const Eval *)) {
  for (int k = 0; k < n; k++)
    for (int i = 0; i < runs[k].n_evals; i++)
      if (isfinite(get(&runs[k].evals[i]))) return 1;
  return 0;
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
  fputs("<h2>Label-free quality</h2>\n", f);
  static char threshold_label[] = "collapse threshold";
  const double threshold_x[2] = {0, last_step},
               threshold_y[2] = {QUALITY_COLLAPSED_FRACTION, QUALITY_COLLAPSED_FRACTION};
  static const struct {
    const char *title;
    double (*get)(const Eval *);
  } charts[] = {
      {"RankMe (effective rank of the embeddings) against step", eval_rankme},
      {"embedding_std as a fraction of 1/sqrt(d) against step (1: spread evenly over the sphere)",
       eval_spread},
  };
  for (int c = 0; c < 2; c++) {
    for (int k = 0; k < n; k++) {
      for (int i = 0; i < runs[k].n_evals; i++) ys[k][i] = charts[c].get(&runs[k].evals[i]);
      s[k] = (Series){labels[k], chart_palette[k % CHART_N_COLORS], runs[k].n_evals, xs[k], ys[k], 0};
    }
    int ns = n;
    if (charts[c].get == eval_spread)
      s[ns++] = (Series){threshold_label, "#777777", 2, threshold_x, threshold_y, 1};
    line_chart(f, charts[c].title, "step", s, ns, chart_fmt_plain, 1, 1);
  }
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
          "<p class=\"sub\">Measured on a fixed sample of the training images at every "
          "evaluation; an encoder is taken as collapsed when embedding_std falls below %g of "
          "1/sqrt(d).</p>\n",
          QUALITY_COLLAPSED_FRACTION);
  free(xs);
  free(ys);
  free(s);
}

static void write_page(FILE *f, const Run *runs, int n) {
  fprintf(f,
          "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<title>Tally report</title>\n<style>%s</style></head><body>\n",
          chart_page_style);
  fputs("<h1>Tally report</h1>\n<ul class=\"runs\">\n", f);
  for (int k = 0; k < n; k++) {
    const Run *r = &runs[k];
    fprintf(f, "<li><span class=\"swatch\" style=\"background:%s\"></span><b>",
            chart_palette[k % CHART_N_COLORS]);
    html_put_text(f, r->name);
    fputs("</b>: ", f);
    html_put_text(f, r->objective);
    if (r->backbone[0]) {
      fputs(" on ", f);
      html_put_text(f, r->backbone);
    }
    fprintf(f, ", %d ledger records", r->n_recs);
    if (r->batch_size > 0) fprintf(f, ", batch %d", r->batch_size);
    if (isfinite(r->knn_raw)) fprintf(f, ", kNN on raw pixels %.2f%%", 100 * r->knn_raw);
    fputs("</li>\n", f);
  }
  fputs("</ul>\n", f);

  Series *s = calloc((size_t)n, sizeof *s);
  double **xs = calloc((size_t)n, sizeof *xs), **ys = calloc((size_t)n, sizeof *ys);
  char(*labels)[300] = calloc((size_t)n, sizeof *labels);
  if (!s || !xs || !ys || !labels) TL_DIE("out of memory");
  static const struct {
    const char *heading, *title, *field;
    ChartTickFormat fmt;
    int from_zero;
  } per_step[] = {
      {"Loss", "Training loss", "loss", chart_fmt_plain, 0},
      {"Throughput", "Images per second", "images_per_s", chart_fmt_plain, 1},
      {"Learning rate", "Learning rate (scheduled)", "lr", chart_fmt_plain, 1},
  };
  for (size_t c = 0; c < sizeof per_step / sizeof per_step[0]; c++) {
    int step_field = ledger_field_find("step"), field = ledger_field_find(per_step[c].field);
    for (int k = 0; k < n; k++) {
      xs[k] = malloc(sizeof(double) * runs[k].n_recs);
      ys[k] = malloc(sizeof(double) * runs[k].n_recs);
      if (!xs[k] || !ys[k]) TL_DIE("out of memory");
      for (int i = 0; i < runs[k].n_recs; i++) {
        xs[k][i] = ledger_field_value(&runs[k].recs[i], step_field);
        ys[k][i] = ledger_field_value(&runs[k].recs[i], field);
      }
      snprintf(labels[k], sizeof labels[k], "%s (%s)", runs[k].name, runs[k].objective);
      s[k] =
          (Series){labels[k], chart_palette[k % CHART_N_COLORS], runs[k].n_recs, xs[k], ys[k], 0};
    }
    fprintf(f, "<h2>%s</h2>\n", per_step[c].heading);
    line_chart(f, per_step[c].title, "step", s, n, per_step[c].fmt, per_step[c].from_zero, 1);
    for (int k = 0; k < n; k++) free(xs[k]), free(ys[k]);
  }

  fputs("<h2>Accuracy against compute</h2>\n", f);
  static const struct {
    AxisKind x;
    const char *label;
  } axes[] = {{AXIS_STEP, "step"},
              {AXIS_PFLOP, "training PFLOP (every replica)"},
              {AXIS_SECONDS, "training seconds (evaluation excluded)"}};
  const int knn = any_eval(runs, n, eval_knn), quality = any_eval(runs, n, eval_rankme);
  for (size_t a = 0; knn && a < sizeof axes / sizeof *axes; a++) {
    accuracy_chart(f, runs, n, labels, axes[a].x, axes[a].label, 0);
    accuracy_chart(f, runs, n, labels, axes[a].x, axes[a].label, 1);
  }
  if (!knn && quality)
    fputs(
        "<p class=\"none\">No kNN evaluations recorded (no labels, or none to vote with): the "
        "label-free quality below is what the evaluations measured.</p>\n",
        f);
  else if (!knn)
    fputs("<p class=\"none\">No encoder evaluations recorded.</p>\n", f);
  if (quality) quality_charts(f, runs, n, labels);

  fputs("<h2>Memory</h2>\n", f);
  for (int k = 0; k < n; k++) memory_chart(f, &runs[k]);

  fputs("<h2>Cost of a step</h2>\n", f);
  cost_table(f, runs, n);
  fputs(
      "<p class=\"sub\">Counts, bytes and FLOPs are the last ledger record's; times are "
      "medians over the run. Every counted quantity can be drawn up before training with "
      "<code>tally plan</code>.</p>\n</body></html>\n",
      f);
  free(s);
  free(xs);
  free(ys);
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
