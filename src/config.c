// The whole configuration is described by two tables (recipe keys and model-file keys). Loading,
// --set overrides, defaults, error messages, config_write and the key reference (`tally keys`,
// docs/keys.md) all walk the same tables, so a new key is one new row and nothing else.
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
             "1-8% more step time), each ResNet block's first BatchNorm-ReLU output (18% less "
             "on resnet-small-32 for 1-2% more step time); the same gradients. 0: kept (faster, "
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

typedef struct {
  const KeySpec *keys;
  size_t n_keys;
} Schema;

// The model file's keys: the shared rows, then each registered backbone family's own.
#define MAX_MODEL_KEYS 64
static KeySpec all_model_keys[MAX_MODEL_KEYS];
static Schema model_schema_built;
static const BackboneSection *backbone_sections[CONFIG_MAX_BACKBONES];
static int n_backbone_sections = -1;  // -1: not registered yet
static int model_schema_built_yet;
static pthread_once_t model_schema_once = PTHREAD_ONCE_INIT;

void config_register_backbones(const BackboneSection *const *families, int n) {
  if (n < 1 || n > CONFIG_MAX_BACKBONES)
    TL_DIE("%d backbones registered with config: 1 to %d (raise CONFIG_MAX_BACKBONES)", n,
           CONFIG_MAX_BACKBONES);
  int same = n == n_backbone_sections;
  for (int f = 0; same && f < n; f++) same = families[f] == backbone_sections[f];
  if (same) return;
  if (model_schema_built_yet)
    TL_DIE("backbone sections registered with config after a configuration was read");
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
  model_schema_built = (Schema){all_model_keys, n};
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
  if (n < 0 || n > CONFIG_MAX_OBJECTIVES)
    TL_DIE("%d objectives registered with config: at most %d (raise CONFIG_MAX_OBJECTIVES)", n,
           CONFIG_MAX_OBJECTIVES);
  int same = n == n_objective_sections;
  for (int o = 0; same && o < n; o++)
    same = sections[o] == objective_sections[o] && !strcmp(names[o], objective_section_names[o]);
  if (same) return;
  if (recipe_schema_built_yet)
    TL_DIE("objective sections registered with config after a configuration was read");
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
  recipe_schema_built = (Schema){all_recipe_keys, n};
  recipe_schema_built_yet = 1;
}

static const Schema *recipe_schema_get(void) {
  pthread_once(&recipe_schema_once, build_recipe_schema);
  return &recipe_schema_built;
}
#define recipe_schema (*recipe_schema_get())

// Bounds the per-file "where was this key set" bookkeeping.
#define MAX_KEYS MAX_RECIPE_KEYS
_Static_assert(sizeof recipe_keys / sizeof recipe_keys[0] <= MAX_KEYS, "raise MAX_KEYS");
_Static_assert(MAX_MODEL_KEYS <= MAX_KEYS, "raise MAX_KEYS");

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
static void describe_alternatives(char *out, size_t cap, const char *typed,
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

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

// strtod for decimal text only: strtod also reads hexadecimal ("0x10" is 16), "inf" and "nan",
// none of which a recipe means as a number; for those nothing is read (*end == text).
static double strtod_decimal(const char *text, char **end) {
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
  int values[CONFIG_MAX_STAGES];
  TL_ASSERT(capacity <= CONFIG_MAX_STAGES);
  size_t n = 0;
  char buf[256];
  if (strlen(text) >= sizeof buf)
    return tl_fail("%s: [%s] %s is too long", where, k->section, k->key);
  strcpy(buf, text);
  if (!*trim(buf))
    return tl_fail("%s: [%s] %s is empty (expected comma-separated integers)", where, k->section,
                   k->key);
  for (char *tok = buf, *next; tok; tok = next) {
    next = strchr(tok, ',');
    if (next) *next++ = '\0';
    tok = trim(tok);
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

int config_ini_max_line(void) {
  // Debian's inih reads lines of at most INI_MAX_LINE (200) bytes into a buffer on the stack,
  // unless told at run time to take one from the heap, of ini_initial_alloc bytes (which it
  // hands the reader): room for a key and a path of PATH_MAX.
  ini_use_stack = false;
  ini_allow_realloc = false;
  ini_initial_alloc = ini_max_line = CONFIG_PATH_MAX + 64;
  return ini_max_line;
}

static int set_string(const KeySpec *k, void *base, const char *where, const char *text) {
  // A path (every path key holds CONFIG_PATH_MAX) starting with ~/ is the home folder's, as a
  // shell would read it: in `--set data.train=~/photos` the shell leaves the ~ alone.
  char expanded[CONFIG_PATH_MAX];
  const char *home = getenv("HOME");
  if (k->size == CONFIG_PATH_MAX && home && home[0] &&
      (strcmp(text, "~") == 0 || strncmp(text, "~/", 2) == 0)) {
    if (snprintf(expanded, sizeof expanded, "%s%s", home, text + 1) >= (int)sizeof expanded)
      return tl_fail("%s: [%s] %s = '%s' is longer than %d characters with ~ expanded", where,
                     k->section, k->key, text, CONFIG_PATH_MAX - 1);
    text = expanded;
  }
  if (k->choices && !is_choice(k->choices, text))
    return tl_fail("%s: [%s] %s = '%s' is not one of %s", where, k->section, k->key, text,
                   k->choices);
  // config_write must be able to write it back on one line that inih reads whole (it keeps
  // config_ini_max_line() - 3 characters, strips the ends and cuts at ';' comments).
  size_t limit = k->size - 1;
  size_t line_limit = (size_t)config_ini_max_line() - 3 - strlen(k->key) - strlen(" = ");
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
      double v = strtod_decimal(text, &end);
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

static void format_value(const KeySpec *k, const void *base, char *out, size_t cap) {
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
      int n = model_spec_list_length((const int *)field);
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

static const KeySpec *find_key(const Schema *s, const char *section, const char *key) {
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

static int unknown_name(const Schema *s, const char *where, const char *section, const char *key) {
  const char *names[MAX_KEYS];
  char hint[512];
  size_t n = 0;
  for (size_t i = 0; i < s->n_keys; i++)
    if (strcmp(s->keys[i].section, section) == 0) names[n++] = s->keys[i].key;
  if (n > 0) {
    describe_alternatives(hint, sizeof hint, key, names, n, "'", "'", "keys");
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
  describe_alternatives(hint, sizeof hint, section, names, n, "[", "]", "sections");
  return tl_fail("%s: unknown section [%s]%s", where, section, hint);
}

static int load_dataset(Config *cfg, const char *where);

// Set while a resolved configuration is read back (a checkpoint's copy): its [data] keys are
// already the descriptor's, and the descriptor need not be where the run started.
static _Thread_local int reading_resolved;

static int assign(const Schema *s, void *base, const char *where, const char *section,
                  const char *key, const char *value) {
  const KeySpec *k = find_key(s, section, key);
  if (!k) return unknown_name(s, where, section, key);
  if (set_key(k, base, where, value)) return -1;
  // [data] dataset = NAME reads data/NAME.ini's [data] keys there and then.
  if (s->keys != model_schema.keys && k->offset == offsetof(Config, data.dataset) &&
      !reading_resolved)
    return load_dataset(base, where);
  return 0;
}

static void apply_defaults(const Schema *s, void *base) {
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
  int line;                   // the line inih is handling (it reads one line, then handles it)
  char raw[64];               // its beginning, before inih strips it
  int error_line;             // the first error this parse recorded, 0 = none
  int set_at_line[MAX_KEYS];  // where each key was set in this file, 0 = not yet
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
  char where[CONFIG_PATH_MAX + 16];
  snprintf(where, sizeof where, "%s:%d", p->path, p->line);
  int rc;
  const KeySpec *k = find_key(p->schema, section, name);
  if (is_continuation(p->raw, name)) {
    rc = tl_fail("%s: indented line is read as part of the value of '%s'; remove the indentation",
                 where, name);
  } else if (k && p->set_at_line[k - p->schema->keys]) {
    rc = tl_fail("%s: [%s] %s is set twice (first on line %d)", where, section, name,
                 p->set_at_line[k - p->schema->keys]);
  } else {
    rc = assign(p->schema, p->base, where, section, name, value);
    if (rc == 0) p->set_at_line[k - p->schema->keys] = p->line;
  }
  if (rc) p->error_line = p->line;
  return rc == 0;
}

// `path` names the input in messages; `file` is read to its end.
static int parse_stream(const Schema *schema, void *base, const char *path, FILE *file) {
  IniParse p = {.schema = schema, .base = base, .path = path, .file = file};
  config_ini_max_line();
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

static int parse_file(const Schema *schema, void *base, const char *path) {
  FILE *f = open_config_file(path);
  if (!f) return -1;
  int rc = parse_stream(schema, base, path, f);
  fclose(f);
  return rc;
}

static int parse_text(const Schema *schema, void *base, const char *name, const char *text) {
  FILE *f = fmemopen((void *)text, strlen(text), "r");
  if (!f) return tl_fail("%s: cannot read: %s", name, strerror(errno));
  int rc = parse_stream(schema, base, name, f);
  fclose(f);
  return rc;
}

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
  apply_defaults(&recipe_schema, cfg);
  apply_defaults(&model_schema, &cfg->model.spec);
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
  int rc = parse_file(&recipe_schema, cfg, path);
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

int config_load_model(Config *cfg, const char *path) {
  char file[CONFIG_PATH_MAX], resolved[CONFIG_PATH_MAX];
  if (copy_path(file, path)) return -1;
  if (config_resolve_path(file, resolved, sizeof resolved)) memcpy(file, resolved, sizeof file);
  // A fresh spec, so keys of a previously loaded model file cannot leak into this one.
  ModelSpec spec;
  memset(&spec, 0, sizeof spec);
  apply_defaults(&model_schema, &spec);
  if (parse_file(&model_schema, &spec, file)) return -1;
  memcpy(&cfg->model.spec, &spec, sizeof spec);
  memcpy(cfg->model.file, file, sizeof file);
  return 0;
}

int config_load(Config *cfg, const char *path) {
  Config next;
  memcpy(&next, cfg, sizeof next);
  if (copy_path(next.source_path, path)) return -1;
  if (parse_file(&recipe_schema, &next, path)) return -1;
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
  int rc = parse_text(&recipe_schema, &next, name, recipe);
  reading_resolved = 0;
  if (rc) return -1;
  ModelSpec spec;
  memset(&spec, 0, sizeof spec);
  apply_defaults(&model_schema, &spec);
  if (parse_text(&model_schema, &spec, name, model)) return -1;
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
  if (assign(&recipe_schema, &next, where, trim(buf), trim(dot + 1), trim(eq + 1))) return -1;
  const KeySpec *k = find_key(&recipe_schema, trim(buf), trim(dot + 1));
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
    double v = strtod_decimal(c, &end);
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

static int validate_model(const Config *cfg) {
  const ModelSpec *m = &cfg->model.spec;
  const char *where = cfg->model.file;
  if (m->pad_to && m->pad_to < cfg->data.image_size)
    return tl_fail("%s: [backbone] pad_to = %d is smaller than [data] image_size = %d", where,
                   m->pad_to, cfg->data.image_size);
  // The type key accepts only registered names, so the family is there.
  const BackboneSection *family = backbone_section(m->type);
  if (family->validate && family->validate(m, cfg->data.image_size, where)) return -1;
  // Whatever the type: the model file's lists describe one network together, and a file whose
  // lists contradict each other is a mistake worth naming even for a family that ignores them.
  const Schema *ms = &model_schema;
  int first = -1, differ = 0;
  char lengths[256] = "";
  for (size_t i = 0; i < ms->n_keys; i++) {
    const KeySpec *k = &ms->keys[i];
    if (k->type != KEY_INT_LIST) continue;
    const int n = model_spec_list_length((const int *)((const char *)m + k->offset));
    differ |= first >= 0 && n != first;
    snprintf(lengths + strlen(lengths), sizeof lengths - strlen(lengths),
             first < 0 ? "%s has %d" : ", %s %d", k->key, n);
    if (first < 0) first = n;
  }
  if (differ) return tl_fail("%s: [backbone] lists differ in length: %s", where, lengths);
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
      format_value(&s->keys[k], cfg, value, sizeof value);
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

static void write_schema(const Schema *s, const void *base, const char *prefix, FILE *out) {
  char value[1024];
  for (size_t i = 0; i < s->n_keys; i++) {
    const KeySpec *k = &s->keys[i];
    if (i == 0 || strcmp(k->section, s->keys[i - 1].section) != 0)
      fprintf(out, "%s%s[%s]\n", i ? "\n" : "", prefix, k->section);
    format_value(k, base, value, sizeof value);
    fprintf(out, "%s%s =%s%s\n", prefix, k->key, *value ? " " : "", value);
  }
}

void config_write(const Config *cfg, FILE *out) {
  fprintf(out, "; Tally configuration as resolved: every key, defaults included.\n");
  if (cfg->source_path[0]) fprintf(out, "; Recipe: %s\n", cfg->source_path);
  fprintf(out, "\n");
  write_schema(&recipe_schema, cfg, "", out);
  // Recipes have no [backbone] section (it lives in [model] file), so the spec is recorded as
  // comments: the run folder documents the model and the file still loads.
  fprintf(out, "\n; Model file %s, as read:\n", cfg->model.file);
  write_schema(&model_schema, &cfg->model.spec, "; ", out);
}

void config_write_model(const Config *cfg, FILE *out) {
  write_schema(&model_schema, &cfg->model.spec, "", out);
}

const KeySpec *config_recipe_keys(size_t *n) {
  *n = recipe_schema.n_keys;
  return recipe_schema.keys;
}

const KeySpec *config_model_keys(size_t *n) {
  *n = model_schema.n_keys;
  return model_schema.keys;
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
static void write_reference_tables(const Schema *s, FILE *out) {
  char type[256];
  for (size_t i = 0; i < s->n_keys; i++) {
    const KeySpec *k = &s->keys[i];
    if (i == 0 || strcmp(k->section, s->keys[i - 1].section) != 0) {
      fprintf(out, "### `[%s]`", k->section);
      if (s == &model_schema) fprintf(out, " (in the model file that `[model] file` names)");
      for (int o = 0; o < n_objective_sections; o++)
        if (strcmp(k->section, objective_section_names[o]) == 0)
          fprintf(out, " (read by `--objective=%s`)", k->section);
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

void config_write_reference(FILE *out) {
  write_reference_tables(&recipe_schema, out);
  fputc('\n', out);
  write_reference_tables(&model_schema, out);
}

int config_get(const Config *cfg, const char *name, char *out, size_t cap) {
  char section[64];
  const char *dot = strchr(name, '.');
  if (!dot || (size_t)(dot - name) >= sizeof section)
    return tl_fail("%s: expected section.key", name);
  memcpy(section, name, (size_t)(dot - name));
  section[dot - name] = 0;
  const KeySpec *k = find_key(&recipe_schema, section, dot + 1);
  if (!k) return unknown_name(&recipe_schema, "config_get", section, dot + 1);
  format_value(k, cfg, out, cap);
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
  double v = strtod_decimal(text, &end);
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
