#include "ops/linear.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Weight layouts. Forward is 3-17% faster with the layout oneDNN picks (`any`: blocked weights for
// brgemm) than with plain `oi` (gemm:jit), even counting the per-step reorder of the weights
// (about 0.01 ms; one thread, M = 4352..16640, IC/OC = 128..512, the vit-tiny shapes), so forward
// reads a blocked copy made from the plain parameters at each call. Backward data is no faster
// that way in f32 and works on the plain (OC, IC) parameter; in bf16 it reads a copy in the layout
// it picks too, as its brgemm_bwd_d kernel is faster than gemm:jit on plain bf16 weights (AMD EPYC,
// 2 cores, AVX512-BF16, 2026-12-06, machine shared, mae/vit-tiny at batch 256, its share of a
// step: oneDNN 2.6.3 15-35% against 9-14%, 3.7.2 15% against 11%). Backward weights depends on the
// shape (Intel Xeon with AVX-512, 2 threads, M = 33280, best of 7, ms, plain gemm:jit against
// blocked brgemm_bwd_w): widening layers run faster blocked (128->512: 29.2 against 20.2;
// 128->384: 20.5 against 14.9), a narrowing one slower (512->128: 18.5 against 26.7), square ones
// the same (128->128: 5.3 against 5.2). So a layer with more outputs than inputs writes its weight
// gradient blocked and reorders it into the plain gradient (a few hundred KiB a step); the others
// write the plain gradient directly.
//
// Under [train] precision = bf16 the primitives read bf16 weights (forward's blocked copy, and a
// plain one for backward data). On f32 activations they read bf16 copies of the input (made in
// forward, kept for backward weights) and of the output gradient, and write f32 outputs and input
// gradients; on a network's bf16 activations (the builder's act_type: a transformer stack's) they
// read the input and output gradient where they are and write bf16, no copy made. Weight and bias
// gradients stay f32. The passes, the copies and the gradient's way into the parameter set are
// those of every weighted op (ops/weighted.h).
// Whether backward weights writes a blocked gradient (see above): widening layers whose channel
// counts are whole blocks of 64 (vit-tiny's). Taken for any widening layer, the AddressSanitizer
// build of test_dino (a small head with partial blocks) crashed inside the sanitizer's allocator
// in about half its runs, the mark of generated code writing past a buffer where the sanitizer
// does not look; with whole blocks only, that is back to the rate without this path.
static int linear_grad_blocked_wanted(int IC, int OC) {
  return OC > IC && IC % 64 == 0 && OC % 64 == 0;
}

// One output (M, OC) in the builder's activation type.
static size_t linear_out_bytes(const Linear *l, const Builder *b) {
  return (size_t)l->M * l->OC * builder_act_bytes(b);
}

// The forward's weights in the layout it chooses; backward data's plain (OC, IC); backward weights'
// gradient blocked where that is faster, else written into the plain gradient (see above).
static void linear_describe(const Linear *l, const Builder *b, WeightedDescs *d) {
  dnnl_data_type_t type = builder_compute_type(b);
  dnnl_dims_t src_dims = {l->M, l->IC}, weight_dims = {l->OC, l->IC}, bias_dims = {l->OC},
              dst_dims = {l->M, l->OC};
  d->src_in = dnnl_md_typed(2, src_dims, builder_input_type(b), dnnl_ab);
  d->src = dnnl_md_typed(2, src_dims, type, dnnl_ab);
  d->dst = dnnl_md_typed(2, dst_dims, builder_act_type(b), dnnl_ab);
  d->diff_dst = dnnl_md_typed(2, dst_dims, type, dnnl_ab);
  d->w_plain = dnnl_md_plain(2, weight_dims, dnnl_oi);
  d->w_fwd = dnnl_md_typed(2, weight_dims, type, dnnl_format_tag_any);
  d->w_bwd_data =
      dnnl_md_typed(2, weight_dims, type, type == dnnl_bf16 ? dnnl_format_tag_any : dnnl_oi);
  d->dw = linear_grad_blocked_wanted(l->IC, l->OC)
              ? dnnl_md_plain(2, weight_dims, dnnl_format_tag_any)
              : d->w_plain;
  d->bias = l->has_bias ? dnnl_md_plain(1, bias_dims, dnnl_a) : NULL;
}

static void linear_take_params(Linear *l, Builder *b, const char *name, float init_std) {
  const int IC = l->IC, OC = l->OC;
  char pname[64];
  snprintf(pname, sizeof pname, "%s.weight", name);
  l->weight = paramset_take(b->params, pname, (size_t)OC * (size_t)IC, 0, &l->dweight);
  paramset_set_shape(b->params, 2, (long[]){OC, IC});
  if (init_std > 0)
    paramset_init_normal(b->params, l->weight, (size_t)OC * (size_t)IC, init_std);
  else
    paramset_init_uniform(b->params, l->weight, (size_t)OC * (size_t)IC,
                          sqrtf(6.0f / (float)(IC + OC)));
  if (l->has_bias) {
    snprintf(pname, sizeof pname, "%s.bias", name);
    l->bias = paramset_take(b->params, pname, (size_t)OC, 1, &l->dbias);
    paramset_init_const(b->params, l->bias, (size_t)OC, 0.0f);
  }
}

void linear_init(Linear *l, Builder *b, const char *name, int M, int IC, int OC, int has_bias,
                 int need_din, float init_std) {
  if (M <= 0 || IC <= 0 || OC <= 0) TL_DIE("linear %s: bad shape (%d, %d) -> %d", name, M, IC, OC);
  memset(l, 0, sizeof *l);
  l->M = M;
  l->IC = IC;
  l->OC = OC;
  l->has_bias = has_bias;
  l->mode = b->mode;
  l->need_din = need_din && b->mode == OP_TRAIN;
  l->comp = b->component;
  op_calls_init(&l->calls, b);
  linear_take_params(l, b, name, init_std);
  WeightedDescs d = {0};
  linear_describe(l, b, &d);
  // A multiply-add per weight and row, each pass; the bias add is not counted.
  const WeightedSpec spec = {
      .need_din = l->need_din,
      .pass_flops = 2.0 * M * (double)IC * OC,
      .weight_count = (size_t)OC * IC,
      .bias_count = has_bias ? (size_t)OC : 0,
  };
  l->passes =
      weighted_create(b, &spec, &d, &(WeightedOp)WEIGHTED_OP(l, "linear", linear_out_bytes(l, b)));
  weighted_descs_destroy(&d);
}

void linear_forward(Linear *l, ExecCtx *ctx, const float *in) {
  weighted_forward(l->passes, ctx, in);
}

void linear_backward(Linear *l, ExecCtx *ctx, const float *dout) {
  weighted_backward(l->passes, ctx, dout);
}

int linear_backward_reads_input(const Linear *l) { return weighted_reads_input(l->passes); }

int linear_weight_grad_blocked(const Linear *l) { return weighted_grad_reordered(l->passes); }

void linear_destroy(Linear *l) {
  weighted_destroy(l->passes);
  op_buffer_free(l->out_slots, l->calls.out_pooled);
  op_buffer_free(l->din, l->calls.din_pooled);
  memset(l, 0, sizeof *l);
}
