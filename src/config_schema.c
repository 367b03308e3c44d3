// The configuration engine: typed keys described by rows (KeySpec, config_keys.h) and read from
// INI text with inih. Each key's setter checks its type and range and reports "WHERE: [section]
// key = value is ..."; a misspelled section or key is answered with the nearest known name; files
// are refused before inih sees a line it would misread (NUL bytes, CR-only ends, over-long lines,
// text after a section header, indented continuations, a key set twice). It knows nothing of
// Tally's keys: those are the tables in config.c and the objectives' and backbones' sections.
#include "config_schema.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

// ---------------------------------------------------------------------------------------------
// Suggestions for misspelled names.

static size_t edit_distance(const char *a, const char *b) {
  enum { CAP = 64 };
  size_t la = strlen(a), lb = strlen(b);
  if (la >= CAP || lb >= CAP) return SIZE_MAX;
  size_t row[CAP], prev_diag;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    prev_diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = prev_diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      prev_diag = up;
    }
  }
  return row[lb];
}

// Keys are often abbreviations of the words people type ("learning_rate" is `lr`), which plain
// edit distance ranks far away; comparing the initials of a multi-word name catches them.
static size_t name_distance(const char *typed, const char *known) {
  size_t d = edit_distance(typed, known);
  if (!strchr(typed, '_')) return d;
  char initials[64];
  size_t n = 0;
  for (const char *c = typed; *c && n + 1 < sizeof initials; c++)
    if (c == typed || c[-1] == '_') initials[n++] = *c;
  initials[n] = '\0';
  size_t di = edit_distance(initials, known);
  return di < d ? di : d;
}

// Appends " (did you mean '<x>'?)" for a close candidate, or the list of candidates otherwise.
void schema_describe_alternatives(char *out, size_t cap, const char *typed,
                                  const char *const *names, size_t n, const char *open,
                                  const char *close, const char *what) {
  size_t best = SIZE_MAX, best_i = 0;
  for (size_t i = 0; i < n; i++) {
    size_t d = name_distance(typed, names[i]);
    if (d < best) best = d, best_i = i;
  }
  size_t len = strlen(typed);
  if (n > 0 && best <= (len / 2 > 1 ? len / 2 : 1)) {
    snprintf(out, cap, " (did you mean %s%s%s?)", open, names[best_i], close);
    return;
  }
  size_t used = (size_t)snprintf(out, cap, " (known %s:", what);
  for (size_t i = 0; i < n && used < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%s %s", i ? "," : "", names[i]);
  if (used < cap) snprintf(out + used, cap - used, ")");
}

// ---------------------------------------------------------------------------------------------
// Typed setters: one per key type, all reporting "WHERE: [section] key = value is ...".

// A list's entries: up to its first 0 (entries are at least 1) or its capacity.
static int schema_list_length(const KeySpec *k, const int *list) {
  int n = 0;
  while ((size_t)n < k->size / sizeof(int) && list[n] != 0) n++;
  return n;
}

char *schema_trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

// strtod for decimal text only: strtod also reads hexadecimal ("0x10" is 16), "inf" and "nan",
// none of which a recipe means as a number; for those nothing is read (*end == text).
double schema_strtod_decimal(const char *text, char **end) {
  double v = strtod(text, end);
  for (const char *c = text; c < *end; c++)
    if (strchr("xXpPiInN", *c)) {
      *end = (char *)text;
      return 0;
    }
  return v;
}

static int parse_integer(const char *text, long long *out) {
  if (!*text) return -1;
  char *end;
  errno = 0;
  *out = strtoll(text, &end, 10);
  return (*end || errno == ERANGE) ? -1 : 0;
}

// "(1..65536)" for integers; interval notation for floats, where an end can be excluded.
static void describe_range(const KeySpec *k, char *out, size_t cap) {
  if (k->type == KEY_FLOAT)
    snprintf(out, cap, "%c%.15g, %.15g%c", (k->open & OPEN_MIN) ? '(' : '[', k->min, k->max,
             (k->open & OPEN_MAX) ? ')' : ']');
  else
    snprintf(out, cap, "(%.15g..%.15g)", k->min, k->max);
}

static int in_range(const KeySpec *k, double v) {
  int above = (k->open & OPEN_MIN) ? v > k->min : v >= k->min;
  int below = (k->open & OPEN_MAX) ? v < k->max : v <= k->max;
  return above && below;
}

static int out_of_range(const KeySpec *k, const char *where, const char *text,
                        const char *element) {
  char range[96];
  describe_range(k, range, sizeof range);
  if (element)
    return tl_fail("%s: [%s] %s = %s: %s is out of range %s", where, k->section, k->key, text,
                   element, range);
  return tl_fail("%s: [%s] %s = %s is out of range %s", where, k->section, k->key, text, range);
}

static int set_int_list(const KeySpec *k, void *base, const char *where, const char *text) {
  size_t capacity = k->size / sizeof(int);
  int values[SCHEMA_MAX_LIST];
  TL_ASSERT(capacity <= SCHEMA_MAX_LIST);
  size_t n = 0;
  char buf[256];
  if (strlen(text) >= sizeof buf)
    return tl_fail("%s: [%s] %s is too long", where, k->section, k->key);
  strcpy(buf, text);
  if (!*schema_trim(buf))
    return tl_fail("%s: [%s] %s is empty (expected comma-separated integers)", where, k->section,
                   k->key);
  for (char *tok = buf, *next; tok; tok = next) {
    next = strchr(tok, ',');
    if (next) *next++ = '\0';
    tok = schema_trim(tok);
    long long v;
    if (parse_integer(tok, &v))
      return tl_fail("%s: [%s] %s = '%s': '%s' is not an integer", where, k->section, k->key, text,
                     tok);
    if (!in_range(k, (double)v)) return out_of_range(k, where, text, tok);
    if (n == capacity)
      return tl_fail("%s: [%s] %s = %s has more than %zu entries", where, k->section, k->key, text,
                     capacity);
    values[n++] = (int)v;
  }
  int *dst = (int *)((char *)base + k->offset);
  memset(dst, 0, k->size);
  memcpy(dst, values, n * sizeof(int));
  return 0;
}

static int is_choice(const char *choices, const char *text) {
  size_t len = strlen(text);
  for (const char *c = choices; *c;) {
    size_t n = strcspn(c, "|");
    if (n == len && strncmp(c, text, n) == 0) return 1;
    c += n + (c[n] == '|');
  }
  return 0;
}

int schema_ini_max_line(void) {
  // Debian's inih reads lines of at most INI_MAX_LINE (200) bytes into a buffer on the stack,
  // unless told at run time to take one from the heap, of ini_initial_alloc bytes (which it
  // hands the reader): room for a key and a path of PATH_MAX.
  ini_use_stack = false;
  ini_allow_realloc = false;
  ini_initial_alloc = ini_max_line = PATH_MAX + 64;
  return ini_max_line;
}

static int set_string(const KeySpec *k, void *base, const char *where, const char *text) {
  // A path (every path key holds PATH_MAX) starting with ~/ is the home folder's, as a
  // shell would read it: in `--set data.train=~/photos` the shell leaves the ~ alone.
  char expanded[PATH_MAX];
  const char *home = getenv("HOME");
  if (k->size == PATH_MAX && home && home[0] &&
      (strcmp(text, "~") == 0 || strncmp(text, "~/", 2) == 0)) {
    if (snprintf(expanded, sizeof expanded, "%s%s", home, text + 1) >= (int)sizeof expanded)
      return tl_fail("%s: [%s] %s = '%s' is longer than %d characters with ~ expanded", where,
                     k->section, k->key, text, PATH_MAX - 1);
    text = expanded;
  }
  if (k->choices && !is_choice(k->choices, text))
    return tl_fail("%s: [%s] %s = '%s' is not one of %s", where, k->section, k->key, text,
                   k->choices);
  // config_write must be able to write it back on one line that inih reads whole (it keeps
  // schema_ini_max_line() - 3 characters, strips the ends and cuts at ';' comments).
  size_t limit = k->size - 1;
  size_t line_limit = (size_t)schema_ini_max_line() - 3 - strlen(k->key) - strlen(" = ");
  if (line_limit < limit) limit = line_limit;
  if (strlen(text) > limit)
    return tl_fail("%s: [%s] %s is longer than %zu characters", where, k->section, k->key, limit);
  if (strpbrk(text, ";\n\r"))
    return tl_fail("%s: [%s] %s = '%s' contains ';' or a line break, which INI cannot hold", where,
                   k->section, k->key, text);
  char *dst = (char *)base + k->offset;
  memset(dst, 0, k->size);
  memcpy(dst, text, strlen(text));
  return 0;
}

static int set_key(const KeySpec *k, void *base, const char *where, const char *text) {
  char *field = (char *)base + k->offset;
  switch (k->type) {
    case KEY_INT: {
      long long v;
      if (parse_integer(text, &v))
        return tl_fail("%s: [%s] %s = '%s' is not an integer", where, k->section, k->key, text);
      if (!in_range(k, (double)v)) return out_of_range(k, where, text, NULL);
      *(int *)field = (int)v;
      return 0;
    }
    case KEY_FLOAT: {
      char *end;
      double v = schema_strtod_decimal(text, &end);
      if (!*text || *end || !isfinite(v))
        return tl_fail("%s: [%s] %s = '%s' is not a number", where, k->section, k->key, text);
      // The range is checked on the value stored: 1e-50 is a float 0 and 0.99999999999 a 1.
      if (!isfinite((float)v) || !in_range(k, (float)v)) return out_of_range(k, where, text, NULL);
      *(float *)field = (float)v;
      return 0;
    }
    case KEY_BOOL: {
      static const char *const truth[] = {"0", "1", "false", "true", "no", "yes", "off", "on"};
      for (size_t i = 0; i < sizeof truth / sizeof truth[0]; i++)
        if (strcasecmp(text, truth[i]) == 0) {
          *(int *)field = (int)(i % 2);
          return 0;
        }
      return tl_fail("%s: [%s] %s = '%s' is not a boolean (0/1, false/true, no/yes, off/on)", where,
                     k->section, k->key, text);
    }
    case KEY_U64: {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(text, &end, 10);
      if (!isdigit((unsigned char)text[0]) || *end || errno == ERANGE)
        return tl_fail("%s: [%s] %s = '%s' is not a non-negative integer", where, k->section,
                       k->key, text);
      *(unsigned long long *)field = v;
      return 0;
    }
    case KEY_STRING:
      return set_string(k, base, where, text);
    case KEY_INT_LIST:
      return set_int_list(k, base, where, text);
  }
  TL_DIE("key type %d", (int)k->type);
}

void schema_format_value(const KeySpec *k, const void *base, char *out, size_t cap) {
  const char *field = (const char *)base + k->offset;
  switch (k->type) {
    case KEY_INT:
    case KEY_BOOL:
      snprintf(out, cap, "%d", *(const int *)field);
      return;
    case KEY_FLOAT: {
      // The shortest form that reads back to the same float: 0.2 rather than 0.200000003.
      // 9 significant digits always suffice.
      float v = *(const float *)field;
      for (int digits = 1; digits <= 9; digits++) {
        snprintf(out, cap, "%.*g", digits, v);
        if (strtof(out, NULL) == v) break;
      }
      return;
    }
    case KEY_U64:
      snprintf(out, cap, "%llu", *(const unsigned long long *)field);
      return;
    case KEY_STRING:
      snprintf(out, cap, "%s", field);
      return;
    case KEY_INT_LIST: {
      int n = schema_list_length(k, (const int *)field);
      size_t used = 0;
      out[0] = '\0';
      for (int i = 0; i < n && used < cap; i++)
        used +=
            (size_t)snprintf(out + used, cap - used, "%s%d", i ? "," : "", ((const int *)field)[i]);
      return;
    }
  }
  TL_DIE("key type %d", (int)k->type);
}

// ---------------------------------------------------------------------------------------------
// Name lookup shared by files and --set.

const KeySpec *schema_find_key(const Schema *s, const char *section, const char *key) {
  for (size_t i = 0; i < s->n_keys; i++)
    if (strcmp(s->keys[i].section, section) == 0 && strcmp(s->keys[i].key, key) == 0)
      return &s->keys[i];
  return NULL;
}

static size_t section_names(const Schema *s, const char **names) {
  size_t n = 0;
  for (size_t i = 0; i < s->n_keys; i++)
    if (n == 0 || strcmp(names[n - 1], s->keys[i].section) != 0) names[n++] = s->keys[i].section;
  return n;
}

int schema_unknown_name(const Schema *s, const char *where, const char *section, const char *key) {
  const char *names[SCHEMA_MAX_KEYS];
  char hint[512];
  size_t n = 0;
  for (size_t i = 0; i < s->n_keys; i++)
    if (strcmp(s->keys[i].section, section) == 0) names[n++] = s->keys[i].key;
  if (n > 0) {
    schema_describe_alternatives(hint, sizeof hint, key, names, n, "'", "'", "keys");
    return tl_fail("%s: unknown key '%s' in [%s]%s", where, key, section, hint);
  }
  if (!*section) {
    for (size_t i = 0; i < s->n_keys; i++)
      if (strcmp(s->keys[i].key, key) == 0)
        return tl_fail("%s: key '%s' comes before any section (it belongs in [%s])", where, key,
                       s->keys[i].section);
    return tl_fail("%s: key '%s' comes before any section", where, key);
  }
  n = section_names(s, names);
  schema_describe_alternatives(hint, sizeof hint, section, names, n, "[", "]", "sections");
  return tl_fail("%s: unknown section [%s]%s", where, section, hint);
}

int schema_assign(const Schema *s, void *base, const char *where, const char *section,
                  const char *key, const char *value) {
  const KeySpec *k = schema_find_key(s, section, key);
  if (!k) return schema_unknown_name(s, where, section, key);
  if (set_key(k, base, where, value)) return -1;
  return s->on_set ? s->on_set(k, base, where) : 0;
}

void schema_apply_defaults(const Schema *s, void *base) {
  for (size_t i = 0; i < s->n_keys; i++)
    if (set_key(&s->keys[i], base, "default", s->keys[i].default_text))
      TL_DIE("bad default: %s", tl_last_error());
}

// ---------------------------------------------------------------------------------------------
// Files.

typedef struct {
  const Schema *schema;
  void *base;
  const char *path;
  FILE *file;
  int line;        // the line inih is handling (it reads one line, then handles it)
  char raw[64];    // its beginning, before inih strips it
  int error_line;  // the first error this parse recorded, 0 = none
  int set_at_line[SCHEMA_MAX_KEYS];  // where each key was set in this file, 0 = not yet
} IniParse;

static const char nul_fault[] = "a NUL byte in the line (a binary file, or UTF-16 text?)";
static const char cr_fault[] =
    "a carriage return inside the line (CR-only line ends?); save the file with LF or CRLF line "
    "ends";

// Why inih would not take `line` as written, or NULL: a NUL byte (inih stops the line there), a
// carriage return inside it (a file saved with CR-only line ends reads as one line), or text after
// a section header (inih ignores it: `[train] batch_size = 16` would set nothing).
static const char *line_fault(const char *line, size_t len) {
  if (memchr(line, '\0', len)) return nul_fault;
  const char *cr = memchr(line, '\r', len);
  if (cr && cr + 1 != line + len && cr[1] != '\n') return cr_fault;
  const char *start = line + strspn(line, " \t");
  if (*start == '[') {
    const char *close = memchr(start, ']', len - (size_t)(start - line));
    const char *rest = close ? close + 1 + strspn(close + 1, " \t\r\n") : "";
    if (*rest && *rest != ';' && *rest != '#')
      return "text after the section header; put each key on a line of its own";
  }
  return NULL;
}

// Skips the rest of an over-long comment line, up to its newline; what line_fault refuses there
// is refused too (a CR-only file that starts with a long comment is one comment line).
static const char *skip_comment_tail(FILE *f) {
  for (int c, prev = 0; (c = getc(f)) != EOF && c != '\n'; prev = c) {
    if (c == '\0') return nul_fault;
    if (prev == '\r') return cr_fault;
  }
  return NULL;
}

static char *read_line(char *buf, int size, void *stream) {
  IniParse *p = stream;
  if (p->error_line) return NULL;  // the first faulty line ends the parse
  size_t len = 0;
  int c = 0;
  while (len + 1 < (size_t)size && (c = getc(p->file)) != EOF)
    if ((buf[len++] = (char)c) == '\n') break;
  if (len == 0) return NULL;
  buf[len] = 0;
  p->line++;
  // inih would parse the rest of an over-long line as a line of its own. A long comment only
  // loses its tail; anything else would be cut, so it is an error.
  const int longer =
      buf[len - 1] != '\n' && (c = getc(p->file)) != EOF && ungetc(c, p->file) != EOF;
  const char *start = buf + strspn(buf, " \t");
  const int comment = *start == ';' || *start == '#';
  const char *fault = line_fault(buf, len);
  if (!fault && longer && comment) fault = skip_comment_tail(p->file);
  if (fault || (longer && !comment)) {
    if (fault)
      tl_fail("%s:%d: %s", p->path, p->line, fault);
    else
      tl_fail("%s:%d: line is longer than %d characters", p->path, p->line, size - 3);
    p->error_line = p->line;
    return NULL;
  }
  if (longer) buf[len - 1] = '\n';
  snprintf(p->raw, sizeof p->raw, "%s", buf);
  return buf;
}

// inih reads an indented line as the continuation of the previous value: a silent surprise
// in a config file, so it is reported instead.
static int is_continuation(const char *raw, const char *name) {
  if (raw[0] != ' ' && raw[0] != '\t') return 0;
  while (*raw == ' ' || *raw == '\t') raw++;
  size_t n = strlen(name);
  if (strncmp(raw, name, n) != 0) return 1;
  raw += n;
  while (*raw == ' ' || *raw == '\t') raw++;
  return *raw != '=' && *raw != ':';
}

static int handle_pair(void *user, const char *section, const char *name, const char *value) {
  IniParse *p = user;
  if (p->error_line) return 0;
  char where[PATH_MAX + 16];
  snprintf(where, sizeof where, "%s:%d", p->path, p->line);
  int rc;
  const KeySpec *k = schema_find_key(p->schema, section, name);
  if (is_continuation(p->raw, name)) {
    rc = tl_fail("%s: indented line is read as part of the value of '%s'; remove the indentation",
                 where, name);
  } else if (k && p->set_at_line[k - p->schema->keys]) {
    rc = tl_fail("%s: [%s] %s is set twice (first on line %d)", where, section, name,
                 p->set_at_line[k - p->schema->keys]);
  } else {
    rc = schema_assign(p->schema, p->base, where, section, name, value);
    if (rc == 0) p->set_at_line[k - p->schema->keys] = p->line;
  }
  if (rc) p->error_line = p->line;
  return rc == 0;
}

// `path` names the input in messages; `file` is read to its end.
static int parse_stream(const Schema *schema, void *base, const char *path, FILE *file) {
  IniParse p = {.schema = schema, .base = base, .path = path, .file = file};
  schema_ini_max_line();
  int first_error = ini_parse_stream(read_line, &p, handle_pair, &p);
  int read_failed = ferror(p.file);
  if (read_failed) return tl_fail("%s: read error", path);
  // inih keeps going after an error and returns the first one's line: ours if it was a
  // handled key, otherwise a line it could not parse.
  if (p.error_line && (first_error == 0 || first_error >= p.error_line)) return -1;
  if (first_error > 0) return tl_fail("%s:%d: malformed line", path, first_error);
  if (first_error < 0) return tl_fail("%s: inih failed (%d)", path, first_error);
  return 0;
}

// Opens a recipe or model file for reading, or NULL (error set). Regular files only, opened
// without blocking: a FIFO would wait for a writer forever and a device (/dev/zero) never ends.
// A configuration is a page of text, so a file beyond 1 MiB is refused before it is read.
static FILE *open_config_file(const char *path) {
  const long long max_bytes = 1 << 20;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    tl_fail("%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  FILE *f = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    tl_fail("%s: not a regular file", path);
  else if (st.st_size > max_bytes)
    tl_fail("%s: %lld bytes, more than the %lld a configuration file may have", path,
            (long long)st.st_size, max_bytes);
  else if (!(f = fdopen(fd, "r")))
    tl_fail("%s: cannot open: %s", path, strerror(errno));
  if (!f) close(fd);
  return f;
}

int schema_parse_file(const Schema *schema, void *base, const char *path) {
  FILE *f = open_config_file(path);
  if (!f) return -1;
  int rc = parse_stream(schema, base, path, f);
  fclose(f);
  return rc;
}

int schema_parse_text(const Schema *schema, void *base, const char *name, const char *text) {
  FILE *f = fmemopen((void *)text, strlen(text), "r");
  if (!f) return tl_fail("%s: cannot read: %s", name, strerror(errno));
  int rc = parse_stream(schema, base, name, f);
  fclose(f);
  return rc;
}

void schema_write(const Schema *s, const void *base, const char *prefix, FILE *out) {
  char value[1024];
  for (size_t i = 0; i < s->n_keys; i++) {
    const KeySpec *k = &s->keys[i];
    if (i == 0 || strcmp(k->section, s->keys[i - 1].section) != 0)
      fprintf(out, "%s%s[%s]\n", i ? "\n" : "", prefix, k->section);
    schema_format_value(k, base, value, sizeof value);
    fprintf(out, "%s%s =%s%s\n", prefix, k->key, *value ? " " : "", value);
  }
}

// A Markdown table cell: '|' would end it.
static void write_cell(FILE *out, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '|') fputc('\\', out);
    fputc(*c, out);
  }
}

// "1..65536", or "≥ 0" for keys bounded only by the int type.
static void describe_int_range(const KeySpec *k, char *out, size_t cap) {
  if (k->max == INT_MAX)
    snprintf(out, cap, "≥ %.15g", k->min);
  else
    snprintf(out, cap, "%.15g..%.15g", k->min, k->max);
}

// "int, 1..65536", "float, (0, 1]", "`a`, `b` or `c`", ...
static void describe_type(const KeySpec *k, char *out, size_t cap) {
  char range[96];
  switch (k->type) {
    case KEY_INT:
      describe_int_range(k, range, sizeof range);
      snprintf(out, cap, "int, %s", range);
      return;
    case KEY_FLOAT:
      describe_range(k, range, sizeof range);
      snprintf(out, cap, "float, %s", range);
      return;
    case KEY_BOOL:
      snprintf(out, cap, "bool (0/1)");
      return;
    case KEY_U64:
      snprintf(out, cap, "int, ≥ 0 (64-bit)");
      return;
    case KEY_INT_LIST:
      describe_int_range(k, range, sizeof range);
      snprintf(out, cap, "int list, each %s, up to %zu", range, k->size / sizeof(int));
      return;
    case KEY_STRING: {
      if (!k->choices) {
        snprintf(out, cap, "text");
        return;
      }
      size_t used = 0;
      out[0] = '\0';
      for (const char *c = k->choices; *c && used < cap;) {
        size_t n = strcspn(c, "|");
        const char *sep = c == k->choices ? "" : c[n] ? ", " : " or ";
        used += (size_t)snprintf(out + used, cap - used, "%s`%.*s`", sep, (int)n, c);
        c += n + (c[n] == '|');
      }
      return;
    }
  }
  TL_DIE("key type %d", (int)k->type);
}

// One Markdown table per section of `s`, in table order, with a blank line between them.
void schema_write_reference(const Schema *s, SchemaSectionNote section_note, FILE *out) {
  char type[256];
  for (size_t i = 0; i < s->n_keys; i++) {
    const KeySpec *k = &s->keys[i];
    if (i == 0 || strcmp(k->section, s->keys[i - 1].section) != 0) {
      fprintf(out, "### `[%s]`", k->section);
      const char *note = section_note ? section_note(s, k->section) : NULL;
      if (note) fprintf(out, " (%s)", note);
      fprintf(out, "\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n");
    }
    describe_type(k, type, sizeof type);
    fprintf(out, "| `%s` | ", k->key);
    write_cell(out, type);
    fprintf(out, " | ");
    if (k->default_text[0]) {
      fputc('`', out);
      write_cell(out, k->default_text);
      fputc('`', out);
    } else {
      fprintf(out, "empty");
    }
    fprintf(out, " | ");
    write_cell(out, k->help);
    fprintf(out, " |\n");
    if (i + 1 < s->n_keys && strcmp(k->section, s->keys[i + 1].section) != 0) fputc('\n', out);
  }
}
