#include "ledger/record.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
#include "ledger/bytes.h"

// One table drives both writers, the reader and the plan, so they can never disagree on names.
typedef enum { F_LONG, F_INT, F_SIZE, F_DOUBLE, F_STRING } FieldType;
typedef struct {
  LedgerFieldInfo info;
  FieldType type;
  size_t offset;
  // A member of view group `view_group` (else -1): ledger.jsonl writes the groups as one list
  // of objects, at the field named "view_groups", with these members.
  int view_group;
  const char *member;
} Field;

// Counted quantities: planned exactly.
#define FIELD(name, type, group, unit) \
  { {#name, group, unit, 0}, type, offsetof(LedgerRecord, name), -1, NULL }
#define FIELD_AT(label, member, type, group, unit) \
  { {label, group, unit, 0}, type, offsetof(LedgerRecord, member), -1, NULL }
// Known only once the step has run.
#define MEASURED(name, type, group, unit) \
  { {#name, group, unit, 1}, type, offsetof(LedgerRecord, name), -1, NULL }
// One member of view group k.
#define GROUP_FIELD(k, m, type, group, unit) \
  { {"view_group" #k "_" #m, group, unit, 0}, type, offsetof(LedgerRecord, view_group[k].m), k, #m }
#define VIEW_GROUP(k)                                                    \
  GROUP_FIELD(k, size, F_INT, LEDGER_ENCODED, UNIT_COUNT),               \
      GROUP_FIELD(k, count, F_INT, LEDGER_ENCODED, UNIT_COUNT),          \
      GROUP_FIELD(k, views_grad, F_LONG, LEDGER_ENCODED, UNIT_COUNT),    \
      GROUP_FIELD(k, views_nograd, F_LONG, LEDGER_ENCODED, UNIT_COUNT),  \
      GROUP_FIELD(k, flops_forward, F_DOUBLE, LEDGER_COST, UNIT_FLOPS),  \
      GROUP_FIELD(k, flops_backward, F_DOUBLE, LEDGER_COST, UNIT_FLOPS), \
      GROUP_FIELD(k, activation_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES)

static const Field fields[] = {
    FIELD(step, F_LONG, LEDGER_IDENTITY, UNIT_COUNT),
    FIELD(epoch, F_INT, LEDGER_IDENTITY, UNIT_COUNT),
    FIELD(objective, F_STRING, LEDGER_IDENTITY, UNIT_TEXT),
    FIELD(replicas, F_INT, LEDGER_IDENTITY, UNIT_COUNT),
    FIELD(lr, F_DOUBLE, LEDGER_IDENTITY, UNIT_RATIO),
    MEASURED(loss, F_DOUBLE, LEDGER_IDENTITY, UNIT_RATIO),
    FIELD(images_source, F_LONG, LEDGER_ENCODED, UNIT_COUNT),
    FIELD(views_grad, F_LONG, LEDGER_ENCODED, UNIT_COUNT),
    FIELD(views_nograd, F_LONG, LEDGER_ENCODED, UNIT_COUNT),
    FIELD(negatives_per_query, F_LONG, LEDGER_ENCODED, UNIT_COUNT),
    FIELD(positives_per_query, F_LONG, LEDGER_ENCODED, UNIT_COUNT),
    FIELD(view_groups, F_INT, LEDGER_ENCODED, UNIT_COUNT),
    VIEW_GROUP(0),
    VIEW_GROUP(1),
    VIEW_GROUP(2),
    VIEW_GROUP(3),
    FIELD(activation_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD_AT("activation_encoder_bytes", activation_bytes_by[COMP_ENCODER], F_SIZE, LEDGER_HELD,
             UNIT_BYTES),
    FIELD_AT("activation_head_bytes", activation_bytes_by[COMP_HEAD], F_SIZE, LEDGER_HELD,
             UNIT_BYTES),
    FIELD_AT("activation_decoder_bytes", activation_bytes_by[COMP_DECODER], F_SIZE, LEDGER_HELD,
             UNIT_BYTES),
    FIELD_AT("activation_loss_bytes", activation_bytes_by[COMP_LOSS], F_SIZE, LEDGER_HELD,
             UNIT_BYTES),
    FIELD(activation_grad_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(param_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(grad_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(optimizer_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(momentum_encoder_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(workspace_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(data_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(eval_bytes, F_SIZE, LEDGER_HELD, UNIT_BYTES),
    FIELD(queue_bytes, F_SIZE, LEDGER_CACHED, UNIT_BYTES),
    FIELD(encodings_next_new, F_LONG, LEDGER_NEXT, UNIT_COUNT),
    FIELD(encodings_next_reused, F_LONG, LEDGER_NEXT, UNIT_COUNT),
    FIELD(flops_forward, F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD(flops_backward, F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD_AT("flops_forward_encoder", flops_forward_by[COMP_ENCODER], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD_AT("flops_forward_head", flops_forward_by[COMP_HEAD], F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD_AT("flops_forward_decoder", flops_forward_by[COMP_DECODER], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD_AT("flops_forward_loss", flops_forward_by[COMP_LOSS], F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD_AT("flops_backward_encoder", flops_backward_by[COMP_ENCODER], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD_AT("flops_backward_head", flops_backward_by[COMP_HEAD], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD_AT("flops_backward_decoder", flops_backward_by[COMP_DECODER], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD_AT("flops_backward_loss", flops_backward_by[COMP_LOSS], F_DOUBLE, LEDGER_COST,
             UNIT_FLOPS),
    FIELD(flops_winograd, F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD(comm_bytes, F_DOUBLE, LEDGER_COST, UNIT_BYTES),
    FIELD(comm_allreduce_bytes, F_DOUBLE, LEDGER_COST, UNIT_BYTES),
    FIELD(comm_allgather_bytes, F_DOUBLE, LEDGER_COST, UNIT_BYTES),
    FIELD(comm_allreduce_calls, F_LONG, LEDGER_COST, UNIT_COUNT),
    FIELD(comm_allgather_calls, F_LONG, LEDGER_COST, UNIT_COUNT),
    FIELD(flops_total, F_DOUBLE, LEDGER_COST, UNIT_FLOPS),
    FIELD(shard_samples, F_INT, LEDGER_COST, UNIT_COUNT),
    FIELD(shard_weight, F_DOUBLE, LEDGER_COST, UNIT_RATIO),
    MEASURED(data_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(forward_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(backward_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(comm_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(optimizer_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(step_ms, F_DOUBLE, LEDGER_TIME, UNIT_MS),
    MEASURED(images_per_s, F_DOUBLE, LEDGER_TIME, UNIT_RATE),
    MEASURED(train_seconds, F_DOUBLE, LEDGER_TIME, UNIT_SECONDS),
    MEASURED(peak_rss_bytes, F_SIZE, LEDGER_TIME, UNIT_BYTES),
};
enum { N_FIELDS = sizeof fields / sizeof fields[0] };
_Static_assert(LEDGER_MAX_VIEW_GROUPS == 4, "the field table lists view groups 0 to 3");

static int absent_group(const LedgerRecord *r, const Field *fd) {
  return fd->view_group >= 0 && fd->view_group >= r->view_groups;
}

void ledger_view_groups_finish(LedgerRecord *r, int n_groups, const int *sizes, const int *counts,
                               size_t encoder_act_bytes) {
  TL_ASSERT(n_groups >= 1 && n_groups <= LEDGER_MAX_VIEW_GROUPS);
  if (r->view_groups == 0) {  // one group: the step's views
    r->view_group[0].views_grad = r->views_grad;
    r->view_group[0].views_nograd = r->views_nograd;
  }
  r->view_groups = n_groups;
  LedgerViewGroup *g0 = &r->view_group[0];
  g0->flops_forward = r->flops_forward_by[COMP_ENCODER];
  g0->flops_backward = r->flops_backward_by[COMP_ENCODER];
  g0->activation_bytes = encoder_act_bytes;
  for (int g = 0; g < n_groups; g++) {
    r->view_group[g].size = sizes[g];
    r->view_group[g].count = counts[g];
    if (g == 0) continue;
    g0->flops_forward -= r->view_group[g].flops_forward;
    g0->flops_backward -= r->view_group[g].flops_backward;
    g0->activation_bytes -= r->view_group[g].activation_bytes;
  }
}

void ledger_record_comm(LedgerRecord *r, const CommStats *cs) {
  r->comm_allreduce_bytes = cs->bytes[COLL_ALLREDUCE];
  r->comm_allgather_bytes = cs->bytes[COLL_ALLGATHER];
  r->comm_bytes = cs->bytes[COLL_ALLREDUCE] + cs->bytes[COLL_ALLGATHER] + cs->bytes[COLL_BROADCAST];
  r->comm_allreduce_calls = cs->calls[COLL_ALLREDUCE];
  r->comm_allgather_calls = cs->calls[COLL_ALLGATHER];
}

static void write_value(FILE *f, const LedgerRecord *r, const Field *fd, int json) {
  const char *p = (const char *)r + fd->offset;
  switch (fd->type) {
    case F_LONG:
      fprintf(f, "%ld", *(const long *)p);
      break;
    case F_INT:
      fprintf(f, "%d", *(const int *)p);
      break;
    case F_SIZE:
      fprintf(f, "%zu", *(const size_t *)p);
      break;
    case F_DOUBLE: {
      double v = *(const double *)p;
      if (isfinite(v))
        fprintf(f, "%.9g", v);
      else
        fputs(json ? "null" : "", f);  // JSON has no NaN; an empty CSV cell reads as missing
      break;
    }
    case F_STRING: {
      const char *s = *(const char *const *)p;
      fprintf(f, json ? "\"%s\"" : "%s", s ? s : "");
      break;
    }
  }
}

// An own field's value: a whole number as one (counts and bytes are whole), else like any double.
static void write_own(FILE *f, double v, int json) {
  if (!isfinite(v))
    fputs(json ? "null" : "", f);
  else if (v == floor(v) && fabs(v) < 9007199254740992.0)
    fprintf(f, "%.0f", v);
  else
    fprintf(f, "%.9g", v);
}

static int own_count(const LedgerRecord *r) { return r->own_fields ? r->own_fields->n : 0; }

// "view_groups":[{"size":..,...},...]: the members of each group the record has.
static void write_view_groups(FILE *f, const LedgerRecord *r) {
  fputc('[', f);
  for (int g = 0; g < r->view_groups && g < LEDGER_MAX_VIEW_GROUPS; g++) {
    fputs(g ? ",{" : "{", f);
    for (int i = 0, first = 1; i < N_FIELDS; i++)
      if (fields[i].view_group == g) {
        fprintf(f, "%s\"%s\":", first ? "" : ",", fields[i].member);
        write_value(f, r, &fields[i], 1);
        first = 0;
      }
    fputc('}', f);
  }
  fputc(']', f);
}

void ledger_write_json_members(FILE *f, const LedgerRecord *r, int planned) {
  for (int i = 0, first = 1; i < N_FIELDS; i++) {
    // The view groups go last, as one list: a reader that looks for a top-level name by its
    // first occurrence still finds the record's own.
    if (fields[i].view_group >= 0 || fields[i].offset == offsetof(LedgerRecord, view_groups))
      continue;
    fprintf(f, "%s\"%s\":", first ? "" : ",", fields[i].info.name);
    first = 0;
    if (planned && fields[i].info.measured_only)
      fputs("null", f);
    else
      write_value(f, r, &fields[i], 1);
  }
  for (int i = 0; i < own_count(r); i++) {
    const LedgerFieldInfo *fi = &r->own_fields->field[i];
    fprintf(f, ",\"%s\":", fi->name);
    write_own(f, planned && fi->measured_only ? NAN : r->own[i], 1);
  }
  fputs(",\"view_groups\":", f);
  write_view_groups(f, r);
}

void ledger_write_json(FILE *f, const LedgerRecord *r) {
  fputc('{', f);
  ledger_write_json_members(f, r, 0);
  fputs("}\n", f);
}

void ledger_write_csv_header(FILE *f, const LedgerOwnFields *own) {
  for (int i = 0; i < N_FIELDS; i++) fprintf(f, "%s%s", i ? "," : "", fields[i].info.name);
  for (int i = 0; own && i < own->n; i++) fprintf(f, ",%s", own->field[i].name);
  fputc('\n', f);
}

void ledger_write_csv(FILE *f, const LedgerRecord *r) {
  for (int i = 0; i < N_FIELDS; i++) {
    if (i) fputc(',', f);
    if (!absent_group(r, &fields[i])) write_value(f, r, &fields[i], 0);  // else an empty cell
  }
  for (int i = 0; i < own_count(r); i++) {
    fputc(',', f);
    write_own(f, r->own[i], 0);
  }
  fputc('\n', f);
}

void ledger_format_value(LedgerUnit unit, double v, char *buf, size_t n) {
  if (!isfinite(v) || unit == UNIT_TEXT) {
    snprintf(buf, n, "-");
    return;
  }
  switch (unit) {
    case UNIT_BYTES:
      format_quantity(QTY_BYTES, v, buf, n);
      break;
    case UNIT_FLOPS:
      format_quantity(QTY_FLOPS, v, buf, n);
      break;
    case UNIT_MS:
      format_quantity(QTY_SECONDS, v / 1e3, buf, n);
      break;
    case UNIT_SECONDS:
      format_quantity(QTY_SECONDS, v, buf, n);
      break;
    case UNIT_COUNT:
    case UNIT_STEPS:
      snprintf(buf, n, "%.0f", v);
      break;
    case UNIT_RATE:
      snprintf(buf, n, "%.*f", fabs(v) >= 100 ? 0 : fabs(v) >= 10 ? 1 : 2, v);
      break;
    case UNIT_FRACTION:
      snprintf(buf, n, "%.1f%%", 100 * v);
      break;
    case UNIT_FLAG:
      snprintf(buf, n, "%s", v >= 0.5 ? "yes" : "no");
      break;
    default:
      snprintf(buf, n, "%.4g", v);
      break;
  }
}

int ledger_field_count(void) { return N_FIELDS; }
const LedgerFieldInfo *ledger_field_info(int i) { return &fields[i].info; }

int ledger_field_find(const char *name) {
  for (int i = 0; i < N_FIELDS; i++)
    if (strcmp(fields[i].info.name, name) == 0) return i;
  return -1;
}

double ledger_field_value(const LedgerRecord *r, int i) {
  if (absent_group(r, &fields[i])) return 0;  // a group the step did not have
  const char *p = (const char *)r + fields[i].offset;
  switch (fields[i].type) {
    case F_LONG:
      return (double)*(const long *)p;
    case F_INT:
      return *(const int *)p;
    case F_SIZE:
      return (double)*(const size_t *)p;
    case F_DOUBLE:
      return *(const double *)p;
    case F_STRING:
      break;
  }
  return NAN;
}

int ledger_own_find(const LedgerOwnFields *own, const char *name) {
  for (int k = 0; own && k < own->n; k++)
    if (strcmp(own->field[k].name, name) == 0) return k;
  return -1;
}

double ledger_value(const LedgerRecord *r, const char *name) {
  const int i = ledger_field_find(name);
  if (i >= 0) return ledger_field_value(r, i);
  const int k = ledger_own_find(r->own_fields, name);
  return k >= 0 ? r->own[k] : NAN;
}

const char *ledger_group_title(LedgerGroup g) {
  static const char *const titles[LEDGER_NGROUPS] = {"Step",
                                                     "What is encoded this step",
                                                     "What is held (memory)",
                                                     "What is cached from earlier steps",
                                                     "What the next step must redo",
                                                     "Cost",
                                                     "Time (measured only)"};
  return titles[g];
}

// v clamped to [lo, hi] (a hostile ledger's 1e308 or 2^63 must not be cast out of range, which
// is undefined behaviour); NaN is 0.
static double clamp(double v, double lo, double hi) {
  return isnan(v) ? 0 : v < lo ? lo : v > hi ? hi : v;
}

static void set_value(LedgerRecord *r, const Field *fd, double v) {
  char *p = (char *)r + fd->offset;
  // The largest doubles below LONG_MAX + 1 and SIZE_MAX + 1 (2^63 and 2^64).
  const double long_hi = 9223372036854774784.0, size_hi = 18446744073709549568.0;
  switch (fd->type) {
    case F_LONG:
      *(long *)p = (long)clamp(v, -long_hi, long_hi);
      break;
    case F_INT:
      *(int *)p = (int)clamp(v, INT_MIN, INT_MAX);
      break;
    case F_SIZE:
      *(size_t *)p = (size_t)clamp(v, 0, size_hi);
      break;
    case F_DOUBLE:
      *(double *)p = v;
      break;
    case F_STRING:
      break;
  }
}

static const char *skip_space(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

// A JSON string's end (the closing quote), escapes skipped; NULL when unterminated.
static const char *string_end(const char *p) {
  for (; *p && *p != '"'; p++)
    if (*p == '\\' && p[1]) p++;
  return *p ? p : NULL;
}

// The table's field called name[0..len) among the members of view group `group` (-1: the
// record's own fields), or NULL.
static const Field *find_field(const char *name, size_t len, int group) {
  for (int i = 0; i < N_FIELDS; i++) {
    const char *n = group < 0 ? fields[i].info.name : fields[i].member;
    if (fields[i].view_group == (group < 0 ? -1 : group) && n && strlen(n) == len &&
        strncmp(n, name, len) == 0)
      return &fields[i];
  }
  return NULL;
}

// The own field called name[0..len) of the record's objective: its index, or -1.
static int find_own(const LedgerRecord *r, const char *name, size_t len) {
  for (int k = 0; k < own_count(r); k++) {
    const char *n = r->own_fields->field[k].name;
    if (strlen(n) == len && strncmp(n, name, len) == 0) return k;
  }
  return -1;
}

// What a reader needs besides the line.
typedef struct {
  LedgerOwnLookup lookup;
  int set;  // fields set so far
} ReadState;

// One flat JSON object at p (its members numbers, strings or null) into r: the record's fields,
// or view group `group`'s members. Returns the position after it, or NULL when malformed.
static const char *read_object(const char *p, LedgerRecord *r, int group, ReadState *st);

// "view_groups":[{...},...] at p (after the colon): each object is one group's members.
static const char *read_view_groups(const char *p, LedgerRecord *r, ReadState *st) {
  if (*p++ != '[') return NULL;
  int n = 0;
  p = skip_space(p);
  if (*p == ']') return p + 1;
  for (;;) {
    // A group past the table's is read for its syntax and dropped.
    p = read_object(skip_space(p), r, n < LEDGER_MAX_VIEW_GROUPS ? n : INT_MAX, st);
    if (!p) return NULL;
    n++;
    p = skip_space(p);
    if (*p == ']') break;
    if (*p++ != ',') return NULL;
  }
  r->view_groups = n < LEDGER_MAX_VIEW_GROUPS ? n : LEDGER_MAX_VIEW_GROUPS;
  st->set++;
  return p + 1;
}

static const char *read_object(const char *p, LedgerRecord *r, int group, ReadState *st) {
  if (*p++ != '{') return NULL;
  for (;;) {
    p = skip_space(p);
    if (*p == '}') return p + 1;
    if (*p++ != '"') return NULL;
    const char *name = p, *name_end = string_end(p);
    if (!name_end) return NULL;
    p = skip_space(name_end + 1);
    if (*p++ != ':') return NULL;
    p = skip_space(p);
    const size_t len = (size_t)(name_end - name);
    const Field *fd = group == INT_MAX ? NULL : find_field(name, len, group);
    const int own = fd || group >= 0 ? -1 : find_own(r, name, len);
    if (*p == '[' && group < 0 && len == 11 && strncmp(name, "view_groups", 11) == 0) {
      if (!(p = read_view_groups(p, r, st))) return NULL;
    } else if (*p == '"') {
      const char *end = string_end(p + 1);
      if (!end) return NULL;
      // The objective's name says which own fields the record has.
      if (group < 0 && st->lookup && len == 9 && strncmp(name, "objective", 9) == 0) {
        char objective[64];
        const size_t n = (size_t)(end - p - 1);
        if (n < sizeof objective) {
          memcpy(objective, p + 1, n);
          objective[n] = 0;
          r->own_fields = st->lookup(objective);
        }
      }
      p = end + 1;
    } else if (strncmp(p, "null", 4) == 0) {
      if (fd) set_value(r, fd, NAN), st->set++;
      if (own >= 0) r->own[own] = NAN, st->set++;
      p += 4;
    } else {
      char *end;
      double v = strtod(p, &end);
      if (end == p) return NULL;
      if (fd) set_value(r, fd, v), st->set++;
      if (own >= 0) r->own[own] = v, st->set++;
      p = end;
    }
    p = skip_space(p);
    if (*p == ',')
      p++;
    else if (*p != '}')
      return NULL;
  }
}

int ledger_read_json(const char *line, LedgerRecord *r, LedgerOwnLookup lookup) {
  ReadState st = {lookup, 0};
  return read_object(skip_space(line), r, -1, &st) ? st.set : -1;
}

// The integer after "key": in a JSON line, or -1.
static long json_long_field(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *p = strstr(line, pattern);
  if (!p) return -1;
  char *end;
  long v = strtol(p + strlen(pattern), &end, 10);
  return end == p + strlen(pattern) ? -1 : v;
}

// Keeps the whole lines (ending in a newline) of `path` that `keep` accepts; the first line is
// kept as is when `header` is set. *crc (may be NULL) receives the CRC-32 of what is kept; with
// `want_crc` >= 0, a file whose kept bytes have another is refused and left as it was.
static int rewrite_lines(const char *path, int header, int (*keep)(const char *line, long limit),
                         long limit, long long want_crc, unsigned long *crc) {
  unsigned long kept = crc32(0L, Z_NULL, 0);
  if (crc) *crc = kept;
  FILE *in = regular_fopen(path, "r");
  if (!in) return errno == ENOENT ? 0 : -1;
  AtomicFile out;
  if (atomic_open(&out, path) != 0) {
    fclose(in);
    return -1;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  for (int i = 0; (n = getline(&line, &cap, in)) > 0; i++)
    if (line[n - 1] == '\n' && ((header && i == 0) || keep(line, limit))) {
      fputs(line, out.f);
      kept = crc32(kept, (const Bytef *)line, (uInt)n);
    }
  free(line);
  int read_failed = ferror(in);
  fclose(in);
  if (read_failed || (want_crc >= 0 && kept != (unsigned long)want_crc)) {
    atomic_abort(&out);
    return read_failed ? tl_fail("%s: read error", path)
                       : tl_fail(
                             "%s: is not the ledger of this checkpoint's run (its rows up to "
                             "the checkpoint differ from the ones the run wrote); a checkpoint "
                             "from another run? Move the ledger files away to resume without "
                             "them",
                             path);
  }
  if (crc) *crc = kept;
  return atomic_commit(&out);
}

static int keep_record(const char *line, long limit) {
  long step = json_long_field(line, "step");
  return step >= 0 && step < limit;
}

static int keep_csv_row(const char *line, long limit) {
  char *end;
  long step = strtol(line, &end, 10);
  return end != line && *end == ',' && step >= 0 && step < limit;
}

static int keep_eval(const char *line, long limit) {
  long step = json_long_field(line, "step");
  return step >= 0 && step <= limit && !strstr(line, "\"what\":\"raw_pixels\"");
}

// The same, except the monitor's record of step `limit`, which it takes again (a record of
// `tally eval`, which names itself as its source, stays).
static int keep_eval_but_last(const char *line, long limit) {
  return keep_eval(line, limit) &&
         (json_long_field(line, "step") < limit || strstr(line, "\"source\":") != NULL);
}

int ledger_check_own(const char *path, long step, unsigned long crc) {
  FILE *in = regular_fopen(path, "r");
  if (!in) return errno == ENOENT ? 0 : -1;
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int found = 0;
  unsigned long seen = 0;
  while ((n = getline(&line, &cap, in)) > 0)
    if (line[n - 1] == '\n' && json_long_field(line, "step") == step) {
      found = 1;
      seen = crc32(0L, (const Bytef *)line, (uInt)n);
    }
  free(line);
  int read_failed = ferror(in);
  fclose(in);
  if (read_failed) return tl_fail("%s: read error", path);
  if (found && seen == crc) return 0;
  return tl_fail(
      "%s: is not the ledger of this checkpoint's run (its record of step %ld %s); a "
      "checkpoint from another run? Move the ledger files away to resume without them",
      path, step, found ? "differs from the one the checkpoint saw" : "is missing");
}

// The CRC-32 of the first `n` bytes of `path` (n < 0: all of it) into *crc, and how many there
// were into *got: 0, or -1 with the error set (a missing file has none).
static int prefix_crc(const char *path, long long n, unsigned long *crc, long long *got) {
  *crc = crc32(0L, Z_NULL, 0);
  *got = 0;
  FILE *in = regular_fopen(path, "r");
  if (!in) return errno == ENOENT ? 0 : -1;
  unsigned char buf[65536];
  size_t r;
  while ((n < 0 || *got < n) &&
         (r = fread(buf, 1,
                    n < 0 || n - *got > (long long)sizeof buf ? sizeof buf : (size_t)(n - *got),
                    in)) > 0) {
    *crc = crc32(*crc, buf, (uInt)r);
    *got += (long long)r;
  }
  int failed = ferror(in);
  fclose(in);
  return failed ? tl_fail("%s: read error", path) : 0;
}

// eval.jsonl must begin with what the run wrote before its checkpoint (a missing one is fine).
static int check_own_evals(const char *path, long long bytes, unsigned long crc) {
  unsigned long seen;
  long long got;
  if (bytes < 0 || access(path, F_OK) != 0) return 0;
  if (prefix_crc(path, bytes, &seen, &got) != 0) return -1;
  if (got == bytes && seen == crc) return 0;
  return tl_fail(
      "%s: is not the record of this checkpoint's run (its first %lld bytes differ from the ones "
      "the run wrote); a checkpoint from another run? Move it away to resume without it",
      path, bytes);
}

int ledger_truncate_for_resume(const char *run_dir, const LedgerResume *how, LedgerKept *kept) {
  char path[4200];
  snprintf(path, sizeof path, "%s/ledger.jsonl", run_dir);
  if (how->last_step >= 0 && ledger_check_own(path, how->last_step, how->last_crc) != 0) return -1;
  snprintf(path, sizeof path, "%s/eval.jsonl", run_dir);
  if (check_own_evals(path, how->eval_bytes, how->eval_crc) != 0) return -1;
  // The CSV first: refused, it leaves every file as it was.
  snprintf(path, sizeof path, "%s/ledger.csv", run_dir);
  if (rewrite_lines(path, 1, keep_csv_row, how->steps_done, how->csv_crc, &kept->csv_crc) != 0)
    return -1;
  snprintf(path, sizeof path, "%s/ledger.jsonl", run_dir);
  if (rewrite_lines(path, 0, keep_record, how->steps_done, -1, NULL) != 0) return -1;
  snprintf(path, sizeof path, "%s/eval.jsonl", run_dir);
  if (rewrite_lines(path, 0, how->evaluate_again ? keep_eval_but_last : keep_eval, how->steps_done,
                    -1, NULL) != 0)
    return -1;
  return prefix_crc(path, -1, &kept->eval_crc, &kept->eval_bytes);
}
