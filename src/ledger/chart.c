#include "ledger/chart.h"

#include <math.h>
#include <stdio.h>

#include "ledger/bytes.h"

const char *const chart_palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                     "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};

void html_put_text(FILE *f, const char *s) {
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

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over span.
static double nice_step(double span, double target) {
  double raw = span / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
  return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

// The unit an axis of `scale` over lo..hi is written in, and its smallest tick step.
static double axis_unit(ChartScale scale, double lo, double hi, const char **name,
                        double *min_step) {
  static const Quantity quantity[] = {
      [CHART_BYTES] = QTY_BYTES, [CHART_FLOPS] = QTY_FLOPS, [CHART_SECONDS] = QTY_SECONDS};
  *min_step = scale == CHART_WHOLE || scale == CHART_BYTES ? 1 : 0;
  *name = scale == CHART_PERCENT ? "%" : "";
  if (scale == CHART_PERCENT) return 0.01;
  if (scale < CHART_BYTES) return 1;
  return quantity_unit(quantity[scale], fmax(fabs(lo), fabs(hi)), name);
}

ChartAxis chart_axis(double lo, double hi, double target, ChartScale scale, int widen) {
  const char *unit_name;
  double min_step, unit = axis_unit(scale, lo, hi, &unit_name, &min_step);
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
  return (ChartAxis){
      lo,    hi,   first,    step, !(n >= 1) ? 0 : n > CHART_MAX_TICKS ? CHART_MAX_TICKS : (int)n,
      scale, unit, unit_name};
}

void chart_tick_label(const ChartAxis *a, double v, char *buf, size_t n) {
  if (fabs(v) < a->step * 1e-9) v = 0;  // a tick at 0 computed as 1e-17
  if (v == 0)
    snprintf(buf, n, "0");
  else
    snprintf(buf, n, "%g%s%s", v / a->unit,
             a->scale == CHART_PERCENT || !a->unit_name[0] ? "" : " ", a->unit_name);
}

double chart_axis_tick(const ChartAxis *a, int i) { return (a->first_tick + i) * a->step; }

// Where v falls between the axis' ends, 0 to 1 (halves again, against overflow).
static double axis_fraction(const ChartAxis *a, double v) {
  double t = (v / 2 - a->lo / 2) / (a->hi / 2 - a->lo / 2);
  return isfinite(t) ? t : 0.5;
}

double chart_px_x(const ChartPlot *p, double x) {
  return CHART_MARGIN_L + axis_fraction(&p->x, x) * (CHART_W - CHART_MARGIN_L - CHART_MARGIN_R);
}
double chart_px_y(const ChartPlot *p, double y) {
  double h = CHART_H - CHART_MARGIN_T - CHART_MARGIN_B;
  return CHART_MARGIN_T + h - axis_fraction(&p->y, y) * h;
}

ChartPlot chart_plot(double x0, double x1, ChartScale x_scale, double y0, double y1,
                     ChartScale y_scale) {
  // Fewer ticks across than the width allows: a tick label with its unit ("2.5 GFLOP") is wide.
  return (ChartPlot){chart_axis(x0, x1, 6, x_scale, 0), chart_axis(y0, y1, 5, y_scale, 1)};
}

void chart_open(FILE *f, const char *title, const char *x_label, const ChartPlot *p) {
  fprintf(f,
          "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" role=\"img\">\n<title>",
          CHART_W, CHART_H, CHART_W, CHART_H);
  html_put_text(f, title);
  fprintf(f, "</title>\n<text x=\"%d\" y=\"18\" class=\"title\">", CHART_MARGIN_L);
  html_put_text(f, title);
  fputs("</text>\n", f);
  char buf[48];
  for (int i = 0; i < p->y.n_ticks; i++) {
    double y = chart_axis_tick(&p->y, i), py = chart_px_y(p, y);
    chart_tick_label(&p->y, y, buf, sizeof buf);
    fprintf(f,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
            "<text x=\"%d\" y=\"%.1f\" class=\"tick y\" text-anchor=\"end\">%s</text>\n",
            CHART_MARGIN_L, CHART_W - CHART_MARGIN_R, py, py, CHART_MARGIN_L - 6, py + 4, buf);
  }
  for (int i = 0; i < p->x.n_ticks; i++) {
    double x = chart_axis_tick(&p->x, i);
    chart_tick_label(&p->x, x, buf, sizeof buf);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tick x\" text-anchor=\"middle\">%s</text>\n",
            chart_px_x(p, x), CHART_H - CHART_MARGIN_B + 16, buf);
  }
  fprintf(f,
          "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" class=\"axis\"/>"
          "<text x=\"%d\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%s</text>\n",
          CHART_MARGIN_L, CHART_W - CHART_MARGIN_R, CHART_H - CHART_MARGIN_B,
          CHART_H - CHART_MARGIN_B, (CHART_MARGIN_L + CHART_W - CHART_MARGIN_R) / 2, CHART_H - 6,
          x_label);
}

void chart_legend(FILE *f, int n, const char *const *labels, const char *const *colors,
                  long not_drawn) {
  fputs("<figcaption>", f);
  for (int i = 0; i < n; i++) {
    fprintf(f, "<span class=\"key\"><span class=\"swatch\" style=\"background:%s\"></span>",
            colors[i]);
    html_put_text(f, labels[i]);
    fputs("</span> ", f);
  }
  if (not_drawn)
    fprintf(f, "<span class=\"none\">%ld value%s not drawn (NaN or infinite)</span>", not_drawn,
            not_drawn == 1 ? "" : "s");
  fputs("</figcaption></figure>\n", f);
}

// Wide screens get the width (charts side by side in a grid, cards of the runs in a row); a
// narrow one a column, the tables scrolling sideways rather than squeezing.
const char chart_page_style[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;"
    "margin:1.5em auto;padding:0 2vw;max-width:1800px;color:#222;line-height:1.4}"
    "h1{font-size:1.6em;margin-bottom:.4em}h2{font-size:1.25em;margin-top:1.8em;"
    "border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em;margin:0 0 .4em}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,540px),1fr));"
    "gap:.5em 1.5em;align-items:start}"
    ".cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,320px),1fr));"
    "gap:1em}.card{border:1px solid #ddd;border-top:4px solid #888;border-radius:4px;"
    "padding:.7em 1em}.card dl{display:grid;grid-template-columns:max-content 1fr;"
    "gap:.15em .8em;margin:0;font-size:.9em}.card dt{color:#666}.card dd{margin:0;"
    "overflow-wrap:anywhere}"
    "figure{margin:.6em 0}svg{background:#fff;width:100%;height:auto}"
    ".wide svg{max-width:1100px}"
    "svg .title{font-size:14px;font-weight:600;fill:#222}"
    "svg .tick{font-size:11px;fill:#555}svg .grid{stroke:#e6e6e6}svg .axis{stroke:#888}"
    "svg .value{font-size:11px;fill:#222}svg .bar.planned{fill-opacity:.25;stroke-width:1.5;"
    "stroke-dasharray:4 3}"
    "svg .series{fill:none;stroke-width:2}svg .reference{stroke-dasharray:6 4;stroke-width:1.5}"
    "figcaption{font-size:.85em;color:#444}.key{margin-right:1em;display:inline-block}"
    ".swatch{display:inline-block;width:.9em;height:.9em;margin-right:.3em;"
    "vertical-align:-.1em;border-radius:2px}"
    ".swatch.planned{background:#ddd;border:1px dashed #555}.swatch.measured{background:#555}"
    ".scroll{overflow-x:auto}"
    "table{border-collapse:collapse;font-size:.9em;margin:1em 0}"
    "th,td{border:1px solid #ddd;padding:.3em .6em;text-align:right}"
    "thead th{background:#f4f4f4;text-align:center}tbody th{text-align:left;font-weight:normal}"
    "tr.question th{background:#eef3f8;font-weight:600;text-align:left}"
    ".sub{font-weight:normal;color:#666;font-size:.85em}.none{color:#888}"
    ".missing{background:#fff8e6;border-left:4px solid #e0a800;padding:.4em .8em}";
