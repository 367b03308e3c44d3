#include "objectives/teacher.h"

#include "io/param_tensors.h"
#include "objectives/ema.h"

const LedgerOwnFields momentum_teacher_fields = {1, {MOMENTUM_DISTANCE_FIELD}};

Builder momentum_teacher_begin(MomentumTeacher *t, const ObjectiveEnv *env, float momentum,
                               const char *schedule) {
  t->momentum = momentum;
  t->schedule = schedule;
  paramset_alloc_nograd(&t->params, env->params->used, env->cfg->train.seed, MEM_MOMENTUM);
  return (Builder){
      .ctx = env->ctx, .params = &t->params, .mode = OP_FORWARD, .policy = env->policy};
}

void momentum_teacher_ready(MomentumTeacher *t, const ObjectiveEnv *env) {
  TL_ASSERT(t->params.used == t->params.count);
  // A counting set (a build that outgrew its growing set, core/params.h) holds nothing to copy.
  if (!env->ctx->dry_run && !env->params->counting) ema_copy(&t->params, env->params);
}

void momentum_teacher_update(MomentumTeacher *t, const ObjectiveEnv *env, long step,
                             double *distance) {
  const float m = ema_momentum_at(t->momentum, t->schedule, step, env->total_steps);
  if (env->ctx->dry_run) return;
  // The online entries it mirrors: all of them, or those before what only the online network
  // has (BYOL's predictor).
  ParamSet mirrored = *env->params;
  mirrored.n_entries = t->params.n_entries;
  mirrored.count = t->params.count;
  *distance = ema_update(&t->params, &mirrored, m);
}

void momentum_teacher_restart(MomentumTeacher *t, const ParamSet *online) {
  ema_copy(&t->params, online);
}

void momentum_teacher_state(MomentumTeacher *t, StFile *s, const char *prefix) {
  st_add_paramset(s, prefix, &t->params);
}

void momentum_teacher_destroy(MomentumTeacher *t) { paramset_free(&t->params); }
