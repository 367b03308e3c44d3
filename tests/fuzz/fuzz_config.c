// libFuzzer harness: an INI recipe and a model file, read from memory as a checkpoint's copy is
// (config_load_text), then checked across fields (config_validate).
// Input: RECIPE \0 MODEL (no NUL: the whole input is the recipe, the model is empty).
//
// Beyond "no crash": a configuration that loads and validates must survive being written
// (config_write, config_write_model: what a run folder and a checkpoint keep) and read back,
// still valid and the same; --resume depends on it.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "objectives/objective.h"

// The text config_write (or config_write_model) produces, malloc'ed.
static char *written(const Config *cfg, void (*write)(const Config *, FILE *)) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) abort();
  write(cfg, f);
  if (fclose(f) != 0) abort();
  return text;
}

// The first line where two texts differ, both ways, for the report.
static void print_first_difference(const char *a, const char *b) {
  for (int line = 1; *a || *b; line++) {
    size_t na = strcspn(a, "\n"), nb = strcspn(b, "\n");
    if (na != nb || memcmp(a, b, na) != 0) {
      fprintf(stderr, "line %d: '%.*s' became '%.*s'\n", line, (int)na, a, (int)nb, b);
      return;
    }
    a += na + (a[na] == '\n');
    b += nb + (b[nb] == '\n');
  }
}

// Written, read back and written again, the texts must be the same.
static void check_round_trip(const Config *cfg) {
  char *recipe = written(cfg, config_write), *model = written(cfg, config_write_model);
  static Config again;
  config_defaults(&again);
  if (config_load_text(&again, "fuzz", recipe, model) != 0 || config_validate(&again) != 0) {
    fprintf(stderr, "fuzz_config: the written configuration does not load back: %s\n",
            tl_last_error());
    abort();
  }
  char *recipe_again = written(&again, config_write),
       *model_again = written(&again, config_write_model);
  if (strcmp(recipe, recipe_again) != 0 || strcmp(model, model_again) != 0) {
    fprintf(stderr, "fuzz_config: the configuration changed on the way back: ");
    print_first_difference(strcmp(recipe, recipe_again) ? recipe : model,
                           strcmp(recipe, recipe_again) ? recipe_again : model_again);
    abort();
  }
  free(recipe);
  free(model);
  free(recipe_again);
  free(model_again);
}

// libFuzzer calls it once, before the first input: config reads the objectives' sections.
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  objective_register_config();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *parts[2];
  size_t lens[2];
  int n = fuzz_split(data, size, 2, parts, lens);
  static Config cfg;
  config_defaults(&cfg);
  if (config_load_text(&cfg, "fuzz", parts[0], n > 1 ? parts[1] : "") == 0 &&
      config_validate(&cfg) == 0)
    check_round_trip(&cfg);
  fuzz_free_parts(parts, n);
  return 0;
}
