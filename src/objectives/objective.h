// The plug-in interface every self-supervised objective implements. The trainer loads a batch,
// runs objective_step (the objective's step: encode, compare, backward; timed, its loss summed
// over replicas and the common ledger fields filled around it), averages gradients across
// replicas, updates, calls after_update (momentum encoders, queues), and writes the ledger.
// Adding an objective is one new file in this folder plus its entry in objective_table
// (objective.c).
#pragma once
#include "config.h"
#include "data/batch.h"
#include "io/safetensors.h"
#include "ledger/record.h"
#include "nn/backbone.h"
#include "nn/head.h"
#include "parallel/comm.h"

typedef struct {
  const Config *cfg;
  ExecCtx *ctx;
  Comm *comm;        // collectives: gathered features (inbatch), gathered keys (moco)
  ParamSet *params;  // online trainable parameters, a set that grows as they are taken (or one
                     // of objective_param_count floats); the backbone's come first so an
                     // evaluation copy can bind to them
  int local_batch;   // samples this replica trains on per step
  int global_batch;  // samples over all replicas per step
  // global_batch / local_batch, the run layout's (run_shard_to_global): replica gradients are
  // averaged weighted by sample count, so a gradient times this is this replica's part of a sum.
  double shard_to_global;
  long total_steps;     // steps in the run (schedules)
  const char *out_dir;  // run folder for the objective's own outputs (images); NULL = none
  // (C) each: the normalization the views went through, (x - mean) / std per channel; every
  // backbone is told it (pad_to frames images in normalized black). NULL in a plan.
  const float *input_mean, *input_std;
  // How the objective's networks are built (bf16, recompute, ...): every Builder it makes takes
  // it. NULL: the defaults (ops/builder.h).
  const BuildPolicy *policy;
  // Where the backbones' pooled buffers come from (objective_encoder): one arena they all share,
  // allocated by objective_create once the objective is built. NULL: each backbone's own.
  BufferArena *arena;
} ObjectiveEnv;

typedef struct ObjectiveDef ObjectiveDef;

// Every objective's state begins with this.
typedef struct {
  const ObjectiveDef *def;
  ObjectiveEnv env;
  Backbone *online;          // the encoder being trained
  double backward_start_ms;  // set by objective_backward_begins during a step
} Objective;

// A step's loss on this replica: the sum of its loss terms and how many terms there are (views,
// masked patches; an objective whose loss is not a sum of terms gives loss x local batch and
// the local batch). objective_step adds both over the replicas and divides.
typedef struct {
  double sum, terms;
} ObjectiveLoss;

struct ObjectiveDef {
  const char *name;  // also the name of its config section ([moco] queue_size = ...)
  const char *description;
  // Its own config section: keys, defaults, ranges and cross-checks (config_keys.h). NULL: none.
  const ConfigSection *settings;
  int n_views;  // views per sample the loader prepares, one group at data.image_size ...
  // ... unless the objective declares its view groups (data/views.h) from its configuration and
  // the recipe's augmentation `base` (out_size = data.image_size). NULL: n_views of `base`.
  void (*views)(const Config *cfg, const AugmentParams *base, ViewRecipe *out);
  // Builds the objective's models and buffers for env->local_batch samples. NULL + tl_fail on
  // error. Parameters are taken from env->params in build order (backbone first, then heads and
  // decoders) on a set that grows as they are taken: a replica's one build is also its count
  // (core/params.h). objective_param_count runs it once on a counting set.
  Objective *(*create)(const ObjectiveEnv *env);
  // Forward, loss and backward on this replica's shard, on gradients the caller zeroed
  // (paramset_zero_grad; ops add into them). Leaves in env.params->grad the gradient
  // whose sample-count-weighted average over replicas is the gradient of the global loss.
  // Calls objective_backward_begins where its backward starts (the loss's own backward may
  // count as forward). Returns this replica's part of the loss. Fills the ledger's view,
  // comparison and "next step" counts and its own fields (ledger_fields); objective_step
  // fills the rest.
  ObjectiveLoss (*step)(Objective *o, const Batch *batch, LedgerRecord *rec);
  // After the step's timed phases, on the replica given an output folder: what the objective
  // writes that is not training (mae's reconstruction grids). May be NULL.
  void (*write_outputs)(Objective *o, const Batch *batch);
  // After the optimizer update (momentum encoder, queue). May be NULL.
  void (*after_update)(Objective *o, const Batch *batch, LedgerRecord *rec);
  void (*destroy)(Objective *o);
  // Adds what the objective keeps between steps, beyond the online parameters, to a checkpoint
  // list (tensors pointing at its live state, names prefixed with the objective's name), so a
  // resumed run continues bit for bit. NULL: nothing is kept.
  void (*state)(Objective *o, StFile *s);
  // The ledger fields only this objective has (moco's queue, mae's patches), declared with
  // their units and whether a plan can know them; their values go in rec->own[] in this order.
  // NULL: none.
  const LedgerOwnFields *ledger_fields;
  // Planning (`tally plan`): what the objective keeps between steps at 0-based `step` of a run,
  // from arithmetic alone — the ledger fields its planned step cannot know (moco's queue
  // contents and ages). NULL: its step's record holds at every step.
  void (*plan)(const Config *cfg, long step, int global_batch, LedgerRecord *rec);
  // The key `tally plan --memory-budget` searches for this objective (moco.queue_size); NULL:
  // train.batch_size.
  const char *budget_key;
  // The online parameters were replaced after create (--init): copies of them, such as a
  // momentum encoder, start again from them. NULL: nothing copies them.
  void (*params_loaded)(Objective *o);
};

const ObjectiveDef *objective_find(const char *name);
// def's create, with the state told its definition.
Objective *objective_create(const ObjectiveDef *def, const ObjectiveEnv *env);
// One training step of o under the contract every objective shares: times it (forward until
// objective_backward_begins, backward after it), sums its loss over the replicas, fills the
// record's common fields (images_source, forward_ms, backward_ms, own_fields) around what the
// objective's step fills, then lets it write its outputs. Returns the global loss (identical on
// every replica). Gradients must have been zeroed.
double objective_step(Objective *o, const Batch *batch, LedgerRecord *rec);
// Called by an objective's step where its backward pass begins.
void objective_backward_begins(Objective *o);
// An objective's encoder as every objective builds one: the recipe's backbone (model.spec) for
// `rows` images of data.image_size pixels, its parameters from `bld`, told env's input
// normalization, counted as COMP_ENCODER; then, when `head` is given, the projection head called
// `head_name` on its features (model.head_hidden_dim, model.head_out_dim) from the same builder,
// counted as COMP_HEAD.
Backbone *objective_encoder(const ObjectiveEnv *env, Builder *bld, int rows, ProjectionHead *head,
                            const char *head_name);
// The ledger fields the objective called `name` declares (NULL: none, or no such objective):
// what a ledger reader needs to read them back.
const LedgerOwnFields *objective_ledger_fields(const char *name);
// The view groups the objective trains on under cfg, from the recipe's augmentation `base`.
ViewRecipe objective_views(const ObjectiveDef *def, const Config *cfg, const AugmentParams *base);
// The online parameter count (floats, buffers included): `create` run once in dry run on a
// counting ParamSet. 0 with tl_fail when the objective refuses the configuration. A replica needs
// it only when its one build outgrew the address space a limit left it (train/replica.c).
size_t objective_param_count(const ObjectiveDef *def, const Config *cfg);
// The objective's settings in cfg: its own struct (as declared by def->settings).
const void *objective_settings(const Config *cfg, const ObjectiveDef *def);
// Comma-separated names of all objectives, for help and error messages.
const char *objective_names(void);
// Gives config every objective's section (keys and checks), in registry order: config sits below
// the objectives and reads them from what it was given; the backbone families' model-file
// sections with them (backbone_register_config). Every program calls it at startup, before
// reading a configuration.
void objective_register_config(void);
