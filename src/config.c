// Tally's configuration: the recipe's and the model file's key tables, the sections objectives and
// backbone families register, the checks between keys, and the public API. Loading, --set
// overrides, defaults, error messages, config_write and the key reference (`tally keys`,
// docs/keys.md) all walk the same tables through the engine (config_schema.c), so a new key is one
// new row and nothing else.
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>
#include <sys/stat.h>

#include "config_schema.h"
#include "core/error.h"

static const KeySpec recipe_keys[] = {
    TEXT_KEY(RECIPE(data, dataset), "", NULL,
             "a descriptor data/NAME.ini whose [data] keys are read where this key stands (keys "
             "after it override them); empty = none"),
    TEXT_KEY(RECIPE(data, format), "idx", "idx|imagefolder",
             "`idx`: IDX files, gzip or plain, labels beside them under their standard name; "
             "`imagefolder`: root/CLASS/*.png, .jpg or .bmp"),
    // Debian's dataset-fashion-mnist installs here.
    TEXT_KEY(RECIPE(data, train), "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
             NULL, "training images: the IDX images file, or the ImageFolder root"),
    TEXT_KEY(RECIPE(data, test), "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz",
             NULL, "test images of the kNN monitor, in the same form as `train`"),
    INT_KEY(RECIPE(data, image_size), "28", 1, 4096,
            "side of the square images in pixels: IDX images must have it; ImageFolder views are "
            "cropped from each image and resized to it"),
    INT_KEY(RECIPE(data, channels), "1", 1, 3,
            "1 (grayscale) or 3 (RGB): images are converted to it"),
    TEXT_KEY(RECIPE(data, labels), "auto", "auto|none",
             "`auto`: classes from the subfolders or the IDX labels file; `none`: unlabeled "
             "images (no kNN monitor, no test set; score with `tally eval` on labeled data)"),
    INT_KEY(RECIPE(data, limit), "0", 0, INT_MAX,
            "training images read, the first N (ImageFolder: spread over the classes); 0 = all"),
    INT_KEY(RECIPE(data, test_limit), "0", 0, INT_MAX, "test images read, as `limit`; 0 = all"),
    BOOL_KEY(RECIPE(data, stream), "1",
             "ImageFolder: 1 = only the file list and each image's size are read at the start; "
             "every view is cropped from the decoded file when a batch needs it (memory flat in "
             "the folder's size); 0 = every image decoded once at the start and held in memory, "
             "resized to image_size (faster per step for small images, no crop from the source)"),

    FLOAT_KEY(RECIPE(augment, crop_scale_min), "0.2", 0, 1, OPEN_MIN,
              "random resized crop: smallest crop as a fraction of the image's area (aspect "
              "ratio 3/4 to 4/3); raise it where the object fills little of the image, or a crop "
              "may miss it"),
    FLOAT_KEY(RECIPE(augment, crop_scale_max), "1", 0, 1, OPEN_MIN,
              "random resized crop: largest crop as a fraction of the image's area"),
    FLOAT_KEY(RECIPE(augment, flip_prob), "0.5", 0, 1, 0,
              "probability of a horizontal flip per view; 0 for characters, digits or text, "
              "where a mirror image can be another class"),
    FLOAT_KEY(RECIPE(augment, jitter_strength), "0.4", 0, 1, 0,
              "colour jitter s: brightness, contrast (and saturation on RGB) factors uniform in "
              "[1 − s, 1 + s], in random order"),
    FLOAT_KEY(RECIPE(augment, jitter_prob), "0.8", 0, 1, 0,
              "probability of colour jitter per view"),
    FLOAT_KEY(RECIPE(augment, grayscale_prob), "0.2", 0, 1, 0,
              "probability of converting a view to grayscale (RGB only)"),
    FLOAT_KEY(RECIPE(augment, solarize_prob), "0", 0, 1, 0,
              "probability of solarization per view (BYOL's: x → 1 − x where x ≥ 0.5)"),
    FLOAT_KEY(RECIPE(augment, blur_prob), "0", 0, 1, 0,
              "probability of a Gaussian blur per view (SimCLR's: kernel 10% of the side, σ "
              "0.1 to 2 px)"),

    TEXT_KEY(RECIPE(model, file), "models/resnet-small.ini", NULL,
             "the model file holding the [backbone] keys (below); a relative path is also "
             "looked for under the project root"),
    INT_KEY(RECIPE(model, head_hidden_dim), "256", 1, 65536,
            "projection head's hidden width (Linear, BatchNorm, ReLU, Linear)"),
    INT_KEY(RECIPE(model, head_out_dim), "64", 1, 65536,
            "projection head's output width: the embedding the loss compares"),
    INT_KEY(RECIPE(model, bn_splits), "1", 1, 1024,
            "training BatchNorm takes its statistics over this many groups of each replica's "
            "batch (MoCo's single-GPU stand-in for several GPUs); must divide that batch"),
    BOOL_KEY(RECIPE(model, sync_bn), "0",
             "1: training BatchNorm normalizes with the statistics of the global batch, "
             "summed over replicas by sample count (and back-propagates through them), so "
             "several replicas take the same step as one; 0: each replica's own"),

    INT_KEY(RECIPE(train, batch_size), "256", 1, 65536,
            "images per step over all replicas (the global batch), split into shards"),
    INT_KEY(RECIPE(train, epochs), "1", 1, 1000000,
            "run length in passes over the training set, when `steps` is 0 and there is no "
            "`budget`"),
    INT_KEY(RECIPE(train, steps), "0", 0, INT_MAX,
            "run length in steps, overriding `epochs`; 0 = `epochs` × steps per epoch"),
    U64_KEY(RECIPE(train, seed), "0",
            "seeds the parameters' initialization and every random stream (augmentations, "
            "masks), which are keyed by (seed, step, image)"),
    INT_KEY(RECIPE(train, log_every), "10", 1, INT_MAX, "steps between progress lines"),
    INT_KEY(RECIPE(train, checkpoint_every), "50", 0, INT_MAX,
            "steps between checkpoints; they are also written at each epoch's end, before "
            "each evaluation, at the run's end and on SIGINT/SIGTERM; 0 = only then"),
    TEXT_KEY(RECIPE(train, budget), "", NULL,
             "the run's length as compute, overriding `steps` and `epochs`: training time "
             "(420s, 7m, 1.5h; evaluation excluded), FLOPs of every replica (5e15flop, 5PFLOP) "
             "or epochs (3epochs); empty = none"),
    TEXT_KEY(RECIPE(train, precision), "fp32", "fp32|bf16|auto",
             "`bf16`: convolutions and linear layers multiply in bf16, accumulating in fp32; a "
             "ResNet and a ViT keep their activations and their gradients in bf16 between "
             "layers (BatchNorm, ReLU, LayerNorm, GELU, attention, residual sums and pooling "
             "read and write bf16 with fp32 statistics; the images or tokens enter and the "
             "feature leaves fp32), other layers convert their inputs and output gradients at "
             "each layer; weights, their gradients, heads, losses and evaluation stay fp32. Fast "
             "only on a CPU with AVX512-BF16 or AMX; "
             "`fp32`: everything fp32; `auto`: bf16 on a CPU that computes it natively "
             "(AVX512-BF16, AMX), fp32 elsewhere, and the run's config.ini records which, so a "
             "resumed run keeps it"),

    BOOL_KEY(RECIPE(train, recompute), "1",
             "1: outputs cheap to compute again are not kept for backward but computed just "
             "before the op whose backward reads them: each transformer block's LayerNorm "
             "and GELU outputs (28-32% less activation memory on the shipped ViT recipes for "
             "1-8% more step time), a ResNet stem's and each block's first BatchNorm-ReLU "
             "output (28% less on resnet-small-32, 11% less peak memory; the step time moved by "
             "less than this machine's run-to-run spread); the same gradients. 0: kept (faster, "
             "more memory). bf16 matmuls and convolutions on fp32 activations keep their own "
             "copies either way"),

    TEXT_KEY(RECIPE(train, conv_algorithm), "auto", "auto|direct|winograd",
             "how 3x3 stride-1 fp32 convolutions of a ResNet whose channel counts are multiples "
             "of 16 compute: `winograd` (oneDNN's F(4x4, 3x3) kernels, 1.3-2.6x faster than "
             "direct on 32 channels and more, slower on 16 on an AVX-512 Xeon), `direct`, or "
             "`auto`: Winograd where both channel counts are 32 or more. The same FLOPs are "
             "counted either way; a library or CPU without Winograd runs direct"),

    TEXT_KEY(RECIPE(optim, name), "sgd", "sgd|lars|adamw",
             "`sgd` (PyTorch's, momentum, no Nesterov), `lars` (SimCLR's, per-tensor trust "
             "ratio) or `adamw` (PyTorch's, decoupled weight decay)"),
    FLOAT_KEY(RECIPE(optim, lr), "0.06", 0, 100, 0,
              "peak learning rate: absolute, or for a batch of `lr_batch` when that is set"),
    INT_KEY(RECIPE(optim, lr_batch), "0", 0, 65536,
            "the global batch `lr` is given for: the run's peak learning rate is then "
            "lr × train.batch_size / lr_batch (the linear scaling rule); 0 = `lr` as it is"),
    FLOAT_KEY(RECIPE(optim, momentum), "0.9", 0, 1, OPEN_MAX,
              "momentum coefficient of `sgd` and `lars`"),
    FLOAT_KEY(RECIPE(optim, weight_decay), "5e-4", 0, 10, 0,
              "weight decay; biases and normalization parameters have none"),
    INT_KEY(RECIPE(optim, warmup_steps), "0", 0, INT_MAX,
            "steps of linear warm-up to `lr`; 0 = none"),
    INT_KEY(RECIPE(optim, backbone_freeze_steps), "0", 0, INT_MAX,
            "steps at the start in which only the heads (projector, predictor, decoder) are "
            "updated: the backbone, its momentum and its weight decay stay as they are, while "
            "heads that start random learn to read its features; then the backbone warms up "
            "over `warmup_steps` as the network did at the start; 0 = none. `sgd` and `lars` "
            "only"),
    TEXT_KEY(RECIPE(optim, schedule), "cosine", "cosine|constant",
             "learning rate after warm-up: `cosine` decays it to 0 at the run's end, "
             "`constant` keeps it"),
    FLOAT_KEY(RECIPE(optim, beta1), "0.9", 0, 1, OPEN_MAX, "`adamw`'s first-moment decay"),
    FLOAT_KEY(RECIPE(optim, beta2), "0.95", 0, 1, OPEN_MAX, "`adamw`'s second-moment decay"),
    FLOAT_KEY(RECIPE(optim, eps), "1e-8", 0, 1, 0, "`adamw`'s term added to the denominator"),
    FLOAT_KEY(RECIPE(optim, lars_eta), "0.001", 0, 1, 0,
              "`lars` trust coefficient: each tensor's learning rate is scaled by "
              "η ‖w‖ / ‖g‖ (biases and normalization parameters are not)"),

    TEXT_KEY(RECIPE(parallel, backend), "local", "local|mpi",
             "`local`: replicas are threads of one process; `mpi`: one replica per rank under "
             "mpirun"),
    INT_KEY(RECIPE(parallel, replicas), "1", 1, CONFIG_MAX_REPLICAS,
            "replicas of the `local` backend, each training on its shard of the batch"),
    INT_KEY(RECIPE(parallel, checksum_every), "50", 1, INT_MAX,
            "steps between comparisons of the replicas' parameter hashes (a mismatch stops the "
            "run)"),
    INT_KEY(RECIPE(parallel, bucket_kib), "1024", 1, 1048576,
            "KiB of gradients per bucket, averaged while backward is still running (`mpi`)"),
    INT_KEY(RECIPE(parallel, timeout), "1800", 1, 604800,
            "seconds a rank waits inside one collective for the others before it stops the job "
            "(`mpi`; a lost or stopped peer); covers rank 0's kNN evaluation, which the others "
            "wait through (torch.distributed's default is the same)"),
    TEXT_KEY(RECIPE(parallel, shard_weights), "", NULL,
             "relative shard sizes, one positive number per replica (e.g. 1,3); empty = even "
             "split"),

    BOOL_KEY(RECIPE(eval, linear), "0",
             "1: the training monitor also fits a linear probe (`linear_top1` in eval.jsonl; "
             "seconds per evaluation)"),
    INT_KEY(
        RECIPE(eval, knn_k), "200", 1, 100000,
        "neighbours that vote in the kNN monitor and `tally eval` (cosine similarity); at most a "
        "tenth of the smallest class's training images, but not below 20 or the class"),
    FLOAT_KEY(RECIPE(eval, knn_temperature), "0.1", 0, 100, OPEN_MIN,
              "kNN votes (monitor and `tally eval`) weigh exp(similarity / temperature)"),
    INT_KEY(RECIPE(eval, knn_every_epochs), "1", 1, INT_MAX,
            "epochs between evaluations, kNN (labeled data) and the label-free rankme and "
            "embedding_std (always), also at the run's end"),
    INT_KEY(RECIPE(eval, every_steps), "0", 0, INT_MAX,
            "steps between evaluations instead of knn_every_epochs (after steps N, 2N, ... and "
            "at the run's end; a checkpoint at each); 0 = the epoch schedule. Not with "
            "knn_every_epochs other than 1"),
    INT_KEY(RECIPE(eval, knn_train_limit), "0", 0, INT_MAX,
            "training images in the kNN memory bank, the first N; 0 = the whole training set"),
    INT_KEY(RECIPE(eval, batch_size), "128", 1, 65536,
            "forward-only evaluation batch; its activations are evaluation memory"),
    TEXT_KEY(RECIPE(eval, train), "", NULL,
             "the monitor's own labeled set, its memory bank: an IDX images file (labels beside "
             "it) or an ImageFolder root with class subfolders, at [data] image_size and "
             "channels; the monitor (kNN, rankme, embedding_std) and `tally eval` use it instead "
             "of [data] train and test, labeled training data or not; empty = [data]'s. Give "
             "`test` with it"),
    TEXT_KEY(RECIPE(eval, test), "", NULL,
             "the monitor's own labeled test images, in the same form as `train`"),

    INT_KEY(RECIPE(ledger, every), "1", 1, INT_MAX,
            "steps between records in ledger.jsonl and ledger.csv"),
};

// The rows every backbone family shares; `type`'s choices and meaning are filled in from the
// registered families, whose own rows follow (BackboneSection).
static const KeySpec model_keys[] = {
    TEXT_KEY(BACKBONE(type), "resnet", NULL, NULL),
    INT_KEY(BACKBONE(pad_to), "0", 0, 4096,
            "images are framed (centred) to this side with `pad_fill` (resnet: by an even "
            "margin); 0 = no padding"),
    TEXT_KEY(BACKBONE(pad_fill), "black", "black|mean",
             "what `pad_to` frames the images with: `black`, raw 0 padded before normalization "
             "as torchvision's Pad does ((0 - mean) / std once normalized); `mean`, the data's "
             "mean (0 once normalized), a frame that stands apart from a black background"),
};

// The model file's keys: the shared rows, then each registered backbone family's own.
#define MAX_MODEL_KEYS 64
static KeySpec all_model_keys[MAX_MODEL_KEYS];
static Schema model_schema_built;
static const BackboneSection *backbone_sections[CONFIG_MAX_BACKBONES];
static int n_backbone_sections = -1;  // -1: not registered yet
static int model_schema_built_yet;
static pthread_once_t model_schema_once = PTHREAD_ONCE_INIT;

// Whether sections given at startup differ from those registered (n_now < 0: none yet). The same
// again changes nothing; others after a configuration was read, or more than `cap`, are internal
// errors. Names may be NULL (the backbones' sections carry theirs).
static int registration_changes(const char *what, int cap, int built, const void *const *now,
                                const char *const *now_names, int n_now, const void *const *given,
                                const char *const *names, int n) {
  if (n < 0 || n > cap)
    TL_DIE("%d %s registered with config: at most %d (config_keys.h, config.h)", n, what, cap);
  int same = n == n_now;
  for (int i = 0; same && i < n; i++)
    same = given[i] == now[i] && (!names || !strcmp(names[i], now_names[i]));
  if (same) return 0;
  if (built) TL_DIE("%s' sections registered with config after a configuration was read", what);
  return 1;
}

void config_register_backbones(const BackboneSection *const *families, int n) {
  if (n < 1) TL_DIE("no backbone registered with config");
  if (!registration_changes("backbones", CONFIG_MAX_BACKBONES, model_schema_built_yet,
                            (const void *const *)backbone_sections, NULL, n_backbone_sections,
                            (const void *const *)families, NULL, n))
    return;
  for (int f = 0; f < n; f++) backbone_sections[f] = families[f];
  n_backbone_sections = n;
}

static void build_model_schema(void) {
  if (n_backbone_sections < 0)
    TL_DIE(
        "a configuration was read before the backbones registered their sections with config "
        "(objective_register_config, at startup)");
  static char choices[256], help[2048];
  size_t n = sizeof model_keys / sizeof model_keys[0];
  memcpy(all_model_keys, model_keys, sizeof model_keys);
  for (int f = 0; f < n_backbone_sections; f++) {
    const BackboneSection *sec = backbone_sections[f];
    snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s", f ? "|" : "",
             sec->name);
    snprintf(help + strlen(help), sizeof help - strlen(help), "%s`%s`: %s", f ? "; " : "",
             sec->name, sec->help);
    if (n + sec->n_keys > MAX_MODEL_KEYS) TL_DIE("backbone %s: raise MAX_MODEL_KEYS", sec->name);
    memcpy(all_model_keys + n, sec->keys, sec->n_keys * sizeof *sec->keys);
    n += sec->n_keys;
  }
  all_model_keys[0].choices = choices;
  all_model_keys[0].help = help;
  model_schema_built = (Schema){all_model_keys, n, NULL};
  model_schema_built_yet = 1;
}

static const Schema *model_schema_get(void) {
  pthread_once(&model_schema_once, build_model_schema);
  return &model_schema_built;
}
#define model_schema (*model_schema_get())

static const BackboneSection *backbone_section(const char *type) {
  for (int f = 0; f < n_backbone_sections; f++)
    if (strcmp(backbone_sections[f]->name, type) == 0) return backbone_sections[f];
  return NULL;
}

// The recipe's keys followed by every objective's own section, their offsets moved into the
// objective's slot of Config.objective_settings: one table, so every walk below sees them all.
#define MAX_RECIPE_KEYS CONFIG_MAX_KEYS
static KeySpec all_recipe_keys[MAX_RECIPE_KEYS];
static Schema recipe_schema_built;
static const ConfigSection *objective_sections[CONFIG_MAX_OBJECTIVES];
static const char *objective_section_names[CONFIG_MAX_OBJECTIVES];
static int n_objective_sections = -1;  // -1: not registered yet
static int recipe_schema_built_yet;
static pthread_once_t recipe_schema_once = PTHREAD_ONCE_INIT;

void config_register_objectives(const char *const *names, const ConfigSection *const *sections,
                                int n) {
  if (!registration_changes("objectives", CONFIG_MAX_OBJECTIVES, recipe_schema_built_yet,
                            (const void *const *)objective_sections, objective_section_names,
                            n_objective_sections, (const void *const *)sections, names, n))
    return;
  for (int o = 0; o < n; o++) {
    objective_section_names[o] = names[o];
    objective_sections[o] = sections[o];
  }
  n_objective_sections = n;
}

int config_objectives_set(const Config *cfg, const char **names, int cap) {
  Config *defaults = malloc(sizeof *defaults);
  if (!defaults) TL_DIE("out of memory");
  config_defaults(defaults);
  int n = 0;
  for (int o = 0; o < n_objective_sections; o++) {
    const ConfigSection *sec = objective_sections[o];
    if (!sec || !memcmp(cfg->objective_settings[o], defaults->objective_settings[o], sec->bytes))
      continue;
    if (n < cap) names[n] = objective_section_names[o];
    n++;
  }
  free(defaults);
  return n;
}

static int recipe_key_set(const KeySpec *k, void *base, const char *where);

static void build_recipe_schema(void) {
  if (n_objective_sections < 0)
    TL_DIE(
        "a configuration was read before the objectives registered their sections with config "
        "(objective_register_config, at startup)");
  size_t n = sizeof recipe_keys / sizeof recipe_keys[0];
  memcpy(all_recipe_keys, recipe_keys, sizeof recipe_keys);
  for (int o = 0; o < n_objective_sections; o++) {
    const ConfigSection *sec = objective_sections[o];
    if (!sec) continue;
    if (sec->bytes > CONFIG_SETTINGS_BYTES || n + sec->n_keys > MAX_RECIPE_KEYS)
      TL_DIE("objective %s: settings too large for Config", objective_section_names[o]);
    for (size_t k = 0; k < sec->n_keys; k++) {
      KeySpec key = sec->keys[k];
      size_t slot = offsetof(Config, objective_settings) + (size_t)o * CONFIG_SETTINGS_BYTES;
      key.offset += slot;
      all_recipe_keys[n++] = key;
    }
  }
  recipe_schema_built = (Schema){all_recipe_keys, n, recipe_key_set};
  recipe_schema_built_yet = 1;
}

static const Schema *recipe_schema_get(void) {
  pthread_once(&recipe_schema_once, build_recipe_schema);
  return &recipe_schema_built;
}
#define recipe_schema (*recipe_schema_get())

// The engine's tables bound what Tally's may hold.
_Static_assert(MAX_RECIPE_KEYS <= SCHEMA_MAX_KEYS, "raise SCHEMA_MAX_KEYS");
_Static_assert(MAX_MODEL_KEYS <= SCHEMA_MAX_KEYS, "raise SCHEMA_MAX_KEYS");
_Static_assert(CONFIG_MAX_STAGES <= SCHEMA_MAX_LIST, "raise SCHEMA_MAX_LIST");

static int copy_path(char *dst, const char *src) {
  if (strlen(src) >= CONFIG_PATH_MAX)
    return tl_fail("%s: path longer than %d characters", src, CONFIG_PATH_MAX - 1);
  memset(dst, 0, CONFIG_PATH_MAX);
  memcpy(dst, src, strlen(src));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Public API. Every entry point builds the new Config in a copy and commits it only on
// success, so a failed load or override leaves the caller's configuration as it was.

void config_defaults(Config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  schema_apply_defaults(&recipe_schema, cfg);
  schema_apply_defaults(&model_schema, &cfg->model.spec);
}

static char search_root[CONFIG_PATH_MAX];

void config_set_search_root(const char *dir) {
  snprintf(search_root, sizeof search_root, "%s", dir);
}

int config_resolve_path(const char *path, char *out, size_t cap) {
  if (path[0] != '/' && access(path, R_OK) != 0 && search_root[0]) {
    char alt[2 * CONFIG_PATH_MAX];
    snprintf(alt, sizeof alt, "%s/%s", search_root, path);
    if (access(alt, R_OK) == 0 && strlen(alt) < cap) {
      snprintf(out, cap, "%s", alt);
      return 1;
    }
  }
  if (strlen(path) >= cap) return 0;
  snprintf(out, cap, "%s", path);
  return 0;
}

// data/NAME.ini: a dataset descriptor, [data] keys only (paths relative to the project root
// work from any folder). Keys the recipe sets after `dataset` override it.
static int load_dataset(Config *cfg, const char *where) {
  if (!cfg->data.dataset[0]) return 0;
  for (const char *c = cfg->data.dataset; *c; c++)
    if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_'))
      return tl_fail("%s: [data] dataset = '%s': a name from data/ (letters, digits, - and _)",
                     where, cfg->data.dataset);
  char name[CONFIG_PATH_MAX], path[CONFIG_PATH_MAX];
  snprintf(name, sizeof name, "data/%s.ini", cfg->data.dataset);
  config_resolve_path(name, path, sizeof path);
  if (access(path, R_OK) != 0)
    return tl_fail("%s: [data] dataset = '%s': no %s (the datasets are the .ini files in data/)",
                   where, cfg->data.dataset, name);
  static _Thread_local int reading;  // a descriptor naming a dataset would recurse
  if (reading) return tl_fail("%s: a dataset descriptor cannot name another dataset", where);
  char dataset[sizeof cfg->data.dataset];
  memcpy(dataset, cfg->data.dataset, sizeof dataset);
  reading = 1;
  int rc = schema_parse_file(&recipe_schema, cfg, path);
  reading = 0;
  if (rc) return -1;
  memcpy(cfg->data.dataset, dataset, sizeof dataset);
  char *paths[2] = {cfg->data.train, cfg->data.test};
  for (int i = 0; i < 2; i++) {
    char resolved[CONFIG_PATH_MAX];
    if (config_resolve_path(paths[i], resolved, sizeof resolved)) copy_path(paths[i], resolved);
  }
  return 0;
}

// Set while a resolved configuration is read back (a checkpoint's copy): its [data] keys are
// already the descriptor's, and the descriptor need not be where the run started.
static _Thread_local int reading_resolved;

// [data] dataset = NAME reads data/NAME.ini's [data] keys there and then.
static int recipe_key_set(const KeySpec *k, void *base, const char *where) {
  if (k->offset == offsetof(Config, data.dataset) && !reading_resolved)
    return load_dataset(base, where);
  return 0;
}

int config_load_model(Config *cfg, const char *path) {
  char file[CONFIG_PATH_MAX], resolved[CONFIG_PATH_MAX];
  if (copy_path(file, path)) return -1;
  if (config_resolve_path(file, resolved, sizeof resolved)) memcpy(file, resolved, sizeof file);
  // A fresh spec, so keys of a previously loaded model file cannot leak into this one.
  ModelSpec spec;
  memset(&spec, 0, sizeof spec);
  schema_apply_defaults(&model_schema, &spec);
  if (schema_parse_file(&model_schema, &spec, file)) return -1;
  memcpy(&cfg->model.spec, &spec, sizeof spec);
  memcpy(cfg->model.file, file, sizeof file);
  return 0;
}

int config_load(Config *cfg, const char *path) {
  Config next;
  memcpy(&next, cfg, sizeof next);
  if (copy_path(next.source_path, path)) return -1;
  if (schema_parse_file(&recipe_schema, &next, path)) return -1;
  // After the whole recipe, so [model] file may appear anywhere in it.
  if (config_load_model(&next, next.model.file)) return -1;
  memcpy(cfg, &next, sizeof next);
  return 0;
}

int config_load_text(Config *cfg, const char *name, const char *recipe, const char *model) {
  Config next;
  memcpy(&next, cfg, sizeof next);
  if (copy_path(next.source_path, name)) return -1;
  reading_resolved = 1;
  int rc = schema_parse_text(&recipe_schema, &next, name, recipe);
  reading_resolved = 0;
  if (rc) return -1;
  ModelSpec spec;
  memset(&spec, 0, sizeof spec);
  schema_apply_defaults(&model_schema, &spec);
  if (schema_parse_text(&model_schema, &spec, name, model)) return -1;
  next.model.spec = spec;
  memcpy(cfg, &next, sizeof next);
  return 0;
}

int config_set(Config *cfg, const char *assignment) {
  char where[300];
  snprintf(where, sizeof where, "--set %s", assignment);
  char buf[1024];
  if (strlen(assignment) >= sizeof buf) return tl_fail("%s: too long", where);
  strcpy(buf, assignment);
  char *eq = strchr(buf, '=');
  char *dot = eq ? memchr(buf, '.', (size_t)(eq - buf)) : NULL;
  if (!dot) return tl_fail("%s: expected section.key=value (e.g. optim.lr=0.1)", where);
  *eq = '\0';
  *dot = '\0';
  Config next;
  memcpy(&next, cfg, sizeof next);
  if (schema_assign(&recipe_schema, &next, where, schema_trim(buf), schema_trim(dot + 1),
                    schema_trim(eq + 1)))
    return -1;
  const KeySpec *k = schema_find_key(&recipe_schema, schema_trim(buf), schema_trim(dot + 1));
  next.set_by_option[k - recipe_schema.keys] = 1;
  if (strcmp(next.model.file, cfg->model.file) != 0 && config_load_model(&next, next.model.file)) {
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", tl_last_error());
    return tl_fail("%s: %s", where, reason);
  }
  memcpy(cfg, &next, sizeof next);
  return 0;
}

static int validate_shard_weights(const Config *cfg, const char *where) {
  const char *w = cfg->parallel.shard_weights;
  if (!*w) return 0;
  int n = 0;
  for (const char *c = w; *c;) {
    char *end;
    double v = schema_strtod_decimal(c, &end);
    while (isspace((unsigned char)*end)) end++;
    if (end == c || !(v > 0) || (*end && *end != ',') || (*end == ',' && !end[1]))
      return tl_fail("%s: [parallel] shard_weights = '%s' is not a list of positive numbers", where,
                     w);
    n++;
    c = *end ? end + 1 : end;
  }
  if (n != cfg->parallel.replicas)
    return tl_fail("%s: [parallel] shard_weights = '%s' has %d weights for %d replicas", where, w,
                   n, cfg->parallel.replicas);
  return 0;
}

// Whether a family's list keys in m have different lengths (tl_fail says which).
static int family_lists_differ(const BackboneSection *family, const ModelSpec *m,
                               const char *where) {
  int first = -1, differ = 0;
  char lengths[256] = "";
  for (size_t i = 0; i < family->n_keys; i++) {
    const KeySpec *k = &family->keys[i];
    if (k->type != KEY_INT_LIST) continue;
    const int n = model_spec_list_length((const int *)((const char *)m + k->offset));
    differ |= first >= 0 && n != first;
    snprintf(lengths + strlen(lengths), sizeof lengths - strlen(lengths),
             first < 0 ? "%s has %d" : ", %s %d", k->key, n);
    if (first < 0) first = n;
  }
  return differ ? tl_fail("%s: [backbone] lists differ in length: %s", where, lengths) : 0;
}

static int validate_model(const Config *cfg) {
  const ModelSpec *m = &cfg->model.spec;
  const char *where = cfg->model.file;
  if (m->pad_to && m->pad_to < cfg->data.image_size)
    return tl_fail("%s: [backbone] pad_to = %d is smaller than [data] image_size = %d", where,
                   m->pad_to, cfg->data.image_size);
  // The type key accepts only registered names, so the family is there.
  const BackboneSection *family = backbone_section(m->type);
  if (family->validate && family->validate(m, cfg->data.image_size, where)) return -1;
  // Whatever the type: a family's lists describe one network together, and a file whose lists
  // contradict each other is a mistake worth naming even for a family that ignores them. Each
  // family's lists agree among themselves: their defaults need not have another family's length.
  for (int f = 0; f < n_backbone_sections; f++)
    if (family_lists_differ(backbone_sections[f], m, where)) return -1;
  return 0;
}

// Where a cross-field check's values came from: "--set section.key=value" when the first key of
// the list that --set gave did, else the recipe file. keys: "section.key" names; a name ending
// in '.' stands for every key of that section.
static const char *origin(const Config *cfg, const char *const *keys, int n, char *buf,
                          size_t cap) {
  const Schema *s = &recipe_schema;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(keys[i]);
    for (size_t k = 0; k < s->n_keys; k++) {
      if (!cfg->set_by_option[k]) continue;
      char name[128], value[256];
      snprintf(name, sizeof name, "%s.%s", s->keys[k].section, s->keys[k].key);
      if (keys[i][len - 1] == '.' ? strncmp(name, keys[i], len) : strcmp(name, keys[i])) continue;
      schema_format_value(&s->keys[k], cfg, value, sizeof value);
      snprintf(buf, cap, "--set %s=%s", name, value);
      return buf;
    }
  }
  return cfg->source_path[0] ? cfg->source_path : "configuration";
}
#define ORIGIN(...)                                                                    \
  origin(cfg, (const char *const[]){__VA_ARGS__},                                      \
         sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *), where_buf, \
         sizeof where_buf)

int config_validate(const Config *cfg) {
  char where_buf[512];
  const char *where = cfg->source_path[0] ? cfg->source_path : "configuration";
  if (!cfg->model.file[0])
    return tl_fail("%s: [model] file is empty (name a model file, e.g. models/resnet-small.ini)",
                   where);
  if (cfg->data.channels != 1 && cfg->data.channels != 3)
    return tl_fail("%s: [data] channels = %d: must be 1 (grayscale) or 3 (RGB)", where,
                   cfg->data.channels);
  if (cfg->augment.crop_scale_min > cfg->augment.crop_scale_max)
    return tl_fail("%s: [augment] crop_scale_min = %g is larger than crop_scale_max = %g",
                   ORIGIN("augment.crop_scale_min", "augment.crop_scale_max"),
                   cfg->augment.crop_scale_min, cfg->augment.crop_scale_max);
  if (cfg->optim.backbone_freeze_steps > 0 && strcmp(cfg->optim.name, "adamw") == 0)
    return tl_fail(
        "%s: [optim] backbone_freeze_steps = %d needs `sgd` or `lars`: adamw's bias "
        "correction counts every update of the block, which a frozen backbone misses",
        ORIGIN("optim.backbone_freeze_steps", "optim.name"), cfg->optim.backbone_freeze_steps);
  if (cfg->model.sync_bn && cfg->model.bn_splits > 1)
    return tl_fail(
        "%s: [model] sync_bn = 1 and bn_splits = %d ask for opposite statistics (the "
        "global batch's, and groups of each replica's): choose one",
        ORIGIN("model.sync_bn", "model.bn_splits"), cfg->model.bn_splits);
  if (cfg->train.batch_size < cfg->parallel.replicas)
    return tl_fail(
        "%s: [train] batch_size = %d is smaller than [parallel] replicas = %d "
        "(every replica needs at least one image)",
        ORIGIN("train.batch_size", "parallel.replicas"), cfg->train.batch_size,
        cfg->parallel.replicas);
  recipe_schema_get();
  for (int o = 0; o < n_objective_sections; o++) {
    const ConfigSection *sec = objective_sections[o];
    char section[64];
    snprintf(section, sizeof section, "%s.", objective_section_names[o]);
    if (sec && sec->validate && sec->validate(cfg->objective_settings[o], ORIGIN(section)))
      return -1;
  }
  if (cfg->eval.knn_train_limit && cfg->eval.knn_k > cfg->eval.knn_train_limit)
    return tl_fail("%s: [eval] knn_k = %d is larger than knn_train_limit = %d",
                   ORIGIN("eval.knn_k", "eval.knn_train_limit"), cfg->eval.knn_k,
                   cfg->eval.knn_train_limit);
  if (cfg->eval.every_steps > 0 && cfg->eval.knn_every_epochs != 1)
    return tl_fail(
        "%s: [eval] every_steps = %d and knn_every_epochs = %d are two schedules: choose one",
        ORIGIN("eval.every_steps", "eval.knn_every_epochs"), cfg->eval.every_steps,
        cfg->eval.knn_every_epochs);
  Budget budget;
  if (config_budget(cfg, &budget) != 0) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tl_last_error());
    return tl_fail("%s: %s", ORIGIN("train.budget"), why);
  }
  if (validate_shard_weights(cfg, ORIGIN("parallel.shard_weights", "parallel.replicas"))) return -1;
  return validate_model(cfg);
}

void config_write(const Config *cfg, FILE *out) {
  fprintf(out, "; Tally configuration as resolved: every key, defaults included.\n");
  if (cfg->source_path[0]) fprintf(out, "; Recipe: %s\n", cfg->source_path);
  fprintf(out, "\n");
  schema_write(&recipe_schema, cfg, "", out);
  // Recipes have no [backbone] section (it lives in [model] file), so the spec is recorded as
  // comments: the run folder documents the model and the file still loads.
  fprintf(out, "\n; Model file %s, as read:\n", cfg->model.file);
  schema_write(&model_schema, &cfg->model.spec, "; ", out);
}

void config_write_model(const Config *cfg, FILE *out) {
  schema_write(&model_schema, &cfg->model.spec, "", out);
}

const KeySpec *config_recipe_keys(size_t *n) {
  *n = recipe_schema.n_keys;
  return recipe_schema.keys;
}

const KeySpec *config_model_keys(size_t *n) {
  *n = model_schema.n_keys;
  return model_schema.keys;
}

// Which file a section is read from, or which objective reads it.
static const char *reference_note(const Schema *s, const char *section) {
  static char note[96];
  if (s->keys == model_schema.keys) return "in the model file that `[model] file` names";
  for (int o = 0; o < n_objective_sections; o++)
    if (strcmp(section, objective_section_names[o]) == 0) {
      snprintf(note, sizeof note, "read by `--objective=%s`", section);
      return note;
    }
  return NULL;
}

void config_write_reference(FILE *out) {
  schema_write_reference(&recipe_schema, reference_note, out);
  fputc('\n', out);
  schema_write_reference(&model_schema, reference_note, out);
}

int config_get(const Config *cfg, const char *name, char *out, size_t cap) {
  char section[64];
  const char *dot = strchr(name, '.');
  if (!dot || (size_t)(dot - name) >= sizeof section)
    return tl_fail("%s: expected section.key", name);
  memcpy(section, name, (size_t)(dot - name));
  section[dot - name] = 0;
  const KeySpec *k = schema_find_key(&recipe_schema, section, dot + 1);
  if (!k) return schema_unknown_name(&recipe_schema, "config_get", section, dot + 1);
  schema_format_value(k, cfg, out, cap);
  return 0;
}

int config_total_steps(const Config *cfg, int steps_per_epoch, int *total) {
  long steps = cfg->train.steps > 0 ? cfg->train.steps : (long)cfg->train.epochs * steps_per_epoch;
  Budget budget;
  if (config_budget(cfg, &budget) == 0 && budget.kind == BUDGET_EPOCHS) {
    double s = floor(budget.amount * steps_per_epoch);
    steps = s < 1 ? 1 : s > (double)LONG_MAX / 2 ? LONG_MAX / 2 : (long)s;
  }
  if (steps > INT_MAX)
    return tl_fail("%ld steps (%d epochs of %d) is more than Tally counts (%d)", steps,
                   cfg->train.epochs, steps_per_epoch, INT_MAX);
  *total = (int)steps;
  return 0;
}

int config_validate_eval_set(const Config *cfg) {
  char where_buf[512];
  const char *const paths[2] = {cfg->eval.train, cfg->eval.test};
  static const char *const keys[2] = {"train", "test"};
  if (!paths[0][0] && !paths[1][0]) return 0;
  for (int i = 0; i < 2; i++) {
    const char *key = i ? "eval.test" : "eval.train";
    if (!paths[i][0])
      return tl_fail(
          "%s: [eval] %s is empty and %s is not: the monitor's labeled set needs both, its "
          "memory bank (train) and the images it scores (test)",
          ORIGIN(key, i ? "eval.train" : "eval.test"), keys[i], keys[1 - i]);
    struct stat st;
    if (stat(paths[i], &st) != 0)
      return tl_fail("%s: [eval] %s = '%s': %s", ORIGIN(key), keys[i], paths[i], strerror(errno));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
      return tl_fail(
          "%s: [eval] %s = '%s' is neither an IDX images file nor an ImageFolder root (a folder)",
          ORIGIN(key), keys[i], paths[i]);
  }
  return 0;
}

long config_eval_period_steps(const Config *cfg, int steps_per_epoch) {
  if (cfg->eval.every_steps > 0) return cfg->eval.every_steps;
  return (long)cfg->eval.knn_every_epochs * steps_per_epoch;
}

int config_budget(const Config *cfg, Budget *out) {
  const char *text = cfg->train.budget;
  *out = (Budget){BUDGET_NONE, 0};
  if (!text[0]) return 0;
  char *end;
  errno = 0;
  double v = schema_strtod_decimal(text, &end);
  if (end == text || errno || !(v > 0) || !isfinite(v))
    return tl_fail(
        "[train] budget = '%s': expected a positive amount with a unit (420s, 7m, 1.5h, "
        "5e15flop, 5PFLOP, 3epochs)",
        text);
  static const struct {
    const char *unit;
    BudgetKind kind;
    double scale;
  } units[] = {
      {"s", BUDGET_SECONDS, 1},      {"sec", BUDGET_SECONDS, 1},    {"m", BUDGET_SECONDS, 60},
      {"min", BUDGET_SECONDS, 60},   {"h", BUDGET_SECONDS, 3600},   {"flop", BUDGET_FLOPS, 1},
      {"kflop", BUDGET_FLOPS, 1e3},  {"mflop", BUDGET_FLOPS, 1e6},  {"gflop", BUDGET_FLOPS, 1e9},
      {"tflop", BUDGET_FLOPS, 1e12}, {"pflop", BUDGET_FLOPS, 1e15}, {"eflop", BUDGET_FLOPS, 1e18},
      {"epoch", BUDGET_EPOCHS, 1},   {"epochs", BUDGET_EPOCHS, 1}};
  while (*end == ' ') end++;
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (strcasecmp(end, units[i].unit) == 0) {
      *out = (Budget){units[i].kind, v * units[i].scale};
      if (out->kind == BUDGET_SECONDS && out->amount > BUDGET_MAX_SECONDS)
        return tl_fail("[train] budget = '%s': more than a time budget may be (%.0f h)", text,
                       BUDGET_MAX_SECONDS / 3600);
      return 0;
    }
  return tl_fail(
      "[train] budget = '%s': unknown unit '%s' (s, m, h; flop, GFLOP, TFLOP, PFLOP; "
      "epochs)",
      text, end);
}

int config_budget_steps(const Config *cfg, long done, double left, double per_step, int *total) {
  Budget b;
  if (config_budget(cfg, &b) != 0) return -1;
  const char *unit = b.kind == BUDGET_FLOPS ? " FLOP" : " s";
  if (!(per_step > 0) || !isfinite(per_step))
    return tl_fail("[train] budget = '%s': a step measured %g%s, which divides no budget",
                   cfg->train.budget, per_step, unit);
  // In double first: the count of a large budget over a cheap step passes any integer type.
  const double steps = (double)done + floor(fmax(left, 0) / per_step);
  if (steps < 1)
    return tl_fail(
        "[train] budget = '%s' is less than one step of this run (%.4g%s a step); give at least "
        "that much",
        cfg->train.budget, per_step, unit);
  if (steps > INT_MAX)
    return tl_fail(
        "[train] budget = '%s' allows %.4g steps of %.4g%s, more than Tally counts (%d); give a "
        "smaller budget",
        cfg->train.budget, steps, per_step, unit, INT_MAX);
  *total = (int)steps;
  return 0;
}

float config_lr(const Config *cfg) {
  if (cfg->optim.lr_batch <= 0) return cfg->optim.lr;
  return (float)((double)cfg->optim.lr * cfg->train.batch_size / cfg->optim.lr_batch);
}
