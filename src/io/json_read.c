#include "io/json_read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *json_flat_value(const char *text, const char *key) {
  char pattern[96];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *p = strstr(text, pattern);
  if (!p) return NULL;
  p += strlen(pattern);
  while (*p == ' ') p++;
  return p;
}

double json_flat_number(const char *text, const char *key) {
  const char *p = json_flat_value(text, key);
  if (!p) return NAN;
  char *end;
  double v = strtod(p, &end);
  return end == p ? NAN : v;
}

void json_flat_string(const char *text, const char *key, char *out, size_t n) {
  const char *p = json_flat_value(text, key);
  out[0] = 0;
  if (!p || *p != '"') return;
  const char *end = strchr(p + 1, '"');
  if (!end) return;
  snprintf(out, n, "%.*s", (int)(end - p - 1), p + 1);
}

double json_flat_bool(const char *text, const char *key) {
  const char *p = json_flat_value(text, key);
  if (p && strncmp(p, "true", 4) == 0) return 1;
  if (p && strncmp(p, "false", 5) == 0) return 0;
  return NAN;
}
