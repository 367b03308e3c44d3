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

// What an axis measures, which decides its ticks and the unit they are written in.
typedef enum {
  CHART_PLAIN,    // numbers (loss, rank): %g
  CHART_WHOLE,    // whole numbers (steps): ticks are whole too
  CHART_PERCENT,  // fractions, written as percent
  // In the unit of bytes.h's ladder that the axis' largest value reads best in ("250 GFLOP",
  // "1.5 GiB", "3 min"), ticks at round numbers of that unit.
  CHART_BYTES,
  CHART_FLOPS,
  CHART_SECONDS
} ChartScale;

// An axis: the range drawn and its ticks, tick i at (first_tick + i) * step for i < n_ticks. Ticks
// are counted, never accumulated, so extreme values cannot make a tick loop run away.
enum { CHART_MAX_TICKS = 16 };
typedef struct {
  double lo, hi;
  double first_tick, step;
  int n_ticks;
  ChartScale scale;
  double unit;            // the ticks are written in multiples of it
  const char *unit_name;  // "" for none
} ChartAxis;

typedef struct {
  ChartAxis x, y;
} ChartPlot;

// The axis over finite values lo <= hi: about `target` ticks at round multiples of the scale's
// unit for the range; `widen` extends the range to whole ticks. Differences are taken of halves,
// which cannot overflow (a range from -1e308 to 1e308).
ChartAxis chart_axis(double lo, double hi, double target, ChartScale scale, int widen);
double chart_axis_tick(const ChartAxis *a, int i);
// v written in the axis' unit: "0", "250 GFLOP", "1.5 GiB", "25%", "0.35".
void chart_tick_label(const ChartAxis *a, double v, char *buf, size_t n);

// The plot of x0..x1 against values y0..y1 (finite); the values widen to whole ticks.
ChartPlot chart_plot(double x0, double x1, ChartScale x_scale, double y0, double y1,
                     ChartScale y_scale);
// Where x and y fall in the SVG's pixels.
double chart_px_x(const ChartPlot *p, double x);
double chart_px_y(const ChartPlot *p, double y);

// Opens an <svg> (inside a <figure>) with its title, axes, grid and tick labels, each in its
// axis' unit.
void chart_open(FILE *f, const char *title, const char *x_label, const ChartPlot *p);
// The caption that closes the figure: a key per series, and how many values were not drawn (NaN
// or infinite).
void chart_legend(FILE *f, int n, const char *const *labels, const char *const *colors,
                  long not_drawn);
