// tally: self-supervised image representation training on the CPU, with a ledger of what every
// step costs.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "core/error.h"
#include "objectives/objective.h"
#include "train/trainer.h"

#define TALLY_VERSION "0.1.0"

static void usage_main(FILE *f) {
  fprintf(f,
          "usage: tally <command> [options]\n"
          "\n"
          "Trains self-supervised image encoders on the CPU (oneDNN) and keeps a per-step\n"
          "ledger of what each step encodes, holds, caches and costs.\n"
          "\n"
          "commands:\n"
          "  train    train an encoder with an objective (inbatch, moco, mae)\n"
          "\n"
          "options:\n"
          "  -h, --help     this help; `tally train --help` for the command's options\n"
          "  --version      print the version\n");
}

static void usage_train(FILE *f) {
  fprintf(f,
          "usage: tally train [--objective=NAME] [--config FILE] [--set section.key=value]...\n"
          "                   [--steps N] [--epochs N] [--out DIR] [--knn-at-start] [--quiet]\n"
          "\n"
          "  --objective=NAME  %s (default inbatch)\n"
          "  --config FILE     INI recipe; default configs/NAME.ini when it exists, else the\n"
          "                    built-in defaults (Fashion-MNIST, models/resnet-small.ini)\n"
          "  --set S.K=V       override one key, validated like the file (repeatable)\n"
          "  --steps N         train N steps (same as --set train.steps=N)\n"
          "  --epochs N        train N epochs (same as --set train.epochs=N)\n"
          "  --out DIR         run folder (default runs/NAME-YYYYmmdd-HHMMSS): receives\n"
          "                    config.ini, ledger.jsonl, ledger.csv, checkpoint.bin, summary.json\n"
          "  --knn-at-start    also report the kNN accuracy of the untrained encoder\n"
          "  --quiet           no progress lines\n"
          "\n"
          "Exit codes: 0 success, 1 error (bad input, I/O), 2 usage or not available,\n"
          "3 the loss became NaN or infinite (the last good checkpoint is kept).\n",
          objective_names());
}

// Accepts "--name=value" and "--name value".
static const char *option_value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] == 0) {
    if (*i + 1 >= argc) {
      fprintf(stderr, "tally: %s needs a value\n", name);
      exit(2);
    }
    return argv[++*i];
  }
  return NULL;
}

static int cmd_train(int argc, char **argv) {
  const char *objective = "inbatch", *config_path = NULL, *out_dir = NULL;
  const char *sets[256];
  int n_sets = 0;
  char steps_set[64] = "", epochs_set[64] = "";
  TrainOptions opt = {0};
  for (int i = 0; i < argc; i++) {
    const char *v;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage_train(stdout);
      return 0;
    } else if ((v = option_value(argc, argv, &i, "--objective"))) {
      objective = v;
    } else if ((v = option_value(argc, argv, &i, "--config"))) {
      config_path = v;
    } else if ((v = option_value(argc, argv, &i, "--set"))) {
      if (n_sets == 256) {
        fprintf(stderr, "tally: too many --set options\n");
        return 2;
      }
      sets[n_sets++] = v;
    } else if ((v = option_value(argc, argv, &i, "--steps"))) {
      snprintf(steps_set, sizeof steps_set, "train.steps=%s", v);
    } else if ((v = option_value(argc, argv, &i, "--epochs"))) {
      snprintf(epochs_set, sizeof epochs_set, "train.epochs=%s", v);
    } else if ((v = option_value(argc, argv, &i, "--out"))) {
      out_dir = v;
    } else if (!strcmp(argv[i], "--knn-at-start")) {
      opt.knn_at_start = 1;
    } else if (!strcmp(argv[i], "--quiet")) {
      opt.quiet = 1;
    } else {
      fprintf(stderr, "tally train: unknown option '%s' (see tally train --help)\n", argv[i]);
      return 2;
    }
  }
  const ObjectiveDef *def = objective_find(objective);
  if (!def) {
    fprintf(stderr, "tally: unknown objective '%s' (choose one of: %s)\n", objective,
            objective_names());
    return 2;
  }
  if (!def->implemented) {
    fprintf(stderr, "tally: objective '%s' is not implemented yet\n", objective);
    return 2;
  }

  static Config cfg;
  config_defaults(&cfg);
  char default_name[256], default_path[CONFIG_PATH_MAX];
  snprintf(default_name, sizeof default_name, "configs/%s.ini", objective);
  config_resolve_path(default_name, default_path, sizeof default_path);
  if (!config_path && access(default_path, R_OK) == 0) config_path = default_path;
  int rc = config_path ? config_load(&cfg, config_path) : config_load_model(&cfg, cfg.model.file);
  for (int i = 0; rc == 0 && i < n_sets; i++) rc = config_set(&cfg, sets[i]);
  // --epochs alone means "train for epochs", so it clears a step count from the recipe.
  if (rc == 0 && epochs_set[0] && !steps_set[0]) rc = config_set(&cfg, "train.steps=0");
  if (rc == 0 && epochs_set[0]) rc = config_set(&cfg, epochs_set);
  if (rc == 0 && steps_set[0]) rc = config_set(&cfg, steps_set);
  if (rc == 0) rc = config_validate(&cfg);
  if (rc != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 1;
  }

  char default_out[128];
  if (!out_dir) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(default_out, sizeof default_out, "runs/%s-%s", objective, stamp);
    out_dir = default_out;
  }
  opt.objective = objective;
  opt.out_dir = out_dir;
  return train_run(&cfg, &opt);
}

// The project root is the build folder's parent: recipes and models are found there when the
// current directory has none.
static void set_search_root(void) {
  char exe[CONFIG_PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = 0;
  char root[CONFIG_PATH_MAX + 4];
  snprintf(root, sizeof root, "%s/..", exe);
  config_set_search_root(root);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  set_search_root();
  if (argc < 2) {
    usage_main(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage_main(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("tally %s\n", TALLY_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
  fprintf(stderr, "tally: unknown command '%s' (see tally --help)\n", cmd);
  return 2;
}
