// Typed configuration: defaults, shipped recipes, error messages (file, line, suggestion),
// --set overrides, list parsing, the write/load round trip and cross-field validation.
// Run from the repository root (ctest does): the shipped recipes name models/*.ini relatively.
// cmocka needs these first, in this order.
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "core/error.h"
#include "objectives/objective.h"

// A key's value as config_write would write it.
static const char *value_of(const Config *c, const char *name) {
  static char value[256];
  if (config_get(c, name, value, sizeof value) != 0) fail_msg("%s", tl_last_error());
  return value;
}

// A file under $TMPDIR holding `text`; removed by the caller.
static void write_temp(char *path, size_t cap, const char *text) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, cap, "%s/tally-config-XXXXXX.ini", dir && *dir ? dir : "/tmp");
  int fd = mkstemps(path, 4);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle)) fail_msg("missing '%s' in '%s'", needle, haystack);
}

// Loads `text` as a recipe into a default Config, expects failure, and checks that the error
// is exactly "TMPFILE:<rest>" with <rest> formatted from the arguments.
static void expect_load_error(const char *text, const char *rest_fmt, ...) {
  char path[256], expected[1024], rest[768];
  write_temp(path, sizeof path, text);
  Config cfg, before;
  config_defaults(&cfg);
  memcpy(&before, &cfg, sizeof cfg);
  int rc = config_load(&cfg, path);
  va_list ap;
  va_start(ap, rest_fmt);
  vsnprintf(rest, sizeof rest, rest_fmt, ap);
  va_end(ap);
  snprintf(expected, sizeof expected, "%s%s", path, rest);
  unlink(path);
  assert_int_equal(rc, -1);
  assert_string_equal(tl_last_error(), expected);
  // A failed load leaves the configuration as it was.
  assert_memory_equal(&cfg, &before, sizeof cfg);
}

// Loads `text` as a recipe, expects failure and an error containing "TMPFILE:LINE:" and `part`.
static void expect_load_error_part(const char *text, int line, const char *part) {
  char path[256], location[300];
  write_temp(path, sizeof path, text);
  Config cfg;
  config_defaults(&cfg);
  int rc = config_load(&cfg, path);
  unlink(path);
  assert_int_equal(rc, -1);
  snprintf(location, sizeof location, "%s:%d:", path, line);
  assert_contains(tl_last_error(), location);
  assert_contains(tl_last_error(), part);
}

// A recipe whose second line holds a NUL byte (inih would read "lr = 0.3" and drop the rest):
// refused, naming the line.
static void expect_nul_refused(void) {
  static const char text[] = "[optim]\nlr = 0.3\0 6\n";
  char path[256], location[300];
  write_temp(path, sizeof path, "");
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
  fclose(f);
  Config cfg;
  config_defaults(&cfg);
  int rc = config_load(&cfg, path);
  unlink(path);
  assert_int_equal(rc, -1);
  snprintf(location, sizeof location, "%s:2: a NUL byte", path);
  assert_contains(tl_last_error(), location);
}

static void load_recipe(Config *c, const char *path) {
  config_defaults(c);
  if (config_load(c, path)) fail_msg("%s", tl_last_error());
  if (config_validate(c)) fail_msg("%s", tl_last_error());
  assert_string_equal(c->source_path, path);
}

// One "key = value" line of an INI text, as a reader of the file sees it.
typedef struct {
  char section[64], key[64], value[256];
  int line;
} IniEntry;

// Reads the next key line of `text` at *at (section headers update e->section; comments and
// blank lines are passed over). Returns 0 at the end.
static int next_entry(const char **at, IniEntry *e) {
  while (**at) {
    const char *line = *at, *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    *at = line + len + (end != NULL);
    e->line++;
    while (len && (*line == ' ' || *line == '\t')) line++, len--;
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\r')) len--;
    if (!len || *line == ';' || *line == '#') continue;
    if (*line == '[') {
      snprintf(e->section, sizeof e->section, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
      continue;
    }
    size_t name_len = strcspn(line, "=:");
    if (name_len >= len) fail_msg("line %d is not 'key = value': %.*s", e->line, (int)len, line);
    const char *value = line + name_len + 1, *value_end = line + len;
    while (name_len && line[name_len - 1] == ' ') name_len--;
    while (*value == ' ') value++;
    // As inih reads it: ';' after whitespace starts a comment.
    for (const char *c = value; c < value_end; c++)
      if (*c == ';' && c > value && (c[-1] == ' ' || c[-1] == '\t')) value_end = c;
    while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) value_end--;
    snprintf(e->key, sizeof e->key, "%.*s", (int)name_len, line);
    snprintf(e->value, sizeof e->value, "%.*s", (int)(value_end - value), value);
    return 1;
  }
  return 0;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("%s: %s", path, strerror(errno));
  static char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

// What config_write (or config_write_model) writes for c.
static char *written_by(const Config *c, void (*write)(const Config *, FILE *)) {
  static char text[65536];
  FILE *f = fmemopen(text, sizeof text, "w");
  assert_non_null(f);
  write(c, f);
  assert_true(ftell(f) < (long)sizeof text - 1);
  fclose(f);
  return text;
}

// A value as a file states it and as Tally writes it back name the same thing: the same number
// (to float precision: keys hold floats or ints), or the same text once spaces are dropped
// (lists may be written "32, 64").
static int same_value(const char *stated, const char *written) {
  // A path under the home folder is written out where it was found.
  const char *home = getenv("HOME");
  if (!strncmp(stated, "~/", 2) && home && !strncmp(written, home, strlen(home)) &&
      !strcmp(written + strlen(home), stated + 1))
    return 1;
  char *end_a, *end_b;
  double a = strtod(stated, &end_a), b = strtod(written, &end_b);
  if (end_a != stated && !*end_a && end_b != written && !*end_b) return (float)a == (float)b;
  for (;; stated++, written++) {
    while (*stated == ' ') stated++;
    while (*written == ' ') written++;
    if (*stated != *written) return 0;
    if (!*stated) return 1;
  }
}

// Every key of the defaults, as config_write lists them (the model spec only as comments).
static int default_keys(IniEntry *keys, int cap) {
  Config c;
  config_defaults(&c);
  const char *at = written_by(&c, config_write);
  IniEntry e = {0};
  int n = 0;
  while (next_entry(&at, &e)) {
    assert_true(n < cap);
    keys[n++] = e;
  }
  return n;
}

// The defaults are a configuration that passes validation, and its model spec is what
// models/resnet-small.ini (the model it names) holds, without reading that file.
static void defaults_validate_and_name_their_model(void **state) {
  (void)state;
  Config c, from_file;
  config_defaults(&c);
  assert_string_equal(c.source_path, "");
  if (config_validate(&c)) fail_msg("%s", tl_last_error());
  config_defaults(&from_file);
  if (config_load_model(&from_file, c.model.file)) fail_msg("%s", tl_last_error());
  assert_memory_equal(&c.model.spec, &from_file.model.spec, sizeof c.model.spec);
}

// Each key's default, given back to it through --set, is accepted and changes nothing: the
// default texts obey the keys' own types, ranges and choices.
static void every_default_is_a_valid_value(void **state) {
  (void)state;
  static IniEntry keys[CONFIG_MAX_KEYS];
  int n = default_keys(keys, CONFIG_MAX_KEYS);
  assert_true(n > 50);
  Config defaults;
  config_defaults(&defaults);
  for (int i = 0; i < n; i++) {
    const IniEntry key = keys[i];
    Config c;
    config_defaults(&c);
    char assignment[sizeof key.section + sizeof key.key + sizeof key.value];
    snprintf(assignment, sizeof assignment, "%s.%s=%s", key.section, key.key, key.value);
    if (config_set(&c, assignment)) fail_msg("default refused: %s", tl_last_error());
    memcpy(c.set_by_option, defaults.set_by_option, sizeof c.set_by_option);
    if (memcmp(&c, &defaults, sizeof c) != 0) fail_msg("--set %s changed the defaults", assignment);
  }
}

// No numeric key takes minus a billion (counts, sizes, rates and probabilities are all >= 0):
// each refuses it in a message naming its section and key, and keeps its value.
static void numeric_keys_refuse_out_of_range_values(void **state) {
  (void)state;
  static IniEntry keys[CONFIG_MAX_KEYS];
  int n = default_keys(keys, CONFIG_MAX_KEYS), numeric = 0;
  for (int i = 0; i < n; i++) {
    char *end;
    strtod(keys[i].value, &end);
    if (end == keys[i].value || *end) continue;
    numeric++;
    Config c, before;
    config_defaults(&c);
    memcpy(&before, &c, sizeof c);
    char assignment[200], named[200];
    snprintf(assignment, sizeof assignment, "%s.%s=-1000000000", keys[i].section, keys[i].key);
    snprintf(named, sizeof named, ": [%s] %s = ", keys[i].section, keys[i].key);
    if (config_set(&c, assignment) == 0) fail_msg("--set %s was accepted", assignment);
    assert_contains(tl_last_error(), named);
    assert_memory_equal(&c, &before, sizeof c);
  }
  assert_true(numeric > 40);
}

// Every key line of the INI file at `path` holds, in `written` (what Tally writes for the
// configuration it loaded), the value the file states.
static void expect_file_values(const char *path, const char *written) {
  const char *at = read_text(path);
  IniEntry stated = {0};
  int checked = 0;
  while (next_entry(&at, &stated)) {
    const char *w = written;
    IniEntry e = {0};
    int found = 0;
    while (!found && next_entry(&w, &e))
      found = !strcmp(e.section, stated.section) && !strcmp(e.key, stated.key);
    if (!found)
      fail_msg("%s:%d: [%s] %s is not written back", path, stated.line, stated.section, stated.key);
    if (!same_value(stated.value, e.value))
      fail_msg("%s:%d: [%s] %s = %s, loaded as %s", path, stated.line, stated.section, stated.key,
               stated.value, e.value);
    checked++;
  }
  assert_true(checked > 0);
}

// Every recipe under configs/ loads and validates, every key it sets holds the value it states,
// and the model it names is the one loaded.
static void shipped_recipes_load(void **state) {
  (void)state;
  glob_t found;
  assert_int_equal(glob("configs/*.ini", 0, NULL, &found), 0);
  assert_true(found.gl_pathc >= 5);
  for (size_t i = 0; i < found.gl_pathc; i++) {
    const char *path = found.gl_pathv[i];
    Config c, model;
    load_recipe(&c, path);
    expect_file_values(path, written_by(&c, config_write));
    config_defaults(&model);
    if (config_load_model(&model, c.model.file)) fail_msg("%s", tl_last_error());
    assert_memory_equal(&c.model.spec, &model.model.spec, sizeof model.model.spec);
  }
  globfree(&found);
}

// Every model file under models/ loads, and each key it sets holds the value it states.
static void shipped_models_load(void **state) {
  (void)state;
  glob_t found;
  assert_int_equal(glob("models/*.ini", 0, NULL, &found), 0);
  assert_true(found.gl_pathc >= 2);
  for (size_t i = 0; i < found.gl_pathc; i++) {
    Config c;
    config_defaults(&c);
    if (config_load_model(&c, found.gl_pathv[i])) fail_msg("%s", tl_last_error());
    assert_string_equal(c.model.file, found.gl_pathv[i]);
    expect_file_values(found.gl_pathv[i], written_by(&c, config_write_model));
  }
  globfree(&found);
}

static void model_file_is_read_after_the_whole_recipe(void **state) {
  (void)state;
  char path[256];
  write_temp(path, sizeof path,
             "[train]\nbatch_size = 8\n[model]\nfile = models/vit-tiny.ini\n[optim]\nlr = 0.5\n");
  Config c;
  config_defaults(&c);
  int rc = config_load(&c, path);
  unlink(path);
  if (rc) fail_msg("%s", tl_last_error());
  assert_string_equal(c.model.spec.type, "vit");
  assert_int_equal(c.train.batch_size, 8);
  assert_true(c.optim.lr == 0.5f);

  write_temp(path, sizeof path, "[model]\nfile = models/no-such-model.ini\n");
  config_defaults(&c);
  rc = config_load(&c, path);
  unlink(path);
  assert_int_equal(rc, -1);
  assert_contains(tl_last_error(), "models/no-such-model.ini: cannot open");
}

static void unknown_names_suggest_the_closest(void **state) {
  (void)state;
  expect_load_error("; a comment\n[optim]\nlerning_rate = 0.1\n",
                    ":3: unknown key 'lerning_rate' in [optim] (did you mean 'lr'?)");
  expect_load_error("[train]\nbatchsize = 3\n",
                    ":2: unknown key 'batchsize' in [train] (did you mean 'batch_size'?)");
  expect_load_error("[optimizer]\nlr = 0.1\n",
                    ":2: unknown section [optimizer] (did you mean [optim]?)");
  expect_load_error("[mocco]\ntemperature = 0.1\n",
                    ":2: unknown section [mocco] (did you mean [moco]?)");
  // Nothing close: the known names instead of a wild guess.
  expect_load_error_part("[ledger]\nqqqqqqqq = 1\n", 2, "(known keys: every)");
  expect_load_error_part("\n[train]\nepochs = 2\n[zzzzzzzz]\nx = 1\n", 5,
                         "unknown section [zzzzzzzz] (known sections: data, augment, model");
  expect_load_error(";\nlr = 0.1\n",
                    ":2: key 'lr' comes before any section (it belongs in [optim])");
  // The model spec lives in the model file, not in a recipe.
  expect_load_error_part("[backbone]\ndim = 64\n", 2, "unknown section [backbone]");
}

static void numbers_out_of_range_or_malformed(void **state) {
  (void)state;
  expect_load_error("[train]\nbatch_size = -3\n",
                    ":2: [train] batch_size = -3 is out of range (1..65536)");
  expect_load_error("[optim]\nbeta1 = 1\n", ":2: [optim] beta1 = 1 is out of range [0, 1)");
  expect_load_error("[moco]\ntemperature = 0\n",
                    ":2: [moco] temperature = 0 is out of range (0, 100]");
  expect_load_error("[optim]\nlr = abc\n", ":2: [optim] lr = 'abc' is not a number");
  expect_load_error("[optim]\nlr = 0.1x\n", ":2: [optim] lr = '0.1x' is not a number");
  expect_load_error("[optim]\nlr =\n", ":2: [optim] lr = '' is not a number");
  // strtod's other spellings are not a recipe's numbers: 0x10 would be read as 16.
  expect_load_error("[optim]\nlr = 0x10\n", ":2: [optim] lr = '0x10' is not a number");
  expect_load_error("[optim]\nlr = 0x1p-3\n", ":2: [optim] lr = '0x1p-3' is not a number");
  expect_load_error("[optim]\nlr = infinity\n", ":2: [optim] lr = 'infinity' is not a number");
  expect_load_error("[train]\nepochs = 2.5\n", ":2: [train] epochs = '2.5' is not an integer");
  expect_load_error("[train]\nepochs = 99999999999999999999\n",
                    ":2: [train] epochs = '99999999999999999999' is not an integer");
  expect_load_error("[train]\nseed = -1\n",
                    ":2: [train] seed = '-1' is not a non-negative integer");
  expect_load_error("[optim]\nname = adam\n",
                    ":2: [optim] name = 'adam' is not one of sgd|lars|adamw");
  expect_load_error_part("[moco]\nsymmetric = maybe\n", 2,
                         "[moco] symmetric = 'maybe' is not a boolean");
}

static void lines_inih_cannot_parse(void **state) {
  (void)state;
  char path[256];
  write_temp(path, sizeof path, "");
  unlink(path);
  Config c;
  config_defaults(&c);
  assert_int_equal(config_load(&c, path), -1);
  char expected[512];
  snprintf(expected, sizeof expected, "%s: cannot open: %s", path, strerror(ENOENT));
  assert_string_equal(tl_last_error(), expected);

  expect_load_error("[optim]\nlr 0.1\n", ":2: malformed line");
  expect_load_error("[train]\nepochs = 2\n[optim\n", ":3: malformed line");
  // The first error wins, whichever kind it is.
  expect_load_error("[optim]\nlr = abc\nfoo\n", ":2: [optim] lr = 'abc' is not a number");
  expect_load_error("[optim]\nfoo\nlr = abc\n", ":2: malformed line");
  // inih would read an indented line as more of the previous value.
  expect_load_error_part("[optim]\nlr = 0.1\n  momentum = 0.5\n", 3, "indent");
  expect_load_error("[optim]\nlr = 0.1\nname = sgd\nlr = 0.2\n",
                    ":4: [optim] lr is set twice (first on line 2)");
  // inih keeps only the first part of an over-long line and then miscounts lines.
  // (Lines hold a path of PATH_MAX and its key: config_ini_max_line.)
  char long_text[CONFIG_PATH_MAX + 400];
  snprintf(long_text, sizeof long_text, "[data]\ntrain = %0*d\n", CONFIG_PATH_MAX + 100, 0);
  expect_load_error_part(long_text, 2, "line is longer than");
  // Lines inih would not take as written are refused with their line, not dropped: CR-only line
  // ends (the whole file one line, or one comment), a key on its section's line, a NUL byte.
  expect_load_error_part("[optim]\rlr = 0.36\r", 1, "a carriage return inside the line");
  expect_load_error_part("; recipe\r[optim]\rlr = 0.36\r", 1, "carriage return");
  snprintf(long_text, sizeof long_text, "; %0300d\r[optim]\rlr = 0.36\r", 0);
  expect_load_error_part(long_text, 1, "carriage return");
  expect_load_error_part("[train]\nepochs = 2\n[optim] lr = 0.36\n", 3,
                         "text after the section header");
  expect_nul_refused();
  // CRLF line ends are line ends.
  write_temp(path, sizeof path, "[optim]\r\nlr = 0.36\r\n[train] ; the loop\r\nepochs = 3\r\n");
  int crlf_rc = config_load(&c, path);
  unlink(path);
  if (crlf_rc) fail_msg("%s", tl_last_error());
  assert_true(c.optim.lr == 0.36f);
  assert_int_equal(c.train.epochs, 3);
  // A long comment is harmless: it loses its tail, and the lines after it keep their numbers.
  snprintf(long_text, sizeof long_text, "; %0300d\n[optim]\nlr = abc\n", 0);
  expect_load_error(long_text, ":3: [optim] lr = 'abc' is not a number");
  // Accepted spellings: ':' separator, inline comments, indented first key, any boolean form.
  write_temp(path, sizeof path,
             "[optim]\n  lr: 0.5 ; peak\n[moco]\nsymmetric = yes\n[mae]\nnorm_pix_loss = off\n");
  int rc = config_load(&c, path);
  unlink(path);
  if (rc) fail_msg("%s", tl_last_error());
  assert_true(c.optim.lr == 0.5f);
  assert_string_equal(value_of(&c, "moco.symmetric"), "1");
  assert_string_equal(value_of(&c, "mae.norm_pix_loss"), "0");
}

static void expect_set_error(Config *c, const char *assignment, const char *part) {
  Config before;
  memcpy(&before, c, sizeof before);
  assert_int_equal(config_set(c, assignment), -1);
  assert_contains(tl_last_error(), part);
  assert_memory_equal(c, &before, sizeof before);
}

static void set_overrides(void **state) {
  (void)state;
  Config c;
  load_recipe(&c, "configs/inbatch.ini");
  assert_int_equal(config_set(&c, "optim.lr=0.5"), 0);
  assert_true(c.optim.lr == 0.5f);
  assert_int_equal(config_set(&c, "  train.batch_size = 32 "), 0);
  assert_int_equal(c.train.batch_size, 32);
  assert_int_equal(config_set(&c, "train.seed=18446744073709551615"), 0);
  assert_true(c.train.seed == UINT64_MAX);
  assert_int_equal(config_set(&c, "parallel.shard_weights=1,3"), 0);
  assert_string_equal(c.parallel.shard_weights, "1,3");
  // A new model file is read at once.
  assert_int_equal(config_set(&c, "model.file=models/vit-tiny.ini"), 0);
  assert_string_equal(c.model.spec.type, "vit");
  assert_int_equal(c.model.spec.dim, 128);

  char expected[256];
  assert_int_equal(config_set(&c, "optim.lr=abc"), -1);
  assert_string_equal(tl_last_error(), "--set optim.lr=abc: [optim] lr = 'abc' is not a number");
  expect_set_error(&c, "optim.lr=abc", "--set optim.lr=abc: ");
  expect_set_error(&c, "optim.lerning_rate=0.1",
                   "--set optim.lerning_rate=0.1: unknown key 'lerning_rate' in [optim] "
                   "(did you mean 'lr'?)");
  expect_set_error(&c, "optimizer.lr=0.1", "(did you mean [optim]?)");
  expect_set_error(&c, "train.batch_size=0", "[train] batch_size = 0 is out of range (1..65536)");
  expect_set_error(&c, "lr=0.1", "expected section.key=value");
  expect_set_error(&c, "optim.lr", "expected section.key=value");
  expect_set_error(&c, "data.train=a;b", "contains ';'");
  snprintf(expected, sizeof expected,
           "--set model.file=models/no-such.ini: models/no-such.ini: cannot open: %s",
           strerror(ENOENT));
  expect_set_error(&c, "model.file=models/no-such.ini", expected);
  // Backbone keys belong to the model file, so --set cannot reach them.
  expect_set_error(&c, "backbone.dim=64", "unknown section [backbone]");
}

static int load_model_text(Config *c, const char *text) {
  char path[256];
  write_temp(path, sizeof path, text);
  config_defaults(c);
  int rc = config_load_model(c, path);
  unlink(path);
  return rc;
}

static void stage_lists(void **state) {
  (void)state;
  Config c;
  int rc = load_model_text(&c,
                           "[backbone]\ntype = resnet\nstem_channels = 16\n"
                           "stage_channels = 16, 32,64 ,128\nstage_blocks = 2,2,2,2\n"
                           "stage_strides = 1,2,2,2\n");
  if (rc) fail_msg("%s", tl_last_error());
  const int channels[] = {16, 32, 64, 128, 0, 0, 0, 0}, blocks[] = {2, 2, 2, 2, 0, 0, 0, 0},
            strides[] = {1, 2, 2, 2, 0, 0, 0, 0};
  assert_int_equal(model_spec_stages(&c.model.spec), 4);
  assert_memory_equal(c.model.spec.stage_channels, channels, sizeof channels);
  assert_memory_equal(c.model.spec.stage_blocks, blocks, sizeof blocks);
  assert_memory_equal(c.model.spec.stage_strides, strides, sizeof strides);
  assert_int_equal(config_validate(&c), 0);

  // Two channel entries against the default three blocks and strides: caught by validation,
  // naming the model file.
  rc = load_model_text(&c, "[backbone]\nstage_channels = 16,32\n");
  if (rc) fail_msg("%s", tl_last_error());
  assert_int_equal(config_validate(&c), -1);
  assert_contains(tl_last_error(), c.model.file);
  assert_contains(tl_last_error(), "stage_channels has 2, stage_blocks 3, stage_strides 3");

  // The same for a vit, which ignores the lists: a file contradicting itself is named, not
  // accepted and then written back in a form that no longer loads.
  rc = load_model_text(&c, "[backbone]\ntype = vit\nstage_channels = 32,6\nstage_blocks = 1,1,1\n");
  if (rc) fail_msg("%s", tl_last_error());
  assert_int_equal(config_validate(&c), -1);
  assert_contains(tl_last_error(), "stage_channels has 2, stage_blocks 3, stage_strides 3");

  // Each list is written as it was read, whatever length the list read last had: a written
  // file states the same contradiction, and validation names it again.
  rc = load_model_text(&c, "[backbone]\nstage_channels = 8,16,32\nstage_blocks = 3,4\n");
  if (rc) fail_msg("%s", tl_last_error());
  const char *model = written_by(&c, config_write_model);
  assert_contains(model, "stage_channels = 8,16,32\n");
  assert_contains(model, "stage_blocks = 3,4\n");
  assert_contains(model, "stage_strides = 1,2,2\n");

  assert_int_equal(load_model_text(&c, "[backbone]\nstage_channels = 16,x\n"), -1);
  assert_contains(tl_last_error(), ":2: [backbone] stage_channels = '16,x': 'x' is not an integer");
  assert_int_equal(load_model_text(&c, "[backbone]\nstage_strides = 1,2,9\n"), -1);
  assert_contains(tl_last_error(),
                  ":2: [backbone] stage_strides = 1,2,9: 9 is out of range (1..4)");
  assert_int_equal(load_model_text(&c, "[backbone]\nstage_blocks = 1,1,1,1,1,1,1,1,1\n"), -1);
  assert_contains(tl_last_error(), "has more than 8 entries");
  assert_int_equal(load_model_text(&c, "[backbone]\nstage_blocks = 1,,1\n"), -1);
  assert_contains(tl_last_error(), ":2: [backbone] stage_blocks = '1,,1': '' is not an integer");
  assert_int_equal(load_model_text(&c, "[backbone]\nstage_blocks =\n"), -1);
  assert_contains(tl_last_error(), "[backbone] stage_blocks is empty");
  assert_int_equal(load_model_text(&c, "[backbone]\ndims = 64\n"), -1);
  assert_contains(tl_last_error(), ":2: unknown key 'dims' in [backbone] (did you mean 'dim'?)");
}

// Every recipe key with a value different from its default, written out independently of the
// implementation's table: a key missing from it, from config_write or from loading fails the
// round trip below.
static const char *const every_key[][2] = {
    {"data.dataset", "fashion-mnist"},
    {"data.format", "imagefolder"},
    {"data.train", "some/train"},
    {"data.test", "some/test"},
    {"data.image_size", "32"},
    {"data.channels", "3"},
    {"data.labels", "none"},
    {"data.limit", "1000"},
    {"data.test_limit", "500"},
    {"data.stream", "0"},
    {"augment.crop_scale_min", "0.3"},
    {"augment.crop_scale_max", "0.9"},
    {"augment.flip_prob", "0.25"},
    {"augment.jitter_strength", "0.3"},
    {"augment.jitter_prob", "0.7"},
    {"augment.grayscale_prob", "0.1"},
    {"augment.solarize_prob", "0.2"},
    {"augment.blur_prob", "0.5"},
    {"model.file", "models/vit-tiny.ini"},
    {"model.head_hidden_dim", "512"},
    {"model.head_out_dim", "128"},
    {"model.bn_splits", "4"},
    {"model.sync_bn", "1"},
    {"train.batch_size", "64"},
    {"train.precision", "bf16"},
    {"train.recompute", "0"},
    {"train.conv_algorithm", "winograd"},
    {"train.epochs", "3"},
    {"train.steps", "123"},
    {"train.seed", "18446744073709551615"},
    {"train.log_every", "5"},
    {"train.checkpoint_every", "7"},
    {"train.budget", "7m"},
    {"optim.name", "lars"},
    {"optim.lr", "0.123456789"},
    {"optim.lr_batch", "512"},
    {"optim.momentum", "0.8"},
    {"optim.weight_decay", "1e-5"},
    {"optim.warmup_steps", "7"},
    {"optim.backbone_freeze_steps", "3"},
    {"optim.schedule", "constant"},
    {"optim.beta1", "0.85"},
    {"optim.beta2", "0.999"},
    {"optim.eps", "1e-6"},
    {"optim.lars_eta", "0.02"},
    {"inbatch.temperature", "0.07"},
    {"moco.temperature", "0.3"},
    {"moco.queue_size", "1024"},
    {"moco.momentum", "0.996"},
    {"moco.momentum_schedule", "cosine"},
    {"moco.queue_max_age_steps", "100"},
    {"moco.symmetric", "1"},
    {"mae.mask_ratio", "0.6"},
    {"mae.norm_pix_loss", "0"},
    {"mae.decoder_dim", "96"},
    {"mae.decoder_depth", "2"},
    {"mae.decoder_heads", "3"},
    {"mae.png_every", "50"},
    {"byol.momentum", "0.996"},
    {"byol.momentum_schedule", "constant"},
    {"byol.predictor_hidden_dim", "512"},
    {"byol.asymmetric", "1"},
    {"vicreg.sim_coeff", "20"},
    {"vicreg.std_coeff", "30"},
    {"vicreg.cov_coeff", "2"},
    {"dino.local_crops", "4"},
    {"dino.local_size", "16"},
    {"dino.out_dim", "512"},
    {"dino.global_crop_scale_min", "0.5"},
    {"dino.local_crop_scale_min", "0.1"},
    {"dino.student_temp", "0.2"},
    {"dino.teacher_temp", "0.05"},
    {"dino.warmup_teacher_temp", "0.03"},
    {"dino.teacher_temp_warmup", "0.2"},
    {"dino.center_momentum", "0.8"},
    {"dino.momentum", "0.995"},
    {"dino.momentum_schedule", "constant"},
    {"dino.head_bn", "1"},
    {"dino.head_layers", "3"},
    {"barlow.lambda", "0.02"},
    {"swav.local_crops", "4"},
    {"swav.local_size", "16"},
    {"swav.global_crop_scale_min", "0.5"},
    {"swav.local_crop_scale_min", "0.1"},
    {"swav.prototypes", "300"},
    {"swav.temperature", "0.2"},
    {"swav.epsilon", "0.03"},
    {"swav.sinkhorn_iterations", "5"},
    {"swav.freeze_prototypes_niters", "100"},
    {"parallel.backend", "mpi"},
    {"parallel.replicas", "2"},
    {"parallel.checksum_every", "10"},
    {"parallel.bucket_kib", "256"},
    {"parallel.timeout", "60"},
    {"parallel.shard_weights", "1,3"},
    {"eval.linear", "1"},
    {"eval.knn_k", "20"},
    {"eval.knn_temperature", "0.07"},
    {"eval.knn_every_epochs", "2"},
    {"eval.every_steps", "7"},
    {"eval.knn_train_limit", "5000"},
    {"eval.batch_size", "250"},
    {"eval.train", "data/samples/stripes"},
    {"eval.test", "data/samples/stripes"},
    {"ledger.every", "2"},
};
#define N_KEYS (sizeof every_key / sizeof every_key[0])

// Writes `c`, loads the result into a fresh default Config and checks it is identical.
static void round_trip(const Config *c, char *written, size_t cap) {
  char path[256];
  write_temp(path, sizeof path, "");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  config_write(c, f);
  fclose(f);
  f = fopen(path, "r");
  size_t n = fread(written, 1, cap - 1, f);
  written[n] = '\0';
  fclose(f);

  Config back;
  config_defaults(&back);
  int rc = config_load(&back, path);
  unlink(path);
  if (rc) fail_msg("%s\n%s", tl_last_error(), written);
  // The fields that say where a Config's values came from, not what they are.
  memcpy(back.source_path, c->source_path, sizeof back.source_path);
  memcpy(back.set_by_option, c->set_by_option, sizeof back.set_by_option);
  assert_memory_equal(&back, c, sizeof back);
}

static void write_load_round_trip(void **state) {
  (void)state;
  static char written[16384];
  Config c;
  config_defaults(&c);
  round_trip(&c, written, sizeof written);

  load_recipe(&c, "configs/inbatch.ini");
  for (size_t i = 0; i < N_KEYS; i++) {
    Config before;
    memcpy(&before, &c, sizeof c);
    char assignment[256];
    snprintf(assignment, sizeof assignment, "%s=%s", every_key[i][0], every_key[i][1]);
    if (config_set(&c, assignment)) fail_msg("%s", tl_last_error());
    if (memcmp(&before, &c, sizeof c) == 0) fail_msg("%s changed nothing", assignment);
  }
  assert_true(c.optim.lr == 0.123456789f);
  assert_true(c.train.seed == UINT64_MAX);
  round_trip(&c, written, sizeof written);

  // Every key config_write writes, once, no more; the model spec only as comments. The sections
  // are the ones config knows, every registered objective's among them, so a section the list
  // above does not name (a new objective's) fails here by name.
  size_t key_lines = 0;
  for (const char *line = written; *line; line = strchr(line, '\n') + 1) {
    if (*line == '[') {
      size_t len = strcspn(line + 1, "]");
      int listed = 0;
      for (size_t i = 0; i < N_KEYS; i++)
        listed |= strncmp(every_key[i][0], line + 1, len) == 0 && every_key[i][0][len] == '.';
      if (!listed) fail_msg("every_key sets no key of [%.*s]", (int)len, line + 1);
    } else if (*line != ';' && *line != '\n') {
      key_lines++;
    }
    if (!strchr(line, '\n')) break;
  }
  assert_int_equal(key_lines, N_KEYS);
  // And every objective of the table has its section written.
  char names[256];
  snprintf(names, sizeof names, "%s", objective_names());
  int n_objectives = 0;
  for (char *save, *name = strtok_r(names, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
    char header[64];
    snprintf(header, sizeof header, "\n[%s]\n", name);
    assert_contains(written, header);
    n_objectives++;
  }
  assert_true(n_objectives >= 6);
  // Floats in their shortest exact form: the float nearest 0.123456789 is 0.123456791043...,
  // its neighbours are 7.45e-9 away, so 8 digits name it and 7 (0.1234568) do not.
  assert_contains(written, "\nlr = 0.12345679\n");
  assert_contains(written, "\nweight_decay = 1e-05\n");
  assert_contains(written, "\nbeta2 = 0.999\n");
  assert_contains(written, "\nshard_weights = 1,3\n");
  assert_contains(written, "; [backbone]\n; type = vit\n");
  assert_contains(written, "\n; stage_channels = 32,64,128\n");
  assert_contains(written, "\n; dim = 128\n");
}

static void expect_invalid(const Config *c, const char *part) {
  assert_int_equal(config_validate(c), -1);
  assert_contains(tl_last_error(), part);
}

static void validate_cross_field(void **state) {
  (void)state;
  Config base, c;
  load_recipe(&base, "configs/inbatch.ini");

  memcpy(&c, &base, sizeof c);
  c.train.batch_size = 2;
  c.parallel.replicas = 4;
  expect_invalid(&c, "[train] batch_size = 2 is smaller than [parallel] replicas = 4");
  c.train.batch_size = 4;
  assert_int_equal(config_validate(&c), 0);

  memcpy(&c, &base, sizeof c);
  c.data.channels = 2;
  expect_invalid(&c, "[data] channels = 2");

  memcpy(&c, &base, sizeof c);
  c.augment.crop_scale_min = 0.9f;
  c.augment.crop_scale_max = 0.5f;
  expect_invalid(&c, "crop_scale_min = 0.9 is larger than crop_scale_max = 0.5");

  memcpy(&c, &base, sizeof c);
  assert_int_equal(config_set(&c, "mae.decoder_heads=3"), 0);
  expect_invalid(&c, "decoder_dim = 64 is not divisible by decoder_heads = 3");

  memcpy(&c, &base, sizeof c);
  c.model.file[0] = '\0';
  expect_invalid(&c, "[model] file is empty");

  memcpy(&c, &base, sizeof c);
  assert_int_equal(config_set(&c, "optim.backbone_freeze_steps=5"), 0);
  assert_int_equal(config_validate(&c), 0);
  assert_int_equal(config_set(&c, "optim.name=adamw"), 0);
  expect_invalid(&c, "[optim] backbone_freeze_steps = 5 needs `sgd` or `lars`");

  memcpy(&c, &base, sizeof c);
  assert_int_equal(config_set(&c, "parallel.shard_weights=1,3"), 0);
  expect_invalid(&c, "shard_weights = '1,3' has 2 weights for 1 replicas");
  assert_int_equal(config_set(&c, "parallel.replicas=2"), 0);
  assert_int_equal(config_validate(&c), 0);
  assert_int_equal(config_set(&c, "parallel.shard_weights=1,x"), 0);
  expect_invalid(&c, "is not a list of positive numbers");
  assert_int_equal(config_set(&c, "parallel.shard_weights=1,3,"), 0);
  expect_invalid(&c, "is not a list of positive numbers");
  assert_int_equal(config_set(&c, "parallel.shard_weights=1,0"), 0);
  expect_invalid(&c, "is not a list of positive numbers");

  memcpy(&c, &base, sizeof c);
  memset(c.model.spec.stage_channels, 0, sizeof c.model.spec.stage_channels);
  expect_invalid(&c, "at least one stage");

  // vit: the padded size must split into patches, the width into heads.
  load_recipe(&base, "configs/mae.ini");
  memcpy(&c, &base, sizeof c);
  c.model.spec.patch_size = 5;
  expect_invalid(&c,
                 "models/vit-tiny.ini: [backbone] patch_size = 5 does not divide the image "
                 "size 32");
  memcpy(&c, &base, sizeof c);
  c.model.spec.pad_to = 0;  // 28x28 unpadded: 4 divides it, 8 does not
  assert_int_equal(config_validate(&c), 0);
  c.model.spec.patch_size = 8;
  expect_invalid(&c, "patch_size = 8 does not divide the image size 28");
  memcpy(&c, &base, sizeof c);
  c.model.spec.pad_to = 24;
  expect_invalid(&c, "pad_to = 24 is smaller than [data] image_size = 28");
  // resnet: padded to 32 is fine (the PyTorch reference's input); an odd margin is not.
  load_recipe(&c, "configs/inbatch.ini");
  c.model.spec.pad_to = 32;
  assert_int_equal(config_validate(&c), 0);
  c.model.spec.pad_to = 31;
  expect_invalid(&c, "pad_to = 31: resnet pads evenly on both sides");
  c.model.spec.pad_to = 26;
  expect_invalid(&c, "pad_to = 26 is smaller than [data] image_size = 28");
  memcpy(&c, &base, sizeof c);
  c.model.spec.dim = 130;
  expect_invalid(&c, "dim = 130 is not divisible by heads = 4");
}

// Recipes and model files are read only if they are regular files: a FIFO would block the
// open until a writer came, /dev/zero never ends. Each is refused by name, as is a file far
// larger than any configuration. The alarm turns a blocking read into a failure, not a hang.
static void config_files_must_be_regular(void **state) {
  (void)state;
  Config cfg;
  config_defaults(&cfg);
  char dir[200], fifo[256], big[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/tally-config-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  assert_non_null(mkdtemp(dir));
  snprintf(fifo, sizeof fifo, "%s/recipe.ini", dir);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  alarm(30);
  const char *const refused[] = {"/dev/zero", fifo, dir};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(config_load(&cfg, refused[i]), -1);
    char expected[300];
    snprintf(expected, sizeof expected, "%s: not a regular file", refused[i]);
    assert_contains(tl_last_error(), expected);
    // As the model file, named in the recipe or set on the command line.
    assert_int_equal(config_load_model(&cfg, refused[i]), -1);
    assert_contains(tl_last_error(), expected);
    char set[300];
    snprintf(set, sizeof set, "model.file=%s", refused[i]);
    assert_int_equal(config_set(&cfg, set), -1);
    assert_contains(tl_last_error(), expected);
  }
  alarm(0);
  // A regular file of 2 MiB of comments is not a configuration.
  snprintf(big, sizeof big, "%s/big.ini", dir);
  FILE *f = fopen(big, "w");
  assert_non_null(f);
  for (int i = 0; i < (2 << 20) / 64; i++) fprintf(f, "; %61s\n", "padding");
  fclose(f);
  assert_int_equal(config_load(&cfg, big), -1);
  assert_contains(tl_last_error(), "big.ini: 2097152 bytes, more than the 1048576");
  unlink(big);
  unlink(fifo);
  rmdir(dir);
}

// Messages quote what files hold: an escape sequence in a key or a value is shown as \xNN and
// never reaches the terminal raw (it could recolour it, move the cursor, retitle the window).
static void control_bytes_are_escaped(void **state) {
  (void)state;
  char path[256];
  write_temp(path, sizeof path, "[data]\nfo\x1b[2Jo = 1\n");
  Config cfg;
  config_defaults(&cfg);
  assert_int_equal(config_load(&cfg, path), -1);
  unlink(path);
  assert_contains(tl_last_error(), ":2: unknown key 'fo\\x1b[2Jo' in [data]");
  assert_null(strchr(tl_last_error(), '\x1b'));
  write_temp(path, sizeof path, "[data]\nformat = idx\x1b]0;owned\x07\n");
  assert_int_equal(config_load(&cfg, path), -1);
  unlink(path);
  assert_contains(tl_last_error(),
                  "format = 'idx\\x1b]0;owned\\x07' is not one of idx|imagefolder");
  assert_null(strchr(tl_last_error(), '\x1b'));
  assert_null(strchr(tl_last_error(), '\x07'));
}

// Every message is one line of text: control characters (C0, DEL, C1) and bytes that are not
// UTF-8 are escaped, well-formed UTF-8 is kept; a message is not cut at 1 KiB, and one longer
// than the buffer ends in a visible "...".
static void error_messages_are_one_whole_line(void **state) {
  (void)state;
  tl_fail("%s", "caf\xc3\xa9 \xe2\x82\xac tab\there\nnew \x7f \xc2\x9b \xff \xe2\x82");
  assert_string_equal(tl_last_error(),
                      "caf\xc3\xa9 \xe2\x82\xac tab\\x09here\\x0anew \\x7f \\xc2\\x9b \\xff "
                      "\\xe2\\x82");
  static char long_text[20000];
  memset(long_text, 'a', 3000);
  strcpy(long_text + 3000, " END");
  tl_fail("path: %s", long_text);
  assert_int_equal(strlen(tl_last_error()), 3010);
  assert_contains(tl_last_error(), "a END");
  memset(long_text, 'b', sizeof long_text - 1);
  tl_fail("path: %s", long_text);
  size_t n = strlen(tl_last_error());
  assert_true(n > 8192 && n < sizeof long_text);
  assert_string_equal(tl_last_error() + n - 4, "b...");
  // A message may quote the one before it.
  tl_fail("first");
  tl_fail("second: %s", tl_last_error());
  assert_string_equal(tl_last_error(), "second: first");
}

// [data] dataset = NAME reads data/NAME.ini where the line stands: its keys apply, keys after it
// override them, its relative paths work from the project root, and an unknown name, a name
// with a path in it, or a descriptor naming another are refused.
static void datasets_are_named_in_data(void **state) {
  (void)state;
  Config c;
  config_defaults(&c);
  char path[256];
  write_temp(path, sizeof path, "[data]\ndataset = stripes\nimage_size = 20\n");
  if (config_load(&c, path) != 0) fail_msg("%s", tl_last_error());
  assert_string_equal(c.data.format, "imagefolder");
  assert_int_equal(c.data.image_size, 20);  // after the dataset line: the recipe's
  assert_non_null(strstr(c.data.train, "data/samples/stripes"));
  unlink(path);
  config_defaults(&c);
  assert_int_equal(config_set(&c, "data.dataset=fashion-mnist"), 0);
  assert_string_equal(c.data.format, "idx");
  assert_non_null(strstr(c.data.train, "train-images-idx3-ubyte.gz"));
  assert_int_equal(config_set(&c, "data.dataset=nosuch"), -1);
  assert_non_null(strstr(tl_last_error(), "no data/nosuch.ini"));
  assert_int_equal(config_set(&c, "data.dataset=../configs/moco"), -1);
  assert_non_null(strstr(tl_last_error(), "a name from data/"));
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_validate_and_name_their_model),
      cmocka_unit_test(every_default_is_a_valid_value),
      cmocka_unit_test(numeric_keys_refuse_out_of_range_values),
      cmocka_unit_test(shipped_recipes_load),
      cmocka_unit_test(shipped_models_load),
      cmocka_unit_test(model_file_is_read_after_the_whole_recipe),
      cmocka_unit_test(unknown_names_suggest_the_closest),
      cmocka_unit_test(numbers_out_of_range_or_malformed),
      cmocka_unit_test(lines_inih_cannot_parse),
      cmocka_unit_test(set_overrides),
      cmocka_unit_test(stage_lists),
      cmocka_unit_test(write_load_round_trip),
      cmocka_unit_test(validate_cross_field),
      cmocka_unit_test(config_files_must_be_regular),
      cmocka_unit_test(control_bytes_are_escaped),
      cmocka_unit_test(error_messages_are_one_whole_line),
      cmocka_unit_test(datasets_are_named_in_data),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
