#include "compare/compare_spec.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

void compare_run_dir(const CompareSpec *spec, int o, int b, int s, char *out, size_t n) {
  // A budget is a path component: anything but letters, digits, '.' and '-' becomes '_'.
  char budget[64];
  snprintf(budget, sizeof budget, "%s", spec->budgets[b]);
  for (char *c = budget; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '.' || *c == '-'))
      *c = '_';
  snprintf(out, n, "%s/%s-%s-seed%d", spec->out_dir, spec->objectives[o], budget, s);
}

int compare_choose_recipes(CompareSpec *spec, const char *config_dir, const char *all_config,
                           const char *const *per_objective, int n_per_objective) {
  static char dir_paths[COMPARE_MAX_OBJECTIVES][CONFIG_PATH_MAX];
  for (int o = 0; o < spec->n_objectives; o++) {
    const char *name = spec->objectives[o];
    for (int k = 0; k < o; k++)
      if (!strcmp(spec->objectives[k], name)) return tl_fail("%s is named twice", name);
    spec->config_paths[o] = all_config;
    if (config_dir) {
      snprintf(dir_paths[o], sizeof dir_paths[o], "%s/%s.ini", config_dir, name);
      spec->config_paths[o] = dir_paths[o];
    }
    for (int k = 0; k < n_per_objective; k++) {
      const char *eq = strchr(per_objective[k], '=');
      if ((size_t)(eq - per_objective[k]) == strlen(name) &&
          !strncmp(per_objective[k], name, strlen(name)))
        spec->config_paths[o] = eq + 1;
    }
  }
  for (int k = 0; k < n_per_objective; k++) {
    int named = 0;
    for (int o = 0; o < spec->n_objectives; o++)
      named |= spec->config_paths[o] == strchr(per_objective[k], '=') + 1;
    if (!named) return tl_fail("--config %s names no objective of --objectives", per_objective[k]);
  }
  return 0;
}
