// One typed configuration, read from an INI recipe (configs/*.ini) and a model file
// (models/*.ini) with inih, validated key by key, overridable from the command line with
// --set section.key=value under the same rules. What each key means, with its range and default,
// is its row in the key tables (config.c, and each objective's file): `tally keys` prints them.
#pragma once
#include <limits.h>
#include <stdio.h>

#include "config_keys.h"
#include "nn/model_spec.h"

#define CONFIG_PATH_MAX PATH_MAX
#define CONFIG_MAX_REPLICAS 64  // local replicas (threads) in one process
#define CONFIG_MAX_OBJECTIVES 8

#define CONFIG_MAX_KEYS 192  // recipe keys, objectives' sections included

typedef struct {
  char source_path[CONFIG_PATH_MAX];  // recipe file, "" when built from defaults only
  // 1 for each recipe key (in the key table's order) last set by --set, so a message about a
  // value names the --set that gave it rather than the recipe file.
  unsigned char set_by_option[CONFIG_MAX_KEYS];

  struct {
    char dataset[64];             // "" or NAME: data/NAME.ini's [data] keys, read where this
                                  // key stands (later keys override them)
    char format[16];              // idx | imagefolder
    char train[CONFIG_PATH_MAX];  // IDX images file, or ImageFolder root
    char test[CONFIG_PATH_MAX];
    int image_size;  // 28
    int channels;    // 1 or 3
    char labels[8];  // auto: class subfolders / the IDX labels file; none: unlabeled images
                     // (no kNN monitor, no test set; score with tally eval on labeled data)
    int limit;       // 0 = all training images
    int test_limit;  // 0 = all test images
    int stream;      // ImageFolder: 1 = decoded from the files as batches need them, 0 = in memory
  } data;

  struct {
    float crop_scale_min, crop_scale_max;  // 0.2, 1.0
    float flip_prob;                       // 0.5
    float jitter_strength;                 // 0.4 (brightness and contrast; saturation on RGB)
    float jitter_prob;                     // 0.8
    float grayscale_prob;                  // 0.2, RGB only
    float solarize_prob;                   // 0
    float blur_prob;                       // 0
  } augment;

  struct {
    char file[CONFIG_PATH_MAX];  // models/resnet-small.ini
    int head_hidden_dim;         // 256
    int head_out_dim;            // 64
    int bn_splits;               // 1; G: BatchNorm statistics over G groups of each replica's
                                 // batch (MoCo's single-GPU stand-in for several GPUs)
    int sync_bn;                 // 0; 1: BatchNorm statistics of the global batch
    ModelSpec spec;              // parsed from `file`
  } model;

  struct {
    int batch_size;           // 256, global across replicas
    int epochs;               // 1
    int steps;                // 0 = epochs * steps per epoch; > 0 overrides epochs
    unsigned long long seed;  // 0
    int log_every;            // 10 steps between progress lines (the console view of the ledger)
    char budget[32];          // "" = none; else the run's length as compute: 420s, 7m, 1.5h
                              // (training time, evaluation excluded), 5e15flop, 5PFLOP (every
                              // replica's FLOPs), 3epochs; overrides steps and epochs
    char precision[8];        // fp32 | bf16 | auto (run_config_resolve; see BuildPolicy.bf16)
    int recompute;            // 1: ViT blocks recompute norms and GELU in backward (ExecCtx)
    char conv_algorithm[12];  // auto | direct | winograd (3x3 convolutions; see ExecCtx)
    int checkpoint_every;     // 50 steps between checkpoints (also at each epoch's end and the
                              // run's); 0 = only those. A checkpoint costs ~10 ms here.
  } train;

  struct {
    char name[16];              // sgd | lars | adamw
    float lr;                   // peak learning rate (at lr_batch when set: config_lr)
    int lr_batch;               // 0: lr as it is; else the global batch lr is given for
    float momentum;             // 0.9 (sgd, lars)
    float weight_decay;         // 5e-4
    int warmup_steps;           // 0
    int backbone_freeze_steps;  // 0: the backbone is not updated before this step
    char schedule[16];          // cosine | constant
    float beta1, beta2;         // 0.9, 0.95 (adamw)
    float eps;                  // 1e-8 (adamw)
    float lars_eta;             // 0.001 trust coefficient
  } optim;

  // Each objective's own section ([inbatch], [moco], [mae], ...), one slot per objective in the
  // registry's order, laid out as the objective's settings struct (objective_settings()).
  _Alignas(16) unsigned char objective_settings[CONFIG_MAX_OBJECTIVES][CONFIG_SETTINGS_BYTES];

  struct {
    char backend[16];         // local | mpi
    int replicas;             // 1 (local backend)
    int checksum_every;       // 50
    int bucket_kib;           // 1024: gradient buckets summed while backward runs (MPI)
    char shard_weights[128];  // "" = even split; e.g. "1,3" for tests
    int timeout;              // 1800 s: the longest a rank waits in one collective (mpi)
  } parallel;

  struct {
    int linear;             // 0; 1: the monitor also fits a linear probe (seconds per evaluation)
    int knn_k;              // 200
    float knn_temperature;  // 0.1
    int knn_every_epochs;   // 1
    int every_steps;        // 0 = the epoch schedule; N: after every N steps instead
    int knn_train_limit;    // 0 = the whole training set as the memory bank
    int batch_size;         // 128, forward-only evaluation batch (its activations are eval memory)
    char train[CONFIG_PATH_MAX];  // "" = the monitor votes on [data]; else its own labeled set:
    char test[CONFIG_PATH_MAX];   // memory bank and test images (IDX file or ImageFolder root)
  } eval;

  struct {
    int every;  // 1: a ledger record every N steps
  } ledger;
} Config;

// Fills every field with its default.
void config_defaults(Config *cfg);

// The objectives whose own section ([byol], [dino], ...) `cfg` changes from its defaults: up to
// `cap` of their names into `names`; returns how many there are. A recipe file names its
// objective this way (configs/byol.ini sets [byol] keys).
int config_objectives_set(const Config *cfg, const char **names, int cap);

// Reads a recipe (and then the model file it names, relative paths resolved against the
// current directory). Unknown sections/keys, bad types and out-of-range values are errors:
// returns -1 with tl_last_error() = "FILE:LINE: message" (with the closest known key when the
// key is unknown).
int config_load(Config *cfg, const char *path);

// Reads a configuration from texts written by config_write and config_write_model (a
// checkpoint's own copy): the model comes from `model`, not from the file [model] names. `name`
// labels the texts in messages.
int config_load_text(Config *cfg, const char *name, const char *recipe, const char *model);

// Applies one override "section.key=value"; same validation, error names "--set". Re-reads the
// model file when model.file changes. Call config_load first.
int config_set(Config *cfg, const char *assignment);

// Relative recipe and model paths that do not exist under the current directory are looked up
// under this folder too (the project's root, so `tally` works from any directory).
void config_set_search_root(const char *dir);
// Writes `path`, or its location under the search root when only that exists, into out;
// returns 1 when the search root was used.
int config_resolve_path(const char *path, char *out, size_t cap);

// Reads a model file into cfg->model.spec (same error rules).
int config_load_model(Config *cfg, const char *path);

// Cross-field checks after all overrides (e.g. batch at least one sample per replica, vit sizes).
int config_validate(const Config *cfg);

typedef enum { BUDGET_NONE, BUDGET_SECONDS, BUDGET_FLOPS, BUDGET_EPOCHS } BudgetKind;
typedef struct {
  BudgetKind kind;
  double amount;  // seconds, FLOPs or epochs
} Budget;
// [train] budget parsed. -1 with tl_last_error() on a bad amount or unit, or a time budget
// past BUDGET_MAX_SECONDS.
int config_budget(const Config *cfg, Budget *out);
#define BUDGET_MAX_SECONDS (366.0 * 24 * 3600)

// The length a time or FLOP budget allows once a step's cost is measured: `done` steps and as
// many more as `left` (what is left of the budget, in its unit) pays at `per_step` each. -1 with
// tl_last_error() saying why when that is not a count Tally can run: less than one step in all,
// or more than INT_MAX.
int config_budget_steps(const Config *cfg, long done, double left, double per_step, int *total);

// The run's length in steps: an epochs budget, else train.steps, else train.epochs epochs of
// steps_per_epoch (time and FLOP budgets are fixed by the trainer after its first steps; this is
// then the provisional length). -1 with tl_last_error() when it does not fit the step counter.
int config_total_steps(const Config *cfg, int steps_per_epoch, int *total);

// The monitor's own labeled set ([eval] train and test) named together, each an existing file
// or folder. Apart from config_validate, which also reads the configuration a checkpoint or an
// export carries (where the set may have moved since): `tally train` and `tally plan` call it.
// -1 with tl_last_error() naming the recipe or --set that gave the path.
int config_validate_eval_set(const Config *cfg);

// Steps between the training monitor's evaluations: eval.every_steps, else knn_every_epochs
// epochs of steps_per_epoch. The monitor evaluates after every multiple of it (and at the end),
// counted from step 0, so a resumed run and every rank evaluate at the same steps.
long config_eval_period_steps(const Config *cfg, int steps_per_epoch);

// The run's peak learning rate: optim.lr, or with optim.lr_batch the linear scaling rule,
// lr * train.batch_size / lr_batch.
float config_lr(const Config *cfg);

// The value of recipe key "section.key" as config_write writes it. -1 for an unknown key.
int config_get(const Config *cfg, const char *name, char *out, size_t cap);

// The key tables, in their order: every recipe key (the objectives' sections after the recipe's
// own), or every model-file key. *n receives the count.
const KeySpec *config_recipe_keys(size_t *n);
const KeySpec *config_model_keys(size_t *n);

// Writes every key as Markdown, one table per section: key, type with its range or choices,
// default and meaning (`tally keys`; docs/keys.md is this output).
void config_write_reference(FILE *out);

// Writes the resolved configuration as INI (every key, defaults included); the model spec
// follows as comment lines, so the run folder documents it and the file stays loadable.
void config_write(const Config *cfg, FILE *out);
// Writes the model spec as a loadable [backbone] section.
void config_write_model(const Config *cfg, FILE *out);
