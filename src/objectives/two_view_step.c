#include "objectives/two_view_step.h"

int two_view_batch_ok(const ObjectiveEnv *env, const char *statistics) {
  if (env->global_batch >= 2) return 1;
  tl_fail("the global batch has %d image; %s at least 2 (train.batch_size)", env->global_batch,
          statistics);
  return 0;
}

ObjectiveLoss two_view_step(Objective *o, ProjectionHead *head, GlobalBatchLoss loss,
                            void *loss_state, float *dz, const Batch *batch, LedgerRecord *rec) {
  ExecCtx *ctx = o->env.ctx;
  const int b = batch->n, rows = 2 * b;
  TL_ASSERT(batch->n_views == 2);

  // The batch is view-major, so views 0 and 1 of all samples form one 2b-image forward.
  o->online->forward(o->online, ctx, batch->views);
  head_forward(head, ctx, o->online->feature);
  const double value = loss(loss_state, ctx, o->env.comm, head->out, dz);
  objective_backward_begins(o);
  // The trainer averages replica gradients weighted by sample count (b / B); B / b turns that
  // average back into the sum of every replica's part of the global loss's gradient.
  const float scale = (float)o->env.shard_to_global;
  for (size_t i = 0; i < (size_t)rows * head->out_dim && !ctx->dry_run; i++) dz[i] *= scale;
  head_backward(head, ctx, dz);
  o->online->backward(o->online, ctx, head->din);

  rec->views_grad = rows;
  rec->views_nograd = 0;
  rec->positives_per_query = 1;  // the other view of the same image
  rec->negatives_per_query = 0;  // the batch statistics take the place of negatives
  rec->encodings_next_new = rows;
  rec->encodings_next_reused = 0;
  // The loss is already the global batch's (its statistics are gathered): weighted by samples,
  // the replicas' parts average back to it.
  return (ObjectiveLoss){value * b, b};
}
