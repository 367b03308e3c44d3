#include "objectives/prototypes.h"

#include <string.h>

#include "ops/builder.h"

void prototypes_init(Prototypes *p, ExecCtx *ctx, ParamSet *ps, const char *name, int rows, int dim,
                     int K, int train) {
  memset(p, 0, sizeof *p);
  p->rows = rows, p->dim = dim, p->K = K;
  const MemCategory kept = train ? MEM_ACT : MEM_WORKSPACE;
  p->v = paramset_take(ps, name, (size_t)K * dim, 0, &p->dv);
  long shape[2] = {K, dim};
  paramset_set_shape(ps, 2, shape);
  paramset_init_normal(ps, p->v, (size_t)K * dim, 0.02f);
  const Builder head = {.ctx = ctx, .mode = train ? OP_TRAIN : OP_FORWARD, .component = COMP_HEAD};
  l2norm_init(&p->w_unit, &head, K, dim, 0);
  l2norm_init(&p->z_unit, &head, rows, dim, 1);
  p->logits = tl_alloc(sizeof(float) * (size_t)rows * K, kept, COMP_HEAD);
  matmul_init(&p->fwd, ctx, rows, dim, K, 0, 1, COMP_HEAD, 0);
  if (!train) return;
  paramset_grad_expect(ps, p->dv, 1);  // one backward a step writes it
  matmul_init(&p->dz_mm, ctx, rows, K, dim, 0, 0, COMP_HEAD, 1);
  matmul_init(&p->dw_mm, ctx, K, rows, dim, 1, 0, COMP_HEAD, 1);
  p->dz_unit = tl_alloc(sizeof(float) * (size_t)rows * dim, MEM_ACT_GRAD, COMP_HEAD);
  p->dw_unit = tl_alloc(sizeof(float) * (size_t)K * dim, MEM_ACT_GRAD, COMP_HEAD);
}

void prototypes_forward(Prototypes *p, ExecCtx *ctx, const float *z) {
  l2norm_forward(&p->w_unit, ctx, p->v);
  l2norm_forward(&p->z_unit, ctx, z);
  matmul_run(&p->fwd, ctx, p->z_unit.out, p->w_unit.out, p->logits);
}

void prototypes_backward(Prototypes *p, ExecCtx *ctx, const ParamSet *ps, const float *dlogits) {
  matmul_run(&p->dz_mm, ctx, dlogits, p->w_unit.out, p->dz_unit);
  matmul_run(&p->dw_mm, ctx, dlogits, p->z_unit.out, p->dw_unit);
  const size_t nv = (size_t)p->K * p->dim;
  float *target = paramset_grad_target(ps, p->dv, nv, paramset_grad_accumulates(ps, p->dv), 0);
  l2norm_backward_to(&p->w_unit, ctx, p->dw_unit, target);
  // Frozen, the same work is counted (a plan's step is every step's) and its result dropped.
  if (p->frozen && !ctx->dry_run) memset(target, 0, sizeof(float) * nv);
  l2norm_backward(&p->z_unit, ctx, p->dz_unit);
  if (!ctx->dry_run && target != p->dv) paramset_grad_commit(ps, p->dv, target, nv);
  paramset_grad_contributed(ps, p->dv, nv);
}

void prototypes_destroy(Prototypes *p) {
  matmul_destroy(&p->fwd);
  if (p->dz_unit) {
    matmul_destroy(&p->dz_mm);
    matmul_destroy(&p->dw_mm);
  }
  l2norm_destroy(&p->w_unit);
  l2norm_destroy(&p->z_unit);
  float *bufs[] = {p->logits, p->dz_unit, p->dw_unit};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tl_free(bufs[i]);
}
