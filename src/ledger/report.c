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
#include "ledger/bytes.h"
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
} Run;

// Series colours, one per run (and per memory category), readable on white.
static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                      "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};
enum { N_COLORS = sizeof palette / sizeof palette[0] };

// The value after "key": in a flat JSON object, or NULL.
static const char *json_value(const char *text, const char *key) {
  char pattern[96];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *p = strstr(text, pattern);
  if (!p) return NULL;
  p += strlen(pattern);
  while (*p == ' ') p++;
  return p;
}

static double json_number(const char *text, const char *key) {
  const char *p = json_value(text, key);
  if (!p) return NAN;
  char *end;
  double v = strtod(p, &end);
  return end == p ? NAN : v;
}

static void json_string(const char *text, const char *key, char *out, size_t n) {
  const char *p = json_value(text, key);
  out[0] = 0;
  if (!p || *p != '"') return;
  const char *end = strchr(p + 1, '"');
  if (!end) return;
  snprintf(out, n, "%.*s", (int)(end - p - 1), p + 1);
}

// DIR/FILE whole as a string (its length in *len_out) at *text: 0, or 1 when there is no such
// file, or -1 (error set) when it cannot be read. Regular files only, opened without blocking:
// a FIFO would wait for a writer forever and a device may never end.
static int read_text(const char *dir, const char *file, char **text, size_t *len_out) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  *text = NULL;
  int64_t bytes;
  int fd = regular_open(path, 0, &bytes);
  if (fd < 0) return errno == ENOENT ? 1 : -1;
  // The size read is what fstat said; a file still growing (a live run) is read up to there.
  size_t len = 0, size = (size_t)bytes;
  char *buf = malloc(size + 1);
  if (!buf) TL_DIE("out of memory reading %s (%zu bytes)", path, size);
  ssize_t got = 1;
  while (len < size && (got = read(fd, buf + len, size - len)) > 0) len += (size_t)got;
  int read_errno = errno;
  close(fd);
  if (got < 0) {
    free(buf);
    return tl_fail("%s: cannot read: %s", path, strerror(read_errno));
  }
  buf[len] = 0;
  *text = buf;
  if (len_out) *len_out = len;
  return 0;
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
  if (ledger_read_json(line, &run->recs[run->n_recs]) < 0) return -1;
  if (!run->n_recs) json_string(line, "objective", run->objective, sizeof run->objective);
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
  json_string(line, "what", what, sizeof what);
  if (line[0] != '{' || line[n - 1] != '}' || !what[0] || !json_value(line, "knn_top1") ||
      !isfinite(json_number(line, "step")))
    return -1;
  double linear = json_value(line, "linear_top1") ? json_number(line, "linear_top1") : NAN;
  if (strcmp(what, "raw_pixels") == 0) {
    run->knn_raw = json_number(line, "knn_top1");
    run->linear_raw = linear;
    return 0;
  }
  Eval *e = &run->evals[run->n_evals++];
  e->step = json_number(line, "step");
  e->top1 = json_number(line, "knn_top1");
  e->top1_k20 = json_number(line, "knn_top1_k20");
  e->linear_top1 = linear;
  e->rankme = json_number(line, "rankme");
  e->embedding_std = json_number(line, "embedding_std");
  e->embedding_std_reference = json_number(line, "embedding_std_reference");
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

static int load_run(Run *run, const char *dir) {
  memset(run, 0, sizeof *run);
  run->dir = dir;
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
    json_string(summary, "backbone", run->backbone, sizeof run->backbone);
    run->knn_final = json_number(summary, "knn_top1");
    run->peak_rss = json_number(summary, "peak_rss_bytes");
    double batch = json_number(summary, "batch_size");  // NaN when absent: no cast then
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

static void html_text(FILE *f, const char *s) {
  for (; *s; s++) switch (*s) {
      case '<':
        fputs("&lt;", f);
        break;
      case '>':
        fputs("&gt;", f);
        break;
      case '&':
        fputs("&amp;", f);
        break;
      case '"':
        fputs("&quot;", f);
        break;
      default:
        fputc(*s, f);
    }
}

// ---- charts ----

typedef struct {
  const char *label;
  const char *color;
  int n;
  const double *x, *y;  // (n); a point with a NaN or infinite coordinate is not drawn
  int dashed;           // a reference line (a baseline), drawn dashed without markers
} Series;

enum { CHART_W = 720, CHART_H = 280, MARGIN_L = 70, MARGIN_R = 20, MARGIN_T = 30, MARGIN_B = 42 };

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over span.
static double nice_step(double span, double target) {
  double raw = span / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
  return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

// An axis: the range drawn and its ticks, tick i at (first_tick + i) * step for i < n_ticks. Ticks
// are counted, never accumulated, so extreme values cannot make a tick loop run away.
enum { MAX_TICKS = 16 };
typedef struct {
  double lo, hi;
  double first_tick, step;
  int n_ticks;
} Axis;

// The axis over finite values lo <= hi: about `target` ticks at multiples of `unit`, no closer
// than min_step; `widen` extends the range to whole ticks. Differences are taken of halves, which
// cannot overflow (a range from -1e308 to 1e308).
static Axis make_axis(double lo, double hi, double target, double unit, double min_step,
                      int widen) {
  // One value, or values a billionth apart (one ulp; steps 1e17 and 1e17 + 16), cannot be told
  // apart on a few hundred pixels nor by their tick labels: the range is opened by their size.
  double size = fmax(fabs(lo), fabs(hi));
  if (!(hi / 2 - lo / 2 > size * 0.5e-9)) {
    double pad = size > 0 ? size : 1;
    if (isfinite(hi + pad))
      hi += pad;
    else
      lo -= pad;
  }
  double half = hi / 2 - lo / 2;
  double step = fmax(nice_step(half / unit, target / 2) * unit, min_step);
  if (!(step > 0 && isfinite(step))) step = half;
  if (widen) {
    double wide_lo = floor(lo / step) * step, wide_hi = ceil(hi / step) * step;
    if (isfinite(wide_lo)) lo = wide_lo;
    if (isfinite(wide_hi)) hi = wide_hi;
  }
  double first = ceil(lo / step - 1e-6), last = floor(hi / step + 1e-6);
  double n = last - first + 1;  // NaN if the division overflowed: no ticks then
  return (Axis){lo, hi, first, step, !(n >= 1) ? 0 : n > MAX_TICKS ? MAX_TICKS : (int)n};
}

static double axis_tick(const Axis *a, int i) { return (a->first_tick + i) * a->step; }

// Where v falls between the axis' ends, 0 to 1 (halves again, against overflow).
static double axis_fraction(const Axis *a, double v) {
  double t = (v / 2 - a->lo / 2) / (a->hi / 2 - a->lo / 2);
  return isfinite(t) ? t : 0.5;
}

typedef struct {
  Axis x, y;
} Plot;

static double px_x(const Plot *p, double x) {
  return MARGIN_L + axis_fraction(&p->x, x) * (CHART_W - MARGIN_L - MARGIN_R);
}
static double px_y(const Plot *p, double y) {
  double h = CHART_H - MARGIN_T - MARGIN_B;
  return MARGIN_T + h - axis_fraction(&p->y, y) * h;
}

typedef void (*TickFormat)(double v, char *buf, size_t n);
static void fmt_plain(double v, char *buf, size_t n) { snprintf(buf, n, "%g", v); }
static void fmt_bytes(double v, char *buf, size_t n) { format_bytes(v, buf, n); }
static void fmt_percent(double v, char *buf, size_t n) { snprintf(buf, n, "%g%%", v * 100); }

// The plot of steps x0..x1 against values y0..y1 (finite): steps tick at whole numbers; values
// widen to whole ticks, and byte values tick at round MiB or GiB (whole bytes at the least), not
// at round decimal numbers of bytes.
// x_whole: the x values are whole numbers (steps), so ticks are too.
static Plot plot_for(double x0, double x1, double y0, double y1, TickFormat fmt, int x_whole) {
  double unit = fmt != fmt_bytes ? 1 : y1 / 2 - y0 / 2 >= 0x1p29 ? 0x1p30 : 0x1p20;
  return (Plot){make_axis(x0, x1, 8, 1, x_whole, 0), make_axis(y0, y1, 5, unit, unit > 1, 1)};
}

// Opens an <svg> with its title, axes, grid and tick labels.
static void chart_open(FILE *f, const char *title, const char *x_label, const Plot *p,
                       TickFormat fmt) {
  fprintf(f,
          "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" role=\"img\">\n<title>",
          CHART_W, CHART_H, CHART_W, CHART_H);
  html_text(f, title);
  fprintf(f, "</title>\n<text x=\"%d\" y=\"18\" class=\"title\">", MARGIN_L);
  html_text(f, title);
  fputs("</text>\n", f);
  char buf[48];
  for (int i = 0; i < p->y.n_ticks; i++) {
    double y = axis_tick(&p->y, i), py = px_y(p, y);
    fmt(fabs(y) < p->y.step * 1e-9 ? 0 : y, buf, sizeof buf);
    fprintf(f,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
            "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
            MARGIN_L, CHART_W - MARGIN_R, py, py, MARGIN_L - 6, py + 4, buf);
  }
  for (int i = 0; i < p->x.n_ticks; i++)
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%g</text>\n",
            px_x(p, axis_tick(&p->x, i)), CHART_H - MARGIN_B + 16, axis_tick(&p->x, i));
  fprintf(f,
          "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" class=\"axis\"/>"
          "<text x=\"%d\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%s</text>\n",
          MARGIN_L, CHART_W - MARGIN_R, CHART_H - MARGIN_B, CHART_H - MARGIN_B,
          (MARGIN_L + CHART_W - MARGIN_R) / 2, CHART_H - 6, x_label);
}

// The caption: a key per series, and how many values were not drawn (NaN or infinite).
static void legend(FILE *f, int n, const char *const *labels, const char *const *colors,
                   long not_drawn) {
  fputs("<figcaption>", f);
  for (int i = 0; i < n; i++) {
    fprintf(f, "<span class=\"key\"><span class=\"swatch\" style=\"background:%s\"></span>",
            colors[i]);
    html_text(f, labels[i]);
    fputs("</span> ", f);
  }
  if (not_drawn)
    fprintf(f, "<span class=\"none\">%ld value%s not drawn (NaN or infinite)</span>", not_drawn,
            not_drawn == 1 ? "" : "s");
  fputs("</figcaption></figure>\n", f);
}

static int drawable(const Series *s, int i) { return isfinite(s->x[i]) && isfinite(s->y[i]); }

static void line_chart(FILE *f, const char *title, const char *x_label, const Series *s, int ns,
                       TickFormat fmt, int from_zero, int x_whole) {
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
    html_text(f, title);
    fputs(": nothing recorded", f);
    if (not_drawn) fprintf(f, " (%ld values NaN or infinite)", not_drawn);
    fputs(".</p>\n", f);
    return;
  }
  Plot p = plot_for(x0, x1, y0, y1, fmt, x_whole);
  chart_open(f, title, x_label, &p, fmt);
  for (int k = 0; k < ns; k++) {
    fprintf(f, "<polyline class=\"series%s\" stroke=\"%s\" points=\"",
            s[k].dashed ? " reference" : "", s[k].color);
    for (int i = 0; i < s[k].n; i++)
      if (drawable(&s[k], i)) fprintf(f, "%.1f,%.1f ", px_x(&p, s[k].x[i]), px_y(&p, s[k].y[i]));
    fputs("\"/>\n", f);
    // Markers where points are few enough to tell apart (evaluations, short runs).
    if (s[k].n <= 60 && !s[k].dashed)
      for (int i = 0; i < s[k].n; i++)
        if (drawable(&s[k], i))
          fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px_x(&p, s[k].x[i]),
                  px_y(&p, s[k].y[i]), s[k].color);
  }
  fputs("</svg>\n", f);
  const char *labels[16], *colors[16];
  for (int k = 0; k < ns && k < 16; k++) labels[k] = s[k].label, colors[k] = s[k].color;
  legend(f, ns < 16 ? ns : 16, labels, colors, not_drawn);
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
  Plot p = plot_for(x0, x1, 0, y1, fmt_bytes, 1);
  chart_open(f, title, "step", &p, fmt_bytes);
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
      const char *color = palette[b % N_COLORS];
      // A band: along the top edge, then back along the bottom edge. A single record is drawn
      // as a bar of the plot's width so it still shows.
      fprintf(f, "<path class=\"band\" fill=\"%s\" d=\"", color);
      double xl = n == 1 ? MARGIN_L : 0, xr = n == 1 ? CHART_W - MARGIN_R : 0;
      if (n == 1) {
        fprintf(f, "M%.1f,%.1f L%.1f,%.1f L%.1f,%.1f L%.1f,%.1f Z", xl, px_y(&p, upper[0]), xr,
                px_y(&p, upper[0]), xr, px_y(&p, lower[0]), xl, px_y(&p, lower[0]));
      } else {
        for (int i = 0; i < n; i++)
          fprintf(f, "%c%.1f,%.1f ", i ? 'L' : 'M', px_x(&p, x[i]), px_y(&p, upper[i]));
        for (int i = n - 1; i >= 0; i--)
          fprintf(f, "L%.1f,%.1f ", px_x(&p, x[i]), px_y(&p, lower[i]));
        fputc('Z', f);
      }
      fputs("\"/>\n", f);
      labels[shown] = memory_bands[b].label;
      colors[shown++] = color;
    }
    memcpy(lower, upper, sizeof(double) * n);
  }
  fputs("</svg>\n", f);
  legend(f, shown, labels, colors, 0);
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
    double x = ledger_field_value(&run->recs[i], field);
    if (isfinite(x)) v[n++] = x;
  }
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  double m = n == 0 ? NAN : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  free(v);
  return m;
}

static double last_field(const Run *run, const char *name) {
  return ledger_field_value(&run->recs[run->n_recs - 1], ledger_field_find(name));
}

static void cell(FILE *f, const char *text) {
  fputs("<td>", f);
  html_text(f, text);
  fputs("</td>", f);
}

static void cost_table(FILE *f, const Run *runs, int n) {
  fputs("<table>\n<thead><tr><th>per step</th>", f);
  for (int k = 0; k < n; k++) {
    fputs("<th>", f);
    html_text(f, runs[k].objective);
    fputs("<br><span class=\"sub\">", f);
    html_text(f, runs[k].name);
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
      {"patches encoded", "patches_encoded", 0},
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

static const char style[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;"
    "margin:2em auto;max-width:780px;color:#222;line-height:1.4}"
    "h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;"
    "border-bottom:1px solid #ddd;padding-bottom:.2em}"
    "figure{margin:1em 0}svg{background:#fff;max-width:100%;height:auto}"
    "svg .title{font-size:14px;font-weight:600;fill:#222}"
    "svg .tick{font-size:11px;fill:#555}svg .grid{stroke:#e6e6e6}svg .axis{stroke:#888}"
    "svg .series{fill:none;stroke-width:2}svg .reference{stroke-dasharray:6 4;stroke-width:1.5}svg "
    ".band{stroke:#fff;stroke-width:.5;opacity:.9}"
    "figcaption{font-size:.85em;color:#444}.key{margin-right:1em;white-space:nowrap}"
    ".swatch{display:inline-block;width:.9em;height:.9em;margin-right:.3em;"
    "vertical-align:-.1em;border-radius:2px}"
    "table{border-collapse:collapse;font-size:.9em;margin:1em 0}"
    "th,td{border:1px solid #ddd;padding:.3em .6em;text-align:right}"
    "thead th{background:#f4f4f4;text-align:center}tbody th{text-align:left;font-weight:normal}"
    ".sub{font-weight:normal;color:#666;font-size:.85em}.none{color:#888}"
    "ul.runs{padding-left:1.2em}";

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
    s[ns++] = (Series){labels[k], palette[k % N_COLORS], runs[k].n_evals, xs[k], ys[k], 0};
  }
  static char raw_label[] = "raw pixels (baseline)";
  for (int k = 0; any && k < (same_baseline ? 1 : n); k++) {
    double raw = linear ? runs[k].linear_raw : runs[k].knn_raw;
    if (!isfinite(raw)) continue;
    base[k][0] = 0, base[k][1] = x_end, base[k][2] = base[k][3] = raw;
    s[ns++] = (Series){same_baseline ? raw_label : labels[k],
                       same_baseline ? "#777777" : palette[k % N_COLORS],
                       2,
                       base[k],
                       base[k] + 2,
                       1};
  }
  if (any) {
    char title[160];
    snprintf(title, sizeof title, "%s top-1 accuracy against %s", linear ? "Linear probe" : "kNN",
             x_label);
    line_chart(f, title, x_label, s, ns, fmt_percent, 0, x == AXIS_STEP);
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
      s[k] = (Series){labels[k], palette[k % N_COLORS], runs[k].n_evals, xs[k], ys[k], 0};
    }
    int ns = n;
    if (charts[c].get == eval_spread)
      s[ns++] = (Series){threshold_label, "#777777", 2, threshold_x, threshold_y, 1};
    line_chart(f, charts[c].title, "step", s, ns, fmt_plain, 1, 1);
  }
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < runs[k].n_evals; i++) {
      const Eval *e = &runs[k].evals[i];
      if (!(eval_spread(e) < QUALITY_COLLAPSED_FRACTION)) continue;
      fputs("<p class=\"sub\">", f);
      html_text(f, labels[k]);
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
          style);
  fputs("<h1>Tally report</h1>\n<ul class=\"runs\">\n", f);
  for (int k = 0; k < n; k++) {
    const Run *r = &runs[k];
    fprintf(f, "<li><span class=\"swatch\" style=\"background:%s\"></span><b>",
            palette[k % N_COLORS]);
    html_text(f, r->name);
    fputs("</b>: ", f);
    html_text(f, r->objective);
    if (r->backbone[0]) {
      fputs(" on ", f);
      html_text(f, r->backbone);
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
    TickFormat fmt;
    int from_zero;
  } per_step[] = {
      {"Loss", "Training loss", "loss", fmt_plain, 0},
      {"Throughput", "Images per second", "images_per_s", fmt_plain, 1},
      {"Learning rate", "Learning rate (scheduled)", "lr", fmt_plain, 1},
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
      s[k] = (Series){labels[k], palette[k % N_COLORS], runs[k].n_recs, xs[k], ys[k], 0};
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

int report_write(int n_runs, const char *const *run_dirs, const char *out_path) {
  Run *runs = calloc((size_t)n_runs, sizeof *runs);
  if (!runs) TL_DIE("out of memory");
  int rc = -1, loaded = 0;
  for (; loaded < n_runs; loaded++)
    if (load_run(&runs[loaded], run_dirs[loaded]) != 0) goto out;
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
