// The step VICReg and Barlow Twins share: both views of every image through the online encoder
// and a head with backward, and a loss that is a statistic of the global batch's embeddings
// (gathered from every replica), so it returns one global value and the gradient of this
// replica's rows of it. No negatives, no momentum encoder, nothing kept between steps.
#pragma once
#include "objectives/objective.h"

// The loss on this replica's embeddings z (2b, d), view a's rows then view b's: the global value,
// and its gradient for these rows in dz (2b, d).
typedef double (*GlobalBatchLoss)(void *loss, ExecCtx *ctx, Comm *comm, const float *z, float *dz);

// Statistics over one sample (a standard deviation, a covariance) are undefined: 0 with tl_fail
// when the global batch has fewer than 2 images, `statistics` saying what needs them ("its
// variance and covariance need").
int two_view_batch_ok(const ObjectiveEnv *env, const char *statistics);
// One step of o on `batch` (2 views of b samples): encoder and head forward, `loss`, backward of
// dz (2b, head->out_dim) through both. Fills the record's view and comparison counts.
ObjectiveLoss two_view_step(Objective *o, ProjectionHead *head, GlobalBatchLoss loss,
                            void *loss_state, float *dz, const Batch *batch, LedgerRecord *rec);
