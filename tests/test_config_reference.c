// The key reference: `tally keys` prints every key of the tables with its meaning, and
// docs/keys.md's "Configuration keys" section is that output, byte for byte, so the documentation
// cannot drift from the keys the loader accepts.
//
// After changing a key, regenerate the section (from the project root, with the binary built):
//   build/tally keys > /tmp/keys.md && awk '/<!-- keys:end -->/ { skip = 0; print "" }
//     !skip { print } /<!-- keys:begin -->/ { skip = 1; print "";
//     while ((getline line < "/tmp/keys.md") > 0) print line }' docs/keys.md > keys.tmp &&
//   mv keys.tmp docs/keys.md
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <unistd.h>

#include "cli_test_util.h"
#include "config.h"
#include "objectives/objective.h"

static const char begin_marker[] = "<!-- keys:begin -->\n\n";
static const char end_marker[] = "\n<!-- keys:end -->";

// Everything a stream holds, NUL-terminated and malloc'ed.
static char *read_all(FILE *f) {
  size_t cap = 1 << 16, n = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  for (size_t got; (got = fread(text + n, 1, cap - n - 1, f)) > 0;) {
    n += got;
    if (n + 1 == cap) {
      cap *= 2;
      text = realloc(text, cap);
      assert_non_null(text);
    }
  }
  text[n] = '\0';
  return text;
}

// stdout of `tally ARGS`, which must exit 0.
static char *tally_output(const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s", bin, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char *out = read_all(p);
  assert_int_equal(pclose(p), 0);
  return out;
}

static void test_readme_section_is_the_command_output(void **state) {
  (void)state;
  char *keys = tally_output("keys");
  FILE *f = fopen("docs/keys.md", "r");
  assert_non_null(f);
  char *readme = read_all(f);
  fclose(f);
  char *begin = strstr(readme, begin_marker);
  assert_non_null(begin);
  begin += strlen(begin_marker);
  char *end = strstr(begin, end_marker);
  assert_non_null(end);
  *end = '\0';
  if (strcmp(begin, keys) != 0) {
    // The first line that differs, so the failure says which key changed.
    size_t at = 0;
    while (begin[at] && begin[at] == keys[at]) at++;
    while (at > 0 && keys[at - 1] != '\n') at--;
    fail_msg(
        "docs/keys.md's keys section differs from `tally keys` (regenerate it: see the top of "
        "this test) at:\n  docs/keys.md: %.*s\n  tally keys: %.*s",
        (int)strcspn(begin + at, "\n"), begin + at, (int)strcspn(keys + at, "\n"), keys + at);
  }
  free(readme);
  free(keys);
}

static void check_meanings(const KeySpec *keys, size_t n) {
  assert_true(n > 0);
  for (size_t i = 0; i < n; i++) {
    const char *help = keys[i].help;
    if (!help || !help[0] || strchr(help, '\n'))
      fail_msg("[%s] %s: no one-line meaning (.help)", keys[i].section, keys[i].key);
  }
}

static void test_every_key_has_a_meaning(void **state) {
  (void)state;
  size_t n;
  const KeySpec *keys = config_recipe_keys(&n);
  check_meanings(keys, n);
  keys = config_model_keys(&n);
  check_meanings(keys, n);
}

// Each key is a row of its own section's table: after the section's heading, before the next.
static void check_rows(const char *out, const KeySpec *keys, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char heading[128], row[128];
    snprintf(heading, sizeof heading, "### `[%s]`", keys[i].section);
    snprintf(row, sizeof row, "\n| `%s` |", keys[i].key);
    const char *section = strstr(out, heading);
    if (!section) fail_msg("no heading %s", heading);
    const char *next = strstr(section + 1, "\n### ");
    const char *found = strstr(section, row);
    if (!found || (next && found > next))
      fail_msg("[%s] %s has no row in its section", keys[i].section, keys[i].key);
  }
}

static void test_every_section_lists_its_keys(void **state) {
  (void)state;
  char *out = tally_output("keys");
  size_t n;
  const KeySpec *keys = config_recipe_keys(&n);
  check_rows(out, keys, n);
  keys = config_model_keys(&n);
  check_rows(out, keys, n);
  // The objectives' sections and the model file's are there, not only the recipe's own.
  const char *const expected[] = {"### `[data]`",   "### `[optim]`",   "### `[inbatch]`",
                                  "### `[moco]`",   "### `[mae]`",     "### `[byol]`",
                                  "### `[vicreg]`", "### `[backbone]`"};
  for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
    if (!strstr(out, expected[i])) fail_msg("no %s in `tally keys`", expected[i]);
  free(out);
}

static void test_help_names_the_command(void **state) {
  (void)state;
  char *main_help = tally_output("--help");
  assert_non_null(strstr(main_help, "  keys "));
  char *keys_help = tally_output("keys --help");
  assert_non_null(strstr(keys_help, "usage: tally keys"));
  free(main_help);
  free(keys_help);
  assert_int_equal(sh("%s keys --bogus >/dev/null 2>&1", bin), 2);
}

int main(void) {
  objective_register_config();
  // Only the binary's path is wanted: the scratch folder it makes stays unused.
  if (cli_test_init("config-reference") == 0) rmdir(tmpdir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_readme_section_is_the_command_output),
      cmocka_unit_test(test_every_key_has_a_meaning),
      cmocka_unit_test(test_every_section_lists_its_keys),
      cmocka_unit_test(test_help_names_the_command),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
