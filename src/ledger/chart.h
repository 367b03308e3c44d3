// The pieces Tally's HTML pages are drawn with (`tally report`, `tally compare`): inline SVG
// charts with nice ticks that survive extreme values, a legend, the page's style sheet. No
// scripts, no fonts or anything else fetched.
#pragma once
#include <stddef.h>
#include <stdio.h>

// Series colours, one per run (and per memory category), readable on white.
extern const char *const chart_palette[];
enum { CHART_N_COLORS = 10 };

// The page's style sheet (the charts' classes: title, tick, grid, axis, series, reference, band).
extern const char chart_page_style[];

// s as HTML text: <, >, & and " escaped.
void html_put_text(FILE *f, const char *s);

enum {
  CHART_W = 720,
  CHART_H = 280,
  CHART_MARGIN_L = 70,
  CHART_MARGIN_R = 20,
  CHART_MARGIN_T = 30,
  CHART_MARGIN_B = 42
};

// An axis: the range drawn and its ticks, tick i at (first_tick + i) * step for i < n_ticks. Ticks
// are counted, never accumulated, so extreme values cannot make a tick loop run away.
enum { CHART_MAX_TICKS = 16 };
typedef struct {
  double lo, hi;
  double first_tick, step;
  int n_ticks;
} ChartAxis;

typedef struct {
  ChartAxis x, y;
} ChartPlot;

typedef void (*ChartTickFormat)(double v, char *buf, size_t n);
void chart_fmt_plain(double v, char *buf, size_t n);    // %g
void chart_fmt_bytes(double v, char *buf, size_t n);    // 1.50 GiB
void chart_fmt_percent(double v, char *buf, size_t n);  // 0.25 as 25%

// The axis over finite values lo <= hi: about `target` ticks at multiples of `unit`, no closer
// than min_step; `widen` extends the range to whole ticks. Differences are taken of halves, which
// cannot overflow (a range from -1e308 to 1e308).
ChartAxis chart_axis(double lo, double hi, double target, double unit, double min_step, int widen);
double chart_axis_tick(const ChartAxis *a, int i);

// The plot of x0..x1 against values y0..y1 (finite): values widen to whole ticks, and byte values
// tick at round MiB or GiB (whole bytes at the least), not at round decimal numbers of bytes.
// x_whole: the x values are whole numbers (steps), so ticks are too.
ChartPlot chart_plot(double x0, double x1, double y0, double y1, ChartTickFormat fmt, int x_whole);
// Where x and y fall in the SVG's pixels.
double chart_px_x(const ChartPlot *p, double x);
double chart_px_y(const ChartPlot *p, double y);

// Opens an <svg> (inside a <figure>) with its title, axes, grid and tick labels; the y ticks
// written with fmt, the x ticks with %g.
void chart_open(FILE *f, const char *title, const char *x_label, const ChartPlot *p,
                ChartTickFormat fmt);
// The caption that closes the figure: a key per series, and how many values were not drawn (NaN
// or infinite).
void chart_legend(FILE *f, int n, const char *const *labels, const char *const *colors,
                  long not_drawn);
