// Quantities for people, each in the unit of its ladder that reads best: bytes ("1.50 GiB",
// "512 MiB", "0 B"; binary units), FLOPs ("350 GFLOP", "1.20 PFLOP") and durations ("850 ms",
// "12.5 s", "3.20 min", "1.50 h"), 3 significant digits. Tables, the plan and chart axes all
// take their units from here.
#pragma once
#include <stddef.h>

typedef enum { QTY_BYTES, QTY_FLOPS, QTY_SECONDS } Quantity;

// The unit a magnitude reads best in: the largest of the quantity's ladder not above |v| (the
// smallest for 0, NaN or anything below it). Returns its size in the quantity's base unit
// (bytes, FLOPs, seconds) and its name in *name.
double quantity_unit(Quantity q, double v, const char **name);

// v in its unit: 2 decimals below 10, 1 below 100, none above ("1.50 GiB", "12.5 s", "350
// GFLOP"); whole numbers in the smallest unit of bytes and FLOPs ("512 B", "96 FLOP"); zero in
// the base unit ("0 B", "0 FLOP", "0 s").
void format_quantity(Quantity q, double v, char *buf, size_t n);
void format_bytes(double bytes, char *buf, size_t n);
