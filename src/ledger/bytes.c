#include "ledger/bytes.h"

#include <math.h>
#include <stdio.h>

typedef struct {
  const char *name;
  double size;  // in the quantity's base unit
} Unit;

static const Unit byte_units[] = {
    {"B", 1}, {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}};
static const Unit flop_units[] = {{"FLOP", 1},    {"kFLOP", 1e3},  {"MFLOP", 1e6},
                                  {"GFLOP", 1e9}, {"TFLOP", 1e12}, {"PFLOP", 1e15}};
static const Unit second_units[] = {{"ms", 1e-3}, {"s", 1}, {"min", 60}, {"h", 3600}};

static const Unit *ladder(Quantity q, int *n) {
  switch (q) {
    case QTY_FLOPS:
      *n = sizeof flop_units / sizeof *flop_units;
      return flop_units;
    case QTY_SECONDS:
      *n = sizeof second_units / sizeof *second_units;
      return second_units;
    default:
      *n = sizeof byte_units / sizeof *byte_units;
      return byte_units;
  }
}

double quantity_unit(Quantity q, double v, const char **name) {
  int n, u = 0;
  const Unit *units = ladder(q, &n);
  while (u + 1 < n && fabs(v) >= units[u + 1].size) u++;
  *name = units[u].name;
  return units[u].size;
}

void format_quantity(Quantity q, double v, char *buf, size_t n) {
  const char *name;
  const double size = quantity_unit(q, v, &name), x = v / size;
  if (v == 0) {
    // Nothing is the same in every unit: the base one reads best ("0 s", not "0.00 ms").
    quantity_unit(q, 1, &name);
    snprintf(buf, n, "0 %s", name);
  } else if (size == 1 && q != QTY_SECONDS) {
    snprintf(buf, n, "%.0f %s", x, name);
  } else {
    snprintf(buf, n, "%.*f %s", fabs(x) < 10 ? 2 : fabs(x) < 100 ? 1 : 0, x, name);
  }
}

void format_bytes(double bytes, char *buf, size_t n) { format_quantity(QTY_BYTES, bytes, buf, n); }
