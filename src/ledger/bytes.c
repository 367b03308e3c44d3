#include "ledger/bytes.h"

#include <math.h>
#include <stdio.h>

void format_bytes(double bytes, char *buf, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (fabs(bytes) >= 1024 && u < 4) bytes /= 1024, u++;
  if (u == 0)
    snprintf(buf, n, "%.0f B", bytes);
  else
    snprintf(buf, n, "%.*f %s", fabs(bytes) < 10 ? 2 : fabs(bytes) < 100 ? 1 : 0, bytes, units[u]);
}
