#include "objectives/objective.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/counting.h"
#include "core/error.h"
#include "core/timer.h"

extern const ObjectiveDef objective_inbatch;
extern const ObjectiveDef objective_moco;
extern const ObjectiveDef objective_mae;
extern const ObjectiveDef objective_byol;
extern const ObjectiveDef objective_vicreg;
extern const ObjectiveDef objective_dino;
extern const ObjectiveDef objective_barlow;
extern const ObjectiveDef objective_swav;

static const ObjectiveDef *const objective_table[] = {
    &objective_inbatch, &objective_moco, &objective_mae,    &objective_byol,
    &objective_vicreg,  &objective_dino, &objective_barlow, &objective_swav};
enum { N_OBJECTIVES = sizeof objective_table / sizeof objective_table[0] };

const ObjectiveDef *objective_find(const char *name) {
  for (int i = 0; i < N_OBJECTIVES; i++)
    if (strcmp(objective_table[i]->name, name) == 0) return objective_table[i];
  return NULL;
}

Objective *objective_create(const ObjectiveDef *def, const ObjectiveEnv *env) {
  Objective *o = def->create(env);
  if (o) o->def = def;
  if (o && env->arena) buffer_arena_finish(env->arena);
  return o;
}

double objective_step(Objective *o, const Batch *batch, LedgerRecord *rec) {
  const ObjectiveDef *def = o->def;
  rec->own_fields = def->ledger_fields;
  o->backward_start_ms = NAN;
  const double start = now_ms();
  const ObjectiveLoss part = def->step(o, batch, rec);
  const double end = now_ms();
  TL_ASSERT(!isnan(o->backward_start_ms));  // the step said where its backward began
  rec->forward_ms = o->backward_start_ms - start;
  rec->backward_ms = end - o->backward_start_ms;
  rec->images_source = batch->n;
  if (o->env.out_dir && def->write_outputs) def->write_outputs(o, batch);
  double sums[2] = {part.sum, part.terms};
  comm_allreduce_sum_f64(o->env.comm, sums, 2);
  return sums[0] / sums[1];
}

Backbone *objective_encoder(const ObjectiveEnv *env, Builder *bld, int rows, ProjectionHead *head,
                            const char *head_name) {
  const Config *cfg = env->cfg;
  // Every network of a run is built by the run's policy (precision, recompute, ...): a Builder
  // that left it out would build this one in f32 defaults without a word.
  TL_ASSERT(bld->policy == env->policy);
  Builder encoder = *bld;
  encoder.component = COMP_ENCODER;
  encoder.arena = env->arena;
  Backbone *b =
      backbone_create(&cfg->model.spec, &encoder, rows, cfg->data.image_size, cfg->data.channels);
  backbone_set_input_normalization(b, env->input_mean, env->input_std);
  if (head)
    head_init(head, &encoder, head_name, rows, b->feature_dim, cfg->model.head_hidden_dim,
              cfg->model.head_out_dim);
  return b;
}

void objective_backward_begins(Objective *o) { o->backward_start_ms = now_ms(); }

const LedgerOwnFields *objective_ledger_fields(const char *name) {
  const ObjectiveDef *def = objective_find(name);
  return def ? def->ledger_fields : NULL;
}

ViewRecipe objective_views(const ObjectiveDef *def, const Config *cfg, const AugmentParams *base) {
  if (!def->views) return view_recipe_single(base, def->n_views);
  ViewRecipe r = {0};
  def->views(cfg, base, &r);
  return r;
}

size_t objective_param_count(const ObjectiveDef *def, const Config *cfg) {
  CountingPass pass;
  counting_begin(&pass, cfg->train.seed);
  LocalGroup *group = comm_local_group_create(1);
  Comm *comm = comm_local_rank(group, 0);
  comm_set_dry_run(comm, 1);
  const int batch = cfg->train.batch_size;
  ObjectiveEnv env = {cfg, &pass.ctx, comm, &pass.ps, batch, batch, 1.0,
                      1,   NULL,      NULL, NULL,     NULL,  NULL};
  Objective *o = objective_create(def, &env);
  if (o) def->destroy(o);
  comm_destroy(comm);
  comm_local_group_destroy(group);
  const size_t count = counting_end(&pass);
  return o ? count : 0;
}

const char *objective_names(void) {
  static char names[256];
  if (!names[0])
    for (int i = 0; i < N_OBJECTIVES; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
               objective_table[i]->name);
  return names;
}

static int objective_index(const ObjectiveDef *def) {
  for (int i = 0; i < N_OBJECTIVES; i++)
    if (objective_table[i] == def) return i;
  TL_DIE("objective %s is not in the registry", def->name);
}

const void *objective_settings(const Config *cfg, const ObjectiveDef *def) {
  return cfg->objective_settings[objective_index(def)];
}

void objective_register_config(void) {
  _Static_assert(N_OBJECTIVES <= CONFIG_MAX_OBJECTIVES, "raise CONFIG_MAX_OBJECTIVES");
  const char *names[N_OBJECTIVES];
  const ConfigSection *sections[N_OBJECTIVES];
  for (int i = 0; i < N_OBJECTIVES; i++) {
    names[i] = objective_table[i]->name;
    sections[i] = objective_table[i]->settings;
  }
  config_register_objectives(names, sections, N_OBJECTIVES);
  backbone_register_config();  // the objectives' encoders: the model file's families
}
