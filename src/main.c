// tally: self-supervised image representation training on the CPU, with a ledger of what every
// step costs.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "core/error.h"
#include "encoder/embed.h"
#include "encoder/evaluate.h"
#include "io/regular_file.h"
#include "plan/plan.h"
#include "plan/plan_scaling.h"
#include "run/run_config.h"
#include "ledger/report.h"
#include "objectives/objective.h"
#include "train/checkpoint.h"
#include "compare/compare.h"
#include "encoder/export.h"
#include "run/trainer.h"

#define TALLY_VERSION "0.1.0"

static void usage_main(FILE *f) {
  fprintf(f,
          "usage: tally <command> [options]\n"
          "\n"
          "Trains self-supervised image encoders on the CPU (oneDNN) and keeps a per-step\n"
          "ledger of what each step encodes, holds, caches and costs.\n"
          "\n"
          "commands:\n"
          "  train    train an encoder with an objective (%s)\n"
          "  plan     the ledger a configuration will produce, before training (no data, no\n"
          "           compute); --memory-budget finds the largest batch or queue that fits\n"
          "  report   one self-contained HTML report (charts, cost table) from run folders\n"
          "  compare  train and score several objectives at several budgets over seeds, one\n"
          "           run after another (resumable): compare.json, compare.html, a verdict\n"
          "  eval     score a trained encoder: kNN and a linear probe, next to raw pixels\n"
          "  embed    write a trained encoder's features of a dataset as .npy\n"
          "  export   write a trained encoder as safetensors with PyTorch names\n"
          "  keys     every configuration key: type, range, default and meaning (Markdown)\n"
          "\n"
          "options:\n"
          "  -h, --help     this help; `tally COMMAND --help` for a command's options\n"
          "  --version      print the version\n",
          objective_names());
}

static void usage_train(FILE *f) {
  fprintf(f,
          "usage: tally train [--objective=NAME] [--config FILE] [--set section.key=value]...\n"
          "                   [--steps N] [--epochs N] [--out DIR] [--knn-at-start] [--no-knn]\n"
          "                   [--quiet] [--stop-at S] [--overwrite] [--init FILE]\n"
          "                   [--no-memory-check]\n"
          "                   [--budget AMOUNT]\n"
          "       tally train --resume DIR [--steps N] [--stop-at S] [--set S.K=V]...\n"
          "\n"
          "  --objective=NAME  %s (default inbatch)\n"
          "  --config FILE     INI recipe; default configs/NAME.ini when it exists, else the\n"
          "                    built-in defaults (Fashion-MNIST, models/resnet-small.ini)\n"
          "  --set S.K=V       override one key, validated like the file (repeatable);\n"
          "                    `tally keys` lists every key\n"
          "  --data PATH       train on PATH: a folder of images (class subfolders, or none\n"
          "                    with --set data.labels=none) or an IDX file, instead of the\n"
          "                    recipe's dataset (give data.test for the kNN monitor, or --no-knn)\n"
          "  --batch-size N    the global batch (same as --set train.batch_size=N)\n"
          "  --lr X            the peak learning rate (same as --set optim.lr=X)\n"
          "  --steps N         train N steps (same as --set train.steps=N)\n"
          "  --epochs N        train N epochs (same as --set train.epochs=N)\n"
          "  --budget AMOUNT   train for a compute budget (same as --set train.budget=...):\n"
          "                    time (420s, 7m, 1.5h: training only, evaluation excluded;\n"
          "                    the length is fixed from the speed of the first 6 steps),\n"
          "                    FLOPs over every replica (5e15flop, 5PFLOP: exact, from the\n"
          "                    first step's count) or epochs (3epochs); the schedules are\n"
          "                    those of a run of that length\n"
          "  --out DIR         run folder (default runs/NAME-YYYYmmdd-HHMMSS): receives\n"
          "                    config.ini, ledger.jsonl, ledger.csv, checkpoint.safetensors,\n"
          "                    eval.jsonl, and summary.json once the run has finished\n"
          "  --overwrite       replace the run a folder already holds (else refused)\n"
          "  --resume DIR      continue the run in DIR from its checkpoint, with its own\n"
          "                    configuration; --set may change only what cannot change the\n"
          "                    model, objective or data (train.steps, train.precision,\n"
          "                    train.log_every, train.checkpoint_every, eval.*, ...). A\n"
          "                    larger --steps lengthens the run: the schedules follow the new\n"
          "                    length from the step resumed\n"
          "  --stop-at S       end after step S as an interruption would: checkpoint, exit 0,\n"
          "                    no summary.json; --resume continues\n"
          "  --init FILE       start from the weights in FILE (a checkpoint, or an export with\n"
          "                    PyTorch names); every backbone tensor must be there\n"
          "  --knn-at-start    also report the kNN accuracy of the untrained encoder\n"
          "  --no-knn          skip the kNN monitor (benchmarks)\n"
          "  --quiet           no progress lines\n"
          "  --no-memory-check start even when the run's planned peak memory (tally plan) is\n"
          "                    more than this machine has (local backend; checked by default)\n"
          "\n"
          "Checkpoints: every train.checkpoint_every steps (default 50), at each epoch's end, at\n"
          "the end, and on SIGINT/SIGTERM/SIGHUP (the step under way finishes first; a second\n"
          "Ctrl-C a moment later stops at once).\n"
          "\n"
          "Exit codes: 0 success (or --stop-at, or a resumed run that had finished), 1 error\n"
          "(bad input, I/O), 2 usage or not available, 3 the loss became NaN or infinite (the\n"
          "last good checkpoint is kept), 130 stopped by SIGINT, 143 by SIGTERM, 129 by SIGHUP\n"
          "(checkpoint written; --resume continues).\n",
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

// "key=value" into out, or -1 (printed) when the value would not fit: a value cut short would
// be read as another number.
static int as_setting(char *out, size_t cap, const char *option, const char *key,
                      const char *value) {
  if (snprintf(out, cap, "%s=%s", key, value) < (int)cap) return 1;
  fprintf(stderr, "tally: %s '%.40s...': too long for a value of %s\n", option, value, key);
  return -1;
}

// Any option that chooses the configuration was given.
static int config_args_given(const ConfigArgs *a) {
  return a->config_path || a->n_sets || a->steps_set[0] || a->epochs_set[0] || a->budget_set[0] ||
         a->data_path || a->batch_set[0] || a->lr_set[0];
}

// Consumes argv[*i] if it is --config, --set, --steps or --epochs. Returns 1 if consumed, 0 if
// not, -1 on error (printed).
static int config_arg(int argc, char **argv, int *i, ConfigArgs *a) {
  const char *v;
  if ((v = option_value(argc, argv, i, "--config"))) {
    a->config_path = v;
  } else if ((v = option_value(argc, argv, i, "--set"))) {
    if (a->n_sets == 256) {
      fprintf(stderr, "tally: too many --set options\n");
      return -1;
    }
    a->sets[a->n_sets++] = v;
  } else if ((v = option_value(argc, argv, i, "--steps"))) {
    return as_setting(a->steps_set, sizeof a->steps_set, "--steps", "train.steps", v);
  } else if ((v = option_value(argc, argv, i, "--epochs"))) {
    return as_setting(a->epochs_set, sizeof a->epochs_set, "--epochs", "train.epochs", v);
  } else if ((v = option_value(argc, argv, i, "--budget"))) {
    return as_setting(a->budget_set, sizeof a->budget_set, "--budget", "train.budget", v);
  } else if ((v = option_value(argc, argv, i, "--batch-size"))) {
    return as_setting(a->batch_set, sizeof a->batch_set, "--batch-size", "train.batch_size", v);
  } else if ((v = option_value(argc, argv, i, "--lr"))) {
    return as_setting(a->lr_set, sizeof a->lr_set, "--lr", "optim.lr", v);
  } else if ((v = option_value(argc, argv, i, "--data"))) {
    a->data_path = v;
  } else {
    return 0;
  }
  return 1;
}

// A whole number >= 1 from an option's text; 2 (usage) with a message otherwise.
static int parse_count(const char *option, const char *text, long *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || *end || v < 1 || errno) {
    fprintf(stderr, "tally: %s '%s': expected a whole number of at least 1\n", option, text);
    return 2;
  }
  *out = v;
  return 0;
}

// One option of a command: a value option keeps its text in *text (the last one given), or in
// *count as a whole number >= 1; a flag sets *flag to 1. `given`, when set, receives the
// option's name: which of a group came last.
typedef struct {
  const char *name;
  const char **text;
  long *count;
  int *flag;
  const char **given;
} Option;

// How a command reads its arguments: its option table, and `more` for what the table cannot say
// (operands, options shared by several commands, options checked as they come). `more` returns 1
// when argv[*i] (with its value) was its own, 0 when not, -1 on an error it printed.
typedef struct {
  const char *command;    // for messages: "tally COMMAND: ..."
  void (*usage)(FILE *);  // printed to stdout for -h or --help
  const Option *options;  // ended by a row without a name
  int (*more)(int argc, char **argv, int *i, void *ctx);
  void *ctx;
  const char *refusal;  // what an argument nothing takes is called: "unknown option", "unexpected"
} CommandLine;

// Walks a command's arguments: each is -h/--help, a row of its table, or one that `more` takes.
// Returns 0 when all were taken, 1 when the usage was printed for --help, 2 on a usage error
// (printed).
static int parse_options(const CommandLine *cl, int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      cl->usage(stdout);
      return 1;
    }
    const Option *o = cl->options;
    const char *v = NULL;
    while (o->name && !(o->flag ? !strcmp(argv[i], o->name)
                                : (v = option_value(argc, argv, &i, o->name)) != NULL))
      o++;
    if (o->name) {
      if (o->flag)
        *o->flag = 1;
      else if (o->count && parse_count(o->name, v, o->count))
        return 2;
      else if (o->text)
        *o->text = v;
      if (o->given) *o->given = o->name;
      continue;
    }
    int used = cl->more ? cl->more(argc, argv, &i, cl->ctx) : 0;
    if (used < 0) return 2;
    if (!used) {
      fprintf(stderr, "tally %s: %s '%s' (see tally %s --help)\n", cl->command, cl->refusal,
              argv[i], cl->command);
      return 2;
    }
  }
  return 0;
}

// The one operand of a command (a run folder, a checkpoint): the first argument not starting
// with '-' (parse_options' `more`, with a const char ** that is NULL until then).
static int one_operand(int argc, char **argv, int *i, void *operand) {
  (void)argc;
  const char **src = operand;
  if (argv[*i][0] == '-' || *src) return 0;
  *src = argv[*i];
  return 1;
}

// The configuration options (config_arg) as parse_options' `more`.
static int more_config(int argc, char **argv, int *i, void *config_args) {
  return config_arg(argc, argv, i, config_args);
}

// 0 if `objective` names an objective; otherwise prints why and returns 2.
static int check_objective(const char *objective) {
  const ObjectiveDef *def = objective_find(objective);
  if (!def) {
    fprintf(stderr, "tally: unknown objective '%s' (choose one of: %s)\n", objective,
            objective_names());
    return 2;
  }
  return 0;
}

// The configuration `tally train --objective=NAME` runs with these options, validated. Prints
// the error and returns 1 on failure.
static int load_config(const char *objective, const ConfigArgs *a, Config *cfg) {
  if (run_config_load(objective, a, cfg) == 0) return 0;
  fprintf(stderr, "tally: %s\n", tl_last_error());
  return 1;
}

// Without --objective, a recipe names its objective by its own section: configs/byol.ini sets
// [byol] keys, so `--config configs/byol.ini` trains byol, not the default. Several objectives'
// sections and no --objective is an error (exit 2); with one, sections of other objectives get a
// note, since nothing reads them. `*objective` is left NULL (the default) when nothing names one.
static int recipe_objective(const char *command, const ConfigArgs *a, const char **objective) {
  enum { MAX_NAMED = 8 };
  const char *named[MAX_NAMED];
  if (!a->config_path && a->n_sets == 0) return 0;
  Config *cfg = malloc(sizeof *cfg);
  if (!cfg) TL_DIE("out of memory");
  int rc = load_config(*objective ? *objective : "inbatch", a, cfg);
  const int n = rc ? 0 : config_objectives_set(cfg, named, MAX_NAMED);
  free(cfg);
  if (rc) return 1;
  if (!*objective && n == 1) *objective = named[0];
  if (!*objective && n > 1) {
    fprintf(stderr,
            "tally %s: the configuration sets [%s] and [%s]: say which objective with "
            "--objective\n",
            command, named[0], named[1]);
    return 2;
  }
  for (int i = 0; i < n && i < MAX_NAMED; i++)
    if (*objective && strcmp(named[i], *objective) != 0)
      fprintf(stderr,
              "tally %s: note: the configuration sets [%s], which objective %s does not "
              "read\n",
              command, named[i], *objective);
  return 0;
}

static int cmd_train(int argc, char **argv) {
  // A reader of the progress lines that goes away (`tally train | head`) must not end the run,
  // from its first line on.
  signal(SIGPIPE, SIG_IGN);
  const char *objective = NULL, *out_dir = NULL, *resume_dir = NULL;
  ConfigArgs ca = {0};
  TrainOptions opt = {0};
  int no_memory_check = 0;
  const Option opts[] = {{.name = "--objective", .text = &objective},
                         {.name = "--out", .text = &out_dir},
                         {.name = "--resume", .text = &resume_dir},
                         {.name = "--init", .text = &opt.init_path},
                         {.name = "--stop-at", .count = &opt.stop_at},
                         {.name = "--overwrite", .flag = &opt.overwrite},
                         {.name = "--knn-at-start", .flag = &opt.knn_at_start},
                         {.name = "--quiet", .flag = &opt.quiet},
                         {.name = "--no-knn", .flag = &opt.no_knn},
                         {.name = "--no-memory-check", .flag = &no_memory_check},
                         {.name = NULL}};
  const CommandLine cl = {"train", usage_train, opts, more_config, &ca, "unknown option"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  if (opt.knn_at_start && opt.no_knn) {
    fprintf(stderr,
            "tally: --knn-at-start evaluates with the kNN monitor, which --no-knn turns off\n");
    return 2;
  }
  static Config cfg;
  static char resumed_objective[64], ckpt_path[4200];
  if (resume_dir) {
    if (out_dir && strcmp(out_dir, resume_dir) != 0) {
      fprintf(stderr, "tally: --resume continues the run in its own folder; drop --out\n");
      return 2;
    }
    if (opt.init_path || opt.overwrite) {
      fprintf(stderr, "tally: --resume cannot be combined with --%s\n",
              opt.init_path ? "init" : "overwrite");
      return 2;
    }
    if (ca.config_path || ca.budget_set[0] || ca.data_path || ca.batch_set[0] || ca.lr_set[0]) {
      fprintf(stderr, "tally: --resume takes the run's own configuration and length; drop %s\n",
              ca.config_path    ? "--config"
              : ca.data_path    ? "--data"
              : ca.batch_set[0] ? "--batch-size"
              : ca.lr_set[0]    ? "--lr"
                                : "--budget (--steps N lengthens a run)");
      return 2;
    }
    rc = run_config_resume(resume_dir, &ca, &cfg, resumed_objective, sizeof resumed_objective,
                           ckpt_path, sizeof ckpt_path, &opt);
    if (rc) {
      fprintf(stderr, "tally: %s\n", tl_last_error());
      return rc;
    }
    if (objective && strcmp(objective, resumed_objective) != 0) {
      fprintf(stderr, "tally: %s was trained with --objective=%s, not %s\n", resume_dir,
              resumed_objective, objective);
      return 2;
    }
    objective = resumed_objective;
    out_dir = resume_dir;
    opt.resume_path = ckpt_path;
  }
  if (!resume_dir && objective && (rc = check_objective(objective))) return rc;
  if (!resume_dir && (rc = recipe_objective("train", &ca, &objective))) return rc;
  if (!objective) objective = "inbatch";
  if ((rc = check_objective(objective))) return rc;
  if (!resume_dir && load_config(objective, &ca, &cfg) != 0) return 1;

  char default_out[128];
  if (!out_dir) {
    run_default_folder(objective, default_out, sizeof default_out);
    out_dir = default_out;
  }
  opt.objective = objective;
  opt.out_dir = out_dir;
  if (!run_fits_in_memory(&cfg, objective, &opt, !no_memory_check) ||
      !run_budget_fits_steps(&cfg, objective, &opt)) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 1;
  }
  return train_run(&cfg, &opt);
}

static void usage_plan(FILE *f) {
  fprintf(f,
          "usage: tally plan [--objective=NAME[,NAME...]] [--config FILE] [--set S.K=V]...\n"
          "                  [--steps N] [--epochs N] [--step S] [--json]\n"
          "                  [--memory-budget SIZE] [--no-knn] [--knn-at-start] [--time]\n"
          "\n"
          "Prints the ledger a training run will write, before it runs: the real models are\n"
          "built with oneDNN in dry-run mode (nothing computed, memory never touched) and one\n"
          "step runs on a stand-in batch, so every counted field equals what `tally train`\n"
          "measures with the same options. Time, loss and drift are `measured only`.\n"
          "\n"
          "  --objective=A,B   one column per objective (default inbatch): %s\n"
          "  --config FILE     one recipe for every column (same data and backbone); without\n"
          "                    it each objective uses configs/NAME.ini, as `tally train` does\n"
          "  --set, --steps, --epochs, --data, --batch-size, --lr\n"
          "                as for `tally train` (applied to every column)\n"
          "  --step S          the 0-based step to plan (default: the run's last step); moco's\n"
          "                    queue fills with the global batch's keys every step\n"
          "  --json            one JSON object per objective, with ledger.jsonl's field names\n"
          "                    (measured-only fields null) plus planned_* totals\n"
          "  --memory-budget SIZE  the largest batch (inbatch, mae) or queue_size (moco) whose\n"
          "                    planned peak fits SIZE (2GiB, 512MiB, 3GB, bytes), searched\n"
          "                    for over plans; prints the plan that proves it\n"
          "  --no-knn, --knn-at-start   plan a run started with these train options\n"
          "  --time            also time 5 real steps of each column on this machine (one\n"
          "                    replica, random views of the run's sizes, after one step that\n"
          "                    creates the primitives): the median ms a step and the whole\n"
          "                    run's time (its steps x that; training without the kNN monitor)\n"
          "\n"
          "Scaling past one machine (one replica per node):\n"
          "  --from RUN --nodes N[,N...] --link RATE [--mtu BYTES] [--latency T]\n"
          "  [--allreduce ALG] [--keep-replica-batch]\n"
          "                    predicted step time and images/s at N nodes on a link of RATE\n"
          "                    (10Gbit, 100Mbit, 125MB/s). Compute per replica is RUN's step\n"
          "                    outside its collectives (scaled by the samples a node holds);\n"
          "                    a RUN of several replicas adds their waiting for the slower one\n"
          "                    (its comm_ms). Communication comes from the step's own bytes and\n"
          "                    collective calls, each waiting T per round of its algorithm\n"
          "                    (default 50us, TCP through one switch): the gradient is summed\n"
          "                    in buckets while backward runs, each starting once backward has\n"
          "                    produced it, one after another on the link; other sums take\n"
          "                    log2 N rounds, a gather its counts (log2 N) and N-1 blocks. The\n"
          "                    global batch is split over the nodes unless --keep-replica-batch.\n"
          "  --mtu BYTES       the link's MTU (default 1500): TCP over Ethernet carries\n"
          "                    (MTU-52)/(MTU+38) of RATE as payload, 94.1%% at 1500, 99.0%% at\n"
          "                    9000; 0 when RATE is already the payload rate (e.g. iperf's)\n"
          "  --allreduce ALG   the gradient buckets' algorithm: ring (2(N-1)/N of the bytes,\n"
          "                    2(N-1) rounds; Open MPI with --mca\n"
          "                    coll_libnbc_iallreduce_algorithm 1), binomial (reduce then\n"
          "                    broadcast: 2 log2 N times the bytes in turn, 2 log2 N rounds), or\n"
          "                    auto (default): Open MPI 4.1's own choice for an in-place\n"
          "                    non-blocking sum, binomial at every N\n"
          "  --json            with --from, one object per node count: nodes, link_bytes_per_s,\n"
          "                    mtu, payload_bytes_per_s, latency_s, allreduce,\n"
          "                    predicted_compute_ms, predicted_wait_ms,\n"
          "                    predicted_link_ms (on the link, hidden or not),\n"
          "                    predicted_comm_ms (inside collectives, as the ledger's comm_ms),\n"
          "                    predicted_step_ms, predicted_step_ms_no_overlap,\n"
          "                    predicted_images_per_s\n",
          objective_names());
}

// tally plan --from takes the measured run's configuration: an option that chooses another
// would be ignored. Returns the first such option given, or NULL.
static const char *unused_by_scaling(const ConfigArgs *ca, const char *objective_given,
                                     const char *budget_text, const char *step_text,
                                     const PlanRequest *req) {
  return config_args_given(ca)       ? "--config, --set, --steps, --epochs or --budget"
         : objective_given           ? "--objective"
         : budget_text               ? "--memory-budget"
         : step_text                 ? "--step"
         : req->options.no_knn       ? "--no-knn"
         : req->options.knn_at_start ? "--knn-at-start"
         : req->timed                ? "--time"
                                     : NULL;
}

enum { MAX_COLUMNS = 8 };  // objectives side by side in one plan

// The comma-separated objectives of `tally plan --objective`, split in place, each checked.
static int split_objectives(char *list, const char *names[MAX_COLUMNS], int *n) {
  *n = 0;
  for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (*n == MAX_COLUMNS) {
      fprintf(stderr, "tally: at most %d objectives side by side\n", MAX_COLUMNS);
      return 2;
    }
    int rc = check_objective(tok);
    if (rc) return rc;
    names[(*n)++] = tok;
  }
  return *n == 0 ? check_objective("") : 0;
}

static int cmd_plan(int argc, char **argv) {
  const char *objectives = "inbatch", *objective_given = NULL, *budget_text = NULL,
             *step_text = NULL;
  // 50 us: Open MPI over TCP through one Ethernet switch delivers a small message in tens of us.
  const char *from = NULL, *nodes = NULL, *link = NULL, *latency = "50us", *allreduce = "auto",
             *mtu = "1500";
  const char *scaling_option = NULL;  // one that only a prediction from a run takes
  ConfigArgs ca = {0};
  PlanRequest req = {.step = PLAN_LAST_STEP};
  int keep_replica_batch = 0;
  const Option opts[] = {
      {.name = "--objective", .text = &objectives, .given = &objective_given},
      {.name = "--memory-budget", .text = &budget_text},
      {.name = "--step", .text = &step_text},
      {.name = "--from", .text = &from},
      {.name = "--nodes", .text = &nodes},
      {.name = "--link", .text = &link},
      {.name = "--latency", .text = &latency, .given = &scaling_option},
      {.name = "--mtu", .text = &mtu, .given = &scaling_option},
      {.name = "--allreduce", .text = &allreduce, .given = &scaling_option},
      {.name = "--keep-replica-batch", .flag = &keep_replica_batch, .given = &scaling_option},
      {.name = "--time", .flag = &req.timed},
      {.name = "--json", .flag = &req.json},
      {.name = "--no-knn", .flag = &req.options.no_knn},
      {.name = "--knn-at-start", .flag = &req.options.knn_at_start},
      {.name = NULL}};
  const CommandLine cl = {"plan", usage_plan, opts, more_config, &ca, "unknown option"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  if (from || nodes || link) {
    if (!from || !nodes || !link) {
      fprintf(stderr, "tally plan: --from RUN, --nodes N[,N...] and --link RATE go together\n");
      return 2;
    }
    const char *unused = unused_by_scaling(&ca, objective_given, budget_text, step_text, &req);
    if (unused) {
      fprintf(stderr,
              "tally plan: --from RUN predicts from that run's own configuration; drop %s\n",
              unused);
      return 2;
    }
    const ScalingRequest sr = {.run_dir = from,
                               .nodes = nodes,
                               .link = link,
                               .mtu = mtu,
                               .latency = latency,
                               .allreduce = allreduce,
                               .keep_replica_batch = keep_replica_batch,
                               .json = req.json};
    if ((rc = plan_scaling_print(stdout, &sr))) fprintf(stderr, "tally: %s\n", tl_last_error());
    return rc;
  }
  if (scaling_option) {
    fprintf(stderr, "tally plan: %s goes with --from RUN --nodes N --link RATE\n", scaling_option);
    return 2;
  }
  req.fit_budget = budget_text != NULL;
  if (budget_text && plan_parse_size(budget_text, &req.budget_bytes) != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 2;
  }
  if (step_text) {
    char *end;
    req.step = strtol(step_text, &end, 10);
    if (end == step_text || *end || req.step < 0) {
      fprintf(stderr, "tally: --step '%s': expected a step number (0, 1, ...)\n", step_text);
      return 2;
    }
  }

  if (!objective_given) {
    const char *named = NULL;
    if ((rc = recipe_objective("plan", &ca, &named))) return rc;
    if (named) objectives = named;
  }
  char names_buf[256];
  snprintf(names_buf, sizeof names_buf, "%s", objectives);
  const char *names[MAX_COLUMNS];
  int n = 0;
  if ((rc = split_objectives(names_buf, names, &n))) return rc;

  static Config cfgs[MAX_COLUMNS];
  LedgerRecord recs[MAX_COLUMNS];
  PlanTotals totals[MAX_COLUMNS];
  for (int j = 0; j < n; j++) {
    if (load_config(names[j], &ca, &cfgs[j]) != 0) return 1;
    if (plan_column(stdout, &cfgs[j], names[j], &req, &recs[j], &totals[j]) != 0) {
      fprintf(stderr, "tally: %s: %s\n", names[j], tl_last_error());
      return 1;
    }
  }
  plan_print_columns(stdout, n, names, recs, totals, req.json);
  return 0;
}

static void usage_report(FILE *f) {
  fprintf(f,
          "usage: tally report RUN_DIR [RUN_DIR...] [--out FILE]\n"
          "\n"
          "Writes one self-contained HTML page (inline SVG; no network, scripts or fonts) from\n"
          "run folders: loss, kNN accuracy, images/s and memory by category over the steps,\n"
          "and with several runs a side-by-side table of what a step of each costs.\n"
          "\n"
          "  --out FILE   where to write it (default RUN_DIR/report.html of the first run)\n");
}

// The run folders of `tally report`: every argument that is not an option ("-" included).
typedef struct {
  const char **dirs;
  int n;
} RunDirs;

static int run_dir_operand(int argc, char **argv, int *i, void *run_dirs) {
  (void)argc;
  RunDirs *d = run_dirs;
  if (argv[*i][0] == '-' && argv[*i][1]) return 0;
  d->dirs[d->n++] = argv[*i];
  return 1;
}

static int cmd_report(int argc, char **argv) {
  const char *out = NULL;
  RunDirs d = {.dirs = calloc((size_t)argc + 1, sizeof *d.dirs)};
  if (!d.dirs) return 1;
  const Option opts[] = {{.name = "--out", .text = &out}, {.name = NULL}};
  const CommandLine cl = {"report", usage_report, opts, run_dir_operand, &d, "unknown option"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) {
    free(d.dirs);
    return rc == 1 ? 0 : rc;
  }
  const char **dirs = d.dirs;
  const int n = d.n;
  if (n == 0) {
    fprintf(stderr, "tally report: name at least one run folder (see tally report --help)\n");
    rc = 2;
  }
  char default_out[4200];
  if (rc == 0 && !out) {
    report_default_path(dirs[0], default_out, sizeof default_out);
    out = default_out;
  }
  if (rc == 0 && report_write(n, dirs, out, objective_ledger_fields) != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    rc = 1;
  }
  if (rc == 0) printf("report written to %s\n", out);
  free(dirs);
  return rc;
}

static void usage_export(FILE *f) {
  fprintf(f,
          "usage: tally export RUN_DIR|CHECKPOINT [--out FILE] [--with-head]\n"
          "\n"
          "Writes the trained encoder as safetensors with PyTorch's names and layouts\n"
          "(Conv2d weights (O, I, kh, kw), BatchNorm running_mean/running_var/\n"
          "num_batches_tracked, ...), loadable with load_state_dict(strict=True) into the\n"
          "module tree docs/reference.md shows. The metadata carries the configuration and the\n"
          "input normalization (input_mean, input_std).\n"
          "\n"
          "  --out FILE    default RUN_DIR/encoder.safetensors\n"
          "  --with-head   also the projection head (inbatch, moco) or MAE's decoder\n");
}

static int cmd_export(int argc, char **argv) {
  const char *src = NULL, *out = NULL;
  int with_head = 0;
  const Option opts[] = {
      {.name = "--out", .text = &out}, {.name = "--with-head", .flag = &with_head}, {.name = NULL}};
  const CommandLine cl = {"export", usage_export, opts, one_operand, &src, "unexpected"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  if (!src) {
    fprintf(stderr, "tally export: name a run folder or checkpoint (see tally export --help)\n");
    return 2;
  }
  char ckpt[4200], default_out[4200];
  checkpoint_path_of(src, ckpt, sizeof ckpt);
  if (!out) {
    export_default_path(ckpt, default_out, sizeof default_out);
    out = default_out;
  }
  if (output_path_check(out) != 0 || export_checkpoint(ckpt, out, with_head) != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 1;
  }
  printf("encoder%s written to %s\n", with_head ? " and head" : "", out);
  return 0;
}

static void usage_embed(FILE *f) {
  fprintf(f,
          "usage: tally embed RUN_DIR|FILE --data PATH [--out FILE.npy] [--limit N]\n"
          "\n"
          "Writes the encoder's features of every image in PATH (an IDX images file, an\n"
          "ImageFolder root with class subfolders, or a folder of images) as an (N, D)\n"
          "float32 .npy, with the evaluation transform the encoder was trained with, and\n"
          "the labels beside it as FILE.labels.npy (int64) when PATH has them, and which\n"
          "image each row is in FILE.rows.txt (its file, or IDX_FILE:INDEX), one line a row.\n"
          "FILE is a checkpoint or an export.\n"
          "\n"
          "  --out FILE.npy   default embeddings.npy\n"
          "  --limit N        N images: for class folders, each class's first files in\n"
          "                   turn (as data.limit), so every class is sampled\n");
}

static int cmd_embed(int argc, char **argv) {
  const char *src = NULL, *data = NULL, *out = "embeddings.npy";
  long limit = 0;
  const Option opts[] = {{.name = "--out", .text = &out},
                         {.name = "--data", .text = &data},
                         {.name = "--limit", .count = &limit},
                         {.name = NULL}};
  const CommandLine cl = {"embed", usage_embed, opts, one_operand, &src, "unexpected"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  if (limit > INT_MAX) return 2;
  if (!src || !data) {
    fprintf(stderr, "tally embed: name the encoder and --data (see tally embed --help)\n");
    return 2;
  }
  if (embed_write(src, data, (int)limit, out) != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 1;
  }
  return 0;
}

static void usage_eval(FILE *f) {
  fprintf(f,
          "usage: tally eval RUN_DIR|FILE [--knn] [--linear] [--no-baseline] [--json]\n"
          "                  [--set S.K=V]...\n"
          "\n"
          "Scores a trained encoder (a run folder, a checkpoint or an export) on the labeled\n"
          "training and test sets its configuration names ([eval] train, test when given,\n"
          "else [data] train, test):\n"
          "  kNN        cosine, temperature-weighted votes, k = eval.knn_k (200; at most a\n"
          "             tenth of the smallest class's training images, but not below 20 or\n"
          "             the class) and 20, memory bank = the training set\n"
          "  linear     multinomial logistic regression on frozen, standardized features,\n"
          "             L-BFGS to convergence, L2 strength chosen on a tenth of the training\n"
          "             set held out, then refitted on all of it\n"
          "each next to the same measure on raw pixels. Without --knn or --linear, both.\n"
          "Each result is printed as soon as it is known, then the table. Given a run folder,\n"
          "the result is also appended to its eval.jsonl, marked \"source\":\"tally eval\", for\n"
          "tally report (not while a training run holds the folder: then it says so).\n"
          "\n"
          "  --no-baseline  skip the raw-pixel measures (at photo sizes the pixels are many\n"
          "               features: the baseline can take longer than the encoder's)\n"
          "  --set S.K=V  evaluate elsewhere: data.train, data.test, data.format, data.limit,\n"
          "               data.test_limit, data.stream, data.labels, eval.train, eval.test,\n"
          "               eval.knn_k, eval.knn_temperature, eval.batch_size (images a forward\n"
          "               pass encodes: its activations are most of the memory at large image\n"
          "               sizes). A run whose monitor had a labeled set of its own (eval.train,\n"
          "               eval.test) is scored on it, unless data.train or data.test is set.\n"
          "               A run of unlabeled images (data.labels = none) is scored without\n"
          "               labels; a data.train given here is labeled by its class subfolders\n"
          "               (data.labels = auto) unless --set data.labels=none says otherwise\n"
          "  --json       one JSON object: knn_k, knn_top1 (k = knn_k), knn_top1_k20,\n"
          "               linear_top1, knn_top1_raw_pixels, linear_top1_raw_pixels,\n"
          "               rankme, embedding_std, n_train, n_test, seconds, ...\n"
          "\n"
          "Also, needing no labels: rankme, the effective rank of the training set's\n"
          "embeddings (exp of the entropy of their normalized singular values), and\n"
          "embedding_std, the spread of the L2-normalized embeddings per dimension (1/sqrt(d)\n"
          "when spread evenly; a collapsed encoder reads near 0).\n");
}

static int eval_may_set(const char *assignment) {
  static const char *const allowed[] = {
      "data.train=",           "data.test=",       "data.format=", "data.limit=",
      "data.test_limit=",      "data.stream=",     "data.labels=", "eval.knn_k=",
      "eval.knn_temperature=", "eval.batch_size=", "eval.train=",  "eval.test="};
  for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++)
    if (strncmp(assignment, allowed[i], strlen(allowed[i])) == 0) return 1;
  return 0;
}

// What `tally eval` takes beyond its option table: the encoder, and --set checked as it comes.
typedef struct {
  const char *src;
  // Three first: data.train or data.test given here replaces the run's own evaluation set, and
  // a data.train given here is labeled by its subfolders unless data.labels says otherwise.
  const char *sets[259];
  int n_sets, data_set, data_train_set;
} EvalArgs;

static int eval_arg(int argc, char **argv, int *i, void *eval_args) {
  EvalArgs *a = eval_args;
  const char *v = option_value(argc, argv, i, "--set");
  if (!v) return one_operand(argc, argv, i, &a->src);
  if (!eval_may_set(v)) {
    fprintf(stderr,
            "tally eval: --set %s: only data.* paths, limits and stream, eval.knn_* and "
            "eval.batch_size can change (see tally eval --help)\n",
            v);
    return -1;
  }
  if (a->n_sets == 259) return -1;
  a->sets[a->n_sets++] = v;
  a->data_train_set |= !strncmp(v, "data.train=", 11);
  a->data_set |= !strncmp(v, "data.train=", 11) || !strncmp(v, "data.test=", 10);
  return 1;
}

static int cmd_eval(int argc, char **argv) {
  EvalArgs a = {.sets = {"data.labels=auto", "eval.train=", "eval.test="}, .n_sets = 3};
  int json = 0, no_baseline = 0;
  EvalOptions opt = {0};
  const Option opts[] = {{.name = "--knn", .flag = &opt.knn},
                         {.name = "--no-baseline", .flag = &no_baseline},
                         {.name = "--linear", .flag = &opt.linear},
                         {.name = "--json", .flag = &json},
                         {.name = NULL}};
  const CommandLine cl = {"eval", usage_eval, opts, eval_arg, &a, "unexpected"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  const char *src = a.src, **sets = a.sets;
  const int first_set = a.data_train_set ? 0 : a.data_set ? 1 : 3;
  if (!src) {
    fprintf(stderr, "tally eval: name a run folder, checkpoint or export (see --help)\n");
    return 2;
  }
  if (!opt.knn && !opt.linear) opt.knn = opt.linear = 1;
  opt.baseline = !no_baseline;
  opt.quiet = json;
  static FeatureEncoder enc;
  if (feature_encoder_open(&enc, src, sets + first_set, a.n_sets - first_set) != 0) {
    fprintf(stderr, "tally: %s\n", tl_last_error());
    return 1;
  }
  EvalResult r;
  rc = evaluate_encoder(&enc, &opt, &r);
  if (rc == 0)
    evaluate_print(stdout, &enc, &r, json);
  else
    fprintf(stderr, "tally: %s\n", tl_last_error());
  // A run folder keeps the result beside its monitor's, for tally report. A training run that
  // holds the folder takes nothing from what was printed; a write that fails (a full disk, a
  // read-only folder) fails the command.
  struct stat st;
  if (rc == 0 && stat(src, &st) == 0 && S_ISDIR(st.st_mode)) {
    const int recorded = evaluate_record(src, enc.step, &r);
    if (recorded != 0)
      fprintf(stderr, "tally eval: not recorded in %s/eval.jsonl: %s\n", src, tl_last_error());
    else if (!json)
      printf("recorded in %s/eval.jsonl (after step %ld)\n", src, enc.step);
    if (recorded < 0) rc = 1;
  }
  feature_encoder_close(&enc);
  return rc ? 1 : 0;
}

static void usage_compare(FILE *f) {
  fprintf(f,
          "usage: tally compare --objectives A,B[,...] --budget AMOUNT[,AMOUNT...] --out DIR\n"
          "                     [--seeds N] [--config-dir DIR | --config [NAME=]FILE ...]\n"
          "                     [--set S.K=V]... [--data PATH] [--batch-size N] [--lr X]\n"
          "                     [--quiet] [--no-memory-check]\n"
          "\n"
          "Trains every (objective, budget, seed) one after another, each in its own run\n"
          "folder DIR/OBJECTIVE-BUDGET-seedS, scores each with `tally eval` (kNN and the\n"
          "linear probe when the data has labels; rankme and embedding_std always), and\n"
          "writes DIR/compare.json (per objective and budget: each measure's mean, 95%%\n"
          "interval, n and per-seed values; FLOPs, seconds, peak RSS; the ledger's per-step\n"
          "answers) and DIR/compare.html (accuracy against FLOPs, seconds and memory, with\n"
          "error bars, the Pareto front and the raw-pixel baselines), then prints a verdict.\n"
          "Everything is planned first (`tally plan`): steps, FLOPs, memory and whether it\n"
          "fits, and the time it will take as far as it can be told.\n"
          "\n"
          "  --objectives A,B  objectives to compare: %s\n"
          "  --budget LIST     each run's length, as `tally train --budget`: 7m, 2PFLOP, 3epochs;\n"
          "                    several, comma-separated, compare at each (at most %d)\n"
          "  --seeds N         seeds per objective and budget (default 3, at most %d): seed s\n"
          "                    trains with train.seed + s. The intervals need N >= 2\n"
          "  --config-dir DIR  each objective's recipe is DIR/NAME.ini (default configs/NAME.ini;\n"
          "                    configs/photos/NAME.ini when --data names a folder of images)\n"
          "  --config NAME=FILE  NAME's recipe is FILE (repeatable); --config FILE: one recipe\n"
          "                    for every objective (one backbone and dataset)\n"
          "  --set, --data, --batch-size, --lr   shared by every run, as for `tally train`\n"
          "  --out DIR         the compare's folder (required): the same command again\n"
          "                    continues a compare that stopped, skipping finished runs and\n"
          "                    resuming the one under way from its checkpoint; only\n"
          "                    --seeds may differ (more seeds add runs, fewer summarize)\n"
          "  --quiet           no progress lines from the trainings\n"
          "  --no-memory-check start runs whose planned peak exceeds this machine's memory\n"
          "\n"
          "The trainings run without the kNN monitor (each run is scored once, afterwards).\n"
          "Exit codes: 0 compare.json written; 1 a plan, run or evaluation failed (it is\n"
          "named; no compare.json); 2 usage, or DIR holds a compare of other settings; 3 a\n"
          "run's loss became NaN; 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP (the run\n"
          "under way keeps its checkpoint: the same command continues).\n",
          objective_names(), COMPARE_MAX_BUDGETS, COMPARE_MAX_SEEDS);
}

// Splits a comma-separated list in place into at most `max` items. -1 when there are more or none.
static int split_list(char *text, const char **items, int max) {
  int n = 0;
  for (char *save, *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) return -1;
    items[n++] = tok;
  }
  return n ? n : -1;
}

// What `tally compare` takes beyond its option table.
typedef struct {
  CompareSpec *spec;
  ConfigArgs ca;
  const char *all_config;                                        // --config FILE
  const char *per_objective_config[COMPARE_MAX_OBJECTIVES * 2];  // --config NAME=FILE
  int n_per_objective;
} CompareArgs;

// --config [NAME=]FILE, and --set, --data, --batch-size, --lr: kept as given, for every run's
// `tally train` (parse_options' `more`).
static int compare_arg(int argc, char **argv, int *i, void *compare_args) {
  CompareArgs *a = compare_args;
  CompareSpec *spec = a->spec;
  const char *v;
  if ((v = option_value(argc, argv, i, "--config"))) {
    if (!strchr(v, '='))
      a->all_config = v;
    else if (a->n_per_objective == COMPARE_MAX_OBJECTIVES * 2)
      return fprintf(stderr, "tally compare: too many --config options\n"), -1;
    else
      a->per_objective_config[a->n_per_objective++] = v;
    return 1;
  }
  const int first = *i;
  int used = config_arg(argc, argv, i, &a->ca);
  if (used <= 0) return used;
  if (a->ca.steps_set[0] || a->ca.epochs_set[0]) {
    fprintf(stderr,
            "tally compare: the budget is the runs' length; drop '%s' (see tally compare "
            "--help)\n",
            argv[first]);
    return -1;
  }
  for (int j = first; j <= *i; j++) {
    if (spec->n_shared_args == COMPARE_MAX_ARGS)
      return fprintf(stderr, "tally compare: too many options\n"), -1;
    spec->shared_args[spec->n_shared_args++] = argv[j];
  }
  return 1;
}

// Each objective at each budget as `tally train` will resolve it: the plan is of these.
static int load_compare_configs(CompareSpec *spec, const ConfigArgs *ca) {
  static Config configs[COMPARE_MAX_OBJECTIVES][COMPARE_MAX_BUDGETS];
  for (int o = 0; o < spec->n_objectives; o++)
    for (int b = 0; b < spec->n_budgets; b++) {
      ConfigArgs run = *ca;
      run.config_path = spec->config_paths[o];
      if (as_setting(run.budget_set, sizeof run.budget_set, "--budget", "train.budget",
                     spec->budgets[b]) < 0)
        return 2;
      if (run.config_path && access(run.config_path, R_OK) != 0) {
        fprintf(stderr, "tally compare: %s's recipe %s: %s\n", spec->objectives[o], run.config_path,
                strerror(errno));
        return 1;
      }
      if (load_config(spec->objectives[o], &run, &configs[o][b]) != 0) return 1;
      spec->configs[o][b] = &configs[o][b];
    }
  return 0;
}

static int cmd_compare(int argc, char **argv) {
  static CompareSpec spec;
  static CompareArgs args = {.spec = &spec};
  static char objectives_text[512], budgets_text[512];
  const char *objectives = NULL, *budgets = NULL, *config_dir = NULL;
  long seeds = 3;
  const Option opts[] = {{.name = "--objectives", .text = &objectives},
                         {.name = "--budget", .text = &budgets},
                         {.name = "--seeds", .count = &seeds},
                         {.name = "--config-dir", .text = &config_dir},
                         {.name = "--out", .text = &spec.out_dir},
                         {.name = "--quiet", .flag = &spec.quiet},
                         {.name = "--no-memory-check", .flag = &spec.no_memory_check},
                         {.name = NULL}};
  const CommandLine cl = {"compare", usage_compare, opts, compare_arg, &args, "unknown option"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  if (!objectives || !budgets || !spec.out_dir) {
    fprintf(stderr, "tally compare: name --objectives, --budget and --out (see --help)\n");
    return 2;
  }
  if (seeds > COMPARE_MAX_SEEDS) {
    fprintf(stderr, "tally compare: --seeds %ld: at most %d\n", seeds, COMPARE_MAX_SEEDS);
    return 2;
  }
  if ((config_dir != NULL) + (args.all_config != NULL) + (args.n_per_objective > 0) > 1) {
    fprintf(stderr, "tally compare: give --config-dir, --config FILE or --config NAME=FILE\n");
    return 2;
  }
  // A folder of images as --data and no recipe named: each objective's photo recipe (64x64 RGB,
  // unlabeled), not its Fashion-MNIST one (28x28 grayscale).
  struct stat st;
  if (!config_dir && !args.all_config && !args.n_per_objective && args.ca.data_path &&
      stat(args.ca.data_path, &st) == 0 && S_ISDIR(st.st_mode)) {
    config_dir = "configs/photos";
    if (!spec.quiet)
      printf(
          "tally compare: --data %s is a folder of images: each objective trains with its photo "
          "recipe, configs/photos/NAME.ini\n",
          args.ca.data_path);
  }
  spec.n_seeds = (int)seeds;
  snprintf(objectives_text, sizeof objectives_text, "%s", objectives);
  snprintf(budgets_text, sizeof budgets_text, "%s", budgets);
  spec.n_objectives = split_list(objectives_text, spec.objectives, COMPARE_MAX_OBJECTIVES);
  spec.n_budgets = split_list(budgets_text, spec.budgets, COMPARE_MAX_BUDGETS);
  if (spec.n_objectives < 0 || spec.n_budgets < 0) {
    fprintf(stderr, "tally compare: between 1 and %d objectives and 1 and %d budgets\n",
            COMPARE_MAX_OBJECTIVES, COMPARE_MAX_BUDGETS);
    return 2;
  }
  for (int o = 0; o < spec.n_objectives; o++)
    if ((rc = check_objective(spec.objectives[o]))) return rc;
  if (compare_choose_recipes(&spec, config_dir, args.all_config, args.per_objective_config,
                             args.n_per_objective) != 0) {
    fprintf(stderr, "tally compare: %s\n", tl_last_error());
    return 2;
  }
  if ((rc = load_compare_configs(&spec, &args.ca))) return rc;
  return compare_run(&spec);
}

static void usage_keys(FILE *f) {
  fprintf(f,
          "usage: tally keys\n"
          "\n"
          "Prints every configuration key as Markdown, one table per section: the recipe's\n"
          "sections, each objective's own, and the model file's [backbone]. Each row gives\n"
          "the key's type with its range or choices, its default and its meaning. docs/keys.md\n"
          "is this output.\n");
}

static int cmd_keys(int argc, char **argv) {
  const Option opts[] = {{.name = NULL}};
  const CommandLine cl = {"keys", usage_keys, opts, NULL, NULL, "unexpected"};
  int rc = parse_options(&cl, argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  config_write_reference(stdout);
  return 0;
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

// A closed stdin, stdout or stderr would make the next file opened take its number: progress
// lines written into the run folder's lock, a checkpoint written to by printf.
static void open_standard_streams(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF &&
        open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0)
      _exit(1);
}

int main(int argc, char **argv) {
  open_standard_streams();
  objective_register_config();
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
  static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
  } commands[] = {{"train", cmd_train},     {"plan", cmd_plan}, {"report", cmd_report},
                  {"compare", cmd_compare}, {"eval", cmd_eval}, {"embed", cmd_embed},
                  {"export", cmd_export},   {"keys", cmd_keys}};
  for (size_t c = 0; c < sizeof commands / sizeof *commands; c++)
    if (!strcmp(cmd, commands[c].name)) return commands[c].run(argc - 2, argv + 2);
  fprintf(stderr, "tally: unknown command '%s' (see tally --help)\n", cmd);
  return 2;
}
