// Optimizers over one ParamSet's flat block, and the learning-rate schedule.
//
// Every optimizer walks the set's entries: buffers (is_buffer, BatchNorm running statistics) are
// never touched; no_decay entries (biases, normalization parameters) get no weight decay and, for
// LARS, no trust-ratio adaptation, as in SimCLR's exclusion of biases and BN parameters.
#pragma once
#include <stddef.h>

#include "config.h"
#include "core/params.h"
#include "io/safetensors.h"

typedef enum { OPTIM_SGD, OPTIM_LARS, OPTIM_ADAMW } OptimKind;

typedef struct {
  OptimKind kind;
  ParamSet *ps;
  float lr;  // as created (the peak); each optim_step is given the scheduled value
  float momentum, weight_decay;
  float beta1, beta2, eps;  // adamw
  float lars_eta;           // lars trust coefficient
  // State over the whole block (indexed like ps->data), MEM_OPTIM; saved by checkpoints.
  float *momentum_buf;   // (ps->count) sgd/lars momentum; adamw first moment m
  float *second_moment;  // (ps->count) adamw v; NULL otherwise
  long steps_done;       // updates applied so far (adamw bias correction)
  // The backbone's parameters are the block's first `backbone_floats` (objective.h); while
  // `backbone_frozen` is set, optim_step leaves them and their state untouched; otherwise their
  // learning rate is the step's times `backbone_lr_scale` (1 unless a warm-up after a freeze).
  size_t backbone_floats;
  int backbone_frozen;
  float backbone_lr_scale;
  struct OptimPrivate *priv;
} Optimizer;

// name: sgd | lars | adamw. Returns NULL with tl_last_error() set for an unknown name or
// out-of-range hyper-parameters. The set's entries must all be taken before this call.
Optimizer *optim_create(const char *name, ParamSet *ps, float lr, float momentum,
                        float weight_decay, float beta1, float beta2, float eps, float lars_eta);
// Same, with the hyper-parameters of cfg->optim.
Optimizer *optim_create_from_config(const Config *cfg, ParamSet *ps);

// One update of ps->data from ps->grad at learning rate `lr` (the schedule's value this step).
void optim_step(Optimizer *opt, float lr);

// Bytes of optimizer state for `param_count` floats of parameters, as optim_create allocates
// them; 0 for an unknown name (config validation rejects those before planning).
size_t optim_state_bytes(const char *name, size_t param_count);

// Adds the optimizer's state to a checkpoint list: optim.momentum (and optim.second_moment for
// adamw) over the whole block, and optim.steps_done.
void optim_state(Optimizer *opt, StFile *s);

void optim_destroy(Optimizer *opt);

// Learning rate at 0-based `step`: linear warm-up (step+1)/warmup_steps * peak_lr for
// step < warmup_steps, then "cosine" from peak_lr down to 0 at total_steps (0 beyond it), or
// "constant" at peak_lr. Dies on an unknown schedule name (config validation rejects those).
float lr_at_step(float peak_lr, int step, int warmup_steps, int total_steps, const char *schedule);

// The backbone's share of the step's learning rate after `freeze_steps` frozen ones: it warms up
// again, (step - freeze_steps + 1) / warmup_steps for the `warmup_steps` steps after the freeze,
// as the whole network did at the start; 1 otherwise (and without a freeze).
float backbone_lr_scale_at(int step, int freeze_steps, int warmup_steps);
