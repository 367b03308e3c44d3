#include "objectives/multicrop_encoder.h"

#include <string.h>

void multicrop_views(const MultiCrop *m, const AugmentParams *base, ViewRecipe *out) {
  out->n_groups = m->local_crops > 0 ? 2 : 1;
  out->group[0] = (ViewGroup){.count = MULTICROP_GLOBAL, .aug = *base};
  out->group[0].aug.crop_scale_min = m->global_crop_scale_min;
  if (m->local_crops == 0) return;
  out->group[1] = (ViewGroup){.count = m->local_crops, .aug = *base};
  out->group[1].aug.out_size = m->local_size;
  out->group[1].aug.crop_scale_min = m->local_crop_scale_min;
  out->group[1].aug.crop_scale_max = m->global_crop_scale_min;
}

int multicrop_check(const MultiCrop *m, const Config *cfg, const char *section) {
  if (m->local_crops > 0 && m->local_size > cfg->data.image_size) {
    tl_fail("[%s] local_size = %d is larger than the global crops' data.image_size = %d", section,
            m->local_size, cfg->data.image_size);
    return 0;
  }
  if (m->local_crops > 0 && m->local_crop_scale_min >= m->global_crop_scale_min) {
    tl_fail(
        "[%s] local_crop_scale_min = %g must be below global_crop_scale_min = %g (local "
        "crops take the range between them)",
        section, m->local_crop_scale_min, m->global_crop_scale_min);
    return 0;
  }
  if (m->global_crop_scale_min > cfg->augment.crop_scale_max) {
    tl_fail("[%s] global_crop_scale_min = %g is above [augment] crop_scale_max = %g", section,
            m->global_crop_scale_min, cfg->augment.crop_scale_max);
    return 0;
  }
  return 1;
}

// The local instance's spec at the crops' side, as the backbone's family has it (a ViT whose
// patches tile the crops sees them at their own size: pad_to would frame them back to the global
// side and spend what they save).
static ModelSpec local_spec(const ModelSpec *spec, int local_size) {
  return backbone_spec_at_size(spec, local_size);
}

Backbone *multicrop_encoder_init(MultiCropEncoder *e, const ObjectiveEnv *env, Builder *online,
                                 int global_rows, int local_rows, int local_size) {
  memset(e, 0, sizeof *e);
  e->global_rows = global_rows, e->local_rows = local_rows;
  e->global = objective_encoder(env, online, global_rows, NULL, NULL);
  const int D = e->global->feature_dim;
  if (local_rows > 0) {
    // The local crops' share of the encoder's activations: what their instance adds, and their
    // rows of the features.
    const long long before = tl_mem_thread_net(MEM_ACT, COMP_ENCODER);
    paramset_view(&e->local_view, env->params, 0);
    Builder local = {.ctx = env->ctx,
                     .params = &e->local_view,
                     .mode = OP_TRAIN,
                     .policy = env->policy,
                     .keep_running_stats = 1};
    const ModelSpec small = local_spec(&env->cfg->model.spec, local_size);
    e->local = backbone_create(&small, &local, local_rows, local_size, env->cfg->data.channels);
    backbone_set_input_normalization(e->local, env->input_mean, env->input_std);
    e->local_act_bytes = (size_t)(tl_mem_thread_net(MEM_ACT, COMP_ENCODER) - before) +
                         sizeof(float) * (size_t)local_rows * D;
  }
  e->features =
      tl_alloc(sizeof(float) * (size_t)(global_rows + local_rows) * D, MEM_ACT, COMP_ENCODER);
  return e->global;
}

void multicrop_encoder_forward(MultiCropEncoder *e, ExecCtx *ctx, const Batch *batch) {
  TL_ASSERT(batch->n_groups == (e->local ? 2 : 1));
  const int D = e->global->feature_dim;
  e->global->forward(e->global, ctx, batch->group[0].views);
  // The local crops' FLOPs, for their view group's line in the ledger.
  const double local_fwd0 = ctx->flops_forward[COMP_ENCODER];
  if (e->local) e->local->forward(e->local, ctx, batch->group[1].views);
  e->local_group = (LedgerViewGroup){.views_grad = e->local_rows,
                                     .flops_forward = ctx->flops_forward[COMP_ENCODER] - local_fwd0,
                                     .activation_bytes = e->local_act_bytes};
  if (ctx->dry_run) return;
  memcpy(e->features, e->global->feature, sizeof(float) * (size_t)e->global_rows * D);
  if (e->local)
    memcpy(e->features + (size_t)e->global_rows * D, e->local->feature,
           sizeof(float) * (size_t)e->local_rows * D);
}

void multicrop_encoder_backward(MultiCropEncoder *e, ExecCtx *ctx, const float *dfeatures) {
  const double local_bwd0 = ctx->flops_backward[COMP_ENCODER];
  if (e->local)
    e->local->backward(e->local, ctx, dfeatures + (size_t)e->global_rows * e->global->feature_dim);
  e->local_group.flops_backward = ctx->flops_backward[COMP_ENCODER] - local_bwd0;
  e->global->backward(e->global, ctx, dfeatures);
}

void multicrop_encoder_ledger(const MultiCropEncoder *e, LedgerRecord *rec) {
  rec->view_groups = e->local ? 2 : 1;
  rec->view_group[0].views_grad = e->global_rows;
  if (e->local) rec->view_group[1] = e->local_group;
}

void multicrop_encoder_destroy(MultiCropEncoder *e) {
  e->global->destroy(e->global);
  if (e->local) e->local->destroy(e->local);
  paramset_free(&e->local_view);
  tl_free(e->features);
}
