#include "io/json_read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

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

// The end of the one object `text` holds (just after its closing brace), or NULL when it is
// not one: cut off, unbalanced, or text that is not JSON.
static const char *object_end(const char *text) {
  const char *p = text + strspn(text, " \t\r\n");
  if (*p != '{') return NULL;
  int depth = 0, in_string = 0;
  for (; *p; p++) {
    if (in_string) {
      if (*p == '\\' && p[1])
        p++;
      else if (*p == '"')
        in_string = 0;
    } else if (*p == '"') {
      in_string = 1;
    } else if (*p == '{' || *p == '[') {
      depth++;
    } else if (*p == '}' || *p == ']') {
      if (--depth == 0) return p + 1;
      if (depth < 0) return NULL;
    }
  }
  return NULL;
}

static int has_type(const char *text, const JsonMember *m) {
  const char *v = json_flat_value(text, m->key);
  if (!v) return 0;
  switch (m->type) {
    case JSON_STRING:
      return *v == '"';
    case JSON_BOOL:
      return !isnan(json_flat_bool(text, m->key));
    case JSON_NUMBER_OR_NULL:
      if (strncmp(v, "null", 4) == 0) return 1;
      return !isnan(json_flat_number(text, m->key));
    case JSON_NUMBER:
      return !isnan(json_flat_number(text, m->key));
  }
  return 0;
}

int json_flat_require(const char *text, const char *path, const JsonMember *members, int n) {
  const char *end = object_end(text);
  if (!end || end[strspn(end, " \t\r\n")] != 0)
    return tl_fail("%s: not a whole JSON object (cut off, or another kind of file)", path);
  for (int i = 0; i < n; i++)
    if (!has_type(text, &members[i]))
      return tl_fail("%s: no %s \"%s\" in it (another program's file?)", path,
                     members[i].type == JSON_STRING ? "text"
                     : members[i].type == JSON_BOOL ? "true/false"
                                                    : "number",
                     members[i].key);
  return 0;
}
