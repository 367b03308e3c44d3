// The one file that knows which oneDNN it is built against (see dnnl_seam.h). Where the two APIs
// take the same arguments (memory creation, reorders, sizes) the code is shared; each primitive
// kind's creator is written once per API.
#include "core/dnnl_seam.h"

#include <oneapi/dnnl/dnnl_version.h>
#include <stdlib.h>

#include "core/exec_ctx.h"

#if DNNL_VERSION_MAJOR >= 3
// 3.x: DnnlMd is the library's handle under Tally's name.
#define LIB_MD(md) ((const_dnnl_memory_desc_t)(const void *)(md))
static DnnlMd md_own(dnnl_memory_desc_t md) { return (DnnlMd)(void *)md; }
#else
// 2.x: the struct, copied to the heap so that it is passed and owned like 3.x's handle.
struct DnnlMdHandle {
  dnnl_memory_desc_t desc;
};
#define LIB_MD(md) ((md) ? &(md)->desc : NULL)
static DnnlMd md_own(const dnnl_memory_desc_t *desc) {
  DnnlMd md = malloc(sizeof *md);
  if (!md) TL_DIE("out of memory");
  md->desc = *desc;
  return md;
}
#endif

// A primitive descriptor, or NULL when the library has none for it.
static dnnl_primitive_desc_t pd_or_null(dnnl_status_t status, dnnl_primitive_desc_t pd,
                                        const char *kind) {
  if (status == dnnl_unimplemented) return NULL;
  if (status != dnnl_success)
    TL_DIE("oneDNN could not create a %s primitive descriptor (status %d)", kind, (int)status);
  return pd;
}

// --- Memory descriptors

DnnlMd dnnl_md_typed(int ndims, const dnnl_dims_t dims, dnnl_data_type_t type,
                     dnnl_format_tag_t tag) {
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_t md;
  DNNL_CHECK(dnnl_memory_desc_create_with_tag(&md, ndims, dims, type, tag));
  return md_own(md);
#else
  dnnl_memory_desc_t md;
  DNNL_CHECK(dnnl_memory_desc_init_by_tag(&md, ndims, dims, type, tag));
  return md_own(&md);
#endif
}

DnnlMd dnnl_md_plain(int ndims, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
  return dnnl_md_typed(ndims, dims, dnnl_f32, tag);
}

DnnlMd dnnl_md_strided_typed(int ndims, const dnnl_dims_t dims, const dnnl_dims_t strides,
                             dnnl_data_type_t type) {
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_t md;
  DNNL_CHECK(dnnl_memory_desc_create_with_strides(&md, ndims, dims, type, strides));
  return md_own(md);
#else
  dnnl_memory_desc_t md;
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md, ndims, dims, type, strides));
  return md_own(&md);
#endif
}

DnnlMd dnnl_md_strided(int ndims, const dnnl_dims_t dims, const dnnl_dims_t strides) {
  return dnnl_md_strided_typed(ndims, dims, strides, dnnl_f32);
}

DnnlMd dnnl_pd_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index) {
  // A pointer to the descriptor's own copy in 2.x, its handle in 3.x: either way not ours.
  const void *queried = dnnl_primitive_desc_query_md(pd, what, index);
  if (!queried) TL_DIE("primitive descriptor has no memory descriptor for query %d", (int)what);
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_t md;
  DNNL_CHECK(dnnl_memory_desc_clone(&md, queried));
  return md_own(md);
#else
  return md_own(queried);
#endif
}

size_t dnnl_pd_md_bytes(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index) {
  // The same call in both APIs: a pointer to a struct in 2.x, a handle in 3.x.
  const void *md = dnnl_primitive_desc_query_md(pd, what, index);
  return md ? dnnl_memory_desc_get_size(md) : 0;
}

int dnnl_pd_md_dims(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index,
                    dnnl_dims_t dims) {
  const void *md = dnnl_primitive_desc_query_md(pd, what, index);
  if (!md) return 0;
#if DNNL_VERSION_MAJOR >= 3
  int ndims = 0;
  const dnnl_dim_t *d = NULL;
  DNNL_CHECK(dnnl_memory_desc_query(md, dnnl_query_ndims_s32, &ndims));
  DNNL_CHECK(dnnl_memory_desc_query(md, dnnl_query_dims, &d));
#else
  const int ndims = ((const dnnl_memory_desc_t *)md)->ndims;
  const dnnl_dim_t *d = ((const dnnl_memory_desc_t *)md)->dims;
#endif
  for (int i = 0; i < ndims; i++) dims[i] = d[i];
  return ndims;
}

size_t dnnl_md_bytes(DnnlMd md) { return dnnl_memory_desc_get_size(LIB_MD(md)); }

int dnnl_md_equal(DnnlMd a, DnnlMd b) { return dnnl_memory_desc_equal(LIB_MD(a), LIB_MD(b)); }

void dnnl_md_destroy(DnnlMd md) {
  if (!md) return;
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_destroy((dnnl_memory_desc_t)(void *)md);
#else
  free(md);
#endif
}

dnnl_memory_t dnnl_mem_new(ExecCtx *ctx, DnnlMd md) {
  dnnl_memory_t m;
  DNNL_CHECK(dnnl_memory_create(&m, LIB_MD(md), ctx->engine, DNNL_MEMORY_NONE));
  return m;
}

dnnl_primitive_desc_t dnnl_pd_reorder(ExecCtx *ctx, DnnlMd src, DnnlMd dst) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t status = dnnl_reorder_primitive_desc_create(
      &pd, LIB_MD(src), ctx->engine, LIB_MD(dst), ctx->engine, dnnl_ctx_attr());
  return pd_or_null(status, pd, "reorder");
}

int dnnl_batch_norm_backward_reads_shift(void) { return DNNL_VERSION_MAJOR < 3; }

// --- Primitive descriptors

#if DNNL_VERSION_MAJOR >= 3

// 3.x takes dilations (none: zeros) where 2.x had none.
static const dnnl_dims_t no_dilation = {0, 0};

dnnl_primitive_desc_t dnnl_pd_conv_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, dnnl_alg_kind_t alg,
                                           DnnlMd src, DnnlMd weights, DnnlMd bias, DnnlMd dst,
                                           const dnnl_dims_t strides, const dnnl_dims_t padding) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_convolution_forward_primitive_desc_create(
      &pd, ctx->engine, prop, alg, LIB_MD(src), LIB_MD(weights), LIB_MD(bias), LIB_MD(dst), strides,
      no_dilation, padding, padding, dnnl_ctx_attr());
  return pd_or_null(s, pd, "convolution forward");
}

dnnl_primitive_desc_t dnnl_pd_conv_backward_data(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                                 DnnlMd weights, DnnlMd diff_dst,
                                                 const dnnl_dims_t strides,
                                                 const dnnl_dims_t padding,
                                                 const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_convolution_backward_data_primitive_desc_create(
      &pd, ctx->engine, alg, LIB_MD(diff_src), LIB_MD(weights), LIB_MD(diff_dst), strides,
      no_dilation, padding, padding, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "convolution backward data");
}

dnnl_primitive_desc_t dnnl_pd_conv_backward_weights(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src,
                                                    DnnlMd diff_weights, DnnlMd diff_bias,
                                                    DnnlMd diff_dst, const dnnl_dims_t strides,
                                                    const dnnl_dims_t padding,
                                                    const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_convolution_backward_weights_primitive_desc_create(
      &pd, ctx->engine, alg, LIB_MD(src), LIB_MD(diff_weights), LIB_MD(diff_bias), LIB_MD(diff_dst),
      strides, no_dilation, padding, padding, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "convolution backward weights");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd src,
                                                    DnnlMd weights, DnnlMd bias, DnnlMd dst) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_inner_product_forward_primitive_desc_create(
      &pd, ctx->engine, prop, LIB_MD(src), LIB_MD(weights), LIB_MD(bias), LIB_MD(dst),
      dnnl_ctx_attr());
  return pd_or_null(s, pd, "inner product forward");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_backward_data(ExecCtx *ctx, DnnlMd diff_src,
                                                          DnnlMd weights, DnnlMd diff_dst,
                                                          const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_inner_product_backward_data_primitive_desc_create(
      &pd, ctx->engine, LIB_MD(diff_src), LIB_MD(weights), LIB_MD(diff_dst), hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "inner product backward data");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_backward_weights(ExecCtx *ctx, DnnlMd src,
                                                             DnnlMd diff_weights, DnnlMd diff_bias,
                                                             DnnlMd diff_dst,
                                                             const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_inner_product_backward_weights_primitive_desc_create(
      &pd, ctx->engine, LIB_MD(src), LIB_MD(diff_weights), LIB_MD(diff_bias), LIB_MD(diff_dst),
      hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "inner product backward weights");
}

dnnl_primitive_desc_t dnnl_pd_matmul(ExecCtx *ctx, DnnlMd src, DnnlMd weights, DnnlMd dst,
                                     float scale) {
  // 3.x has no output scales; a scale on the destination would need a memory argument at every
  // execution, so it rides on a linear post-op (scale * x + 0) instead.
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_clone(&attr, dnnl_ctx_attr()));
  if (scale != 1.0f) {
    dnnl_post_ops_t ops;
    DNNL_CHECK(dnnl_post_ops_create(&ops));
    DNNL_CHECK(dnnl_post_ops_append_eltwise(ops, dnnl_eltwise_linear, scale, 0.0f));
    DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
    DNNL_CHECK(dnnl_post_ops_destroy(ops));
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_matmul_primitive_desc_create(&pd, ctx->engine, LIB_MD(src),
                                                      LIB_MD(weights), NULL, LIB_MD(dst), attr);
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return pd_or_null(s, pd, "matmul");
}

static dnnl_primitive_desc_t binary_pd(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0, DnnlMd src1,
                                       DnnlMd dst, const_dnnl_primitive_attr_t attr) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_binary_primitive_desc_create(&pd, ctx->engine, alg, LIB_MD(src0),
                                                      LIB_MD(src1), LIB_MD(dst), attr);
  return pd_or_null(s, pd, "binary");
}

static void append_sum(dnnl_post_ops_t ops) {
  DNNL_CHECK(dnnl_post_ops_append_sum(ops, 1.0f, 0, dnnl_data_type_undef));
}

dnnl_primitive_desc_t dnnl_pd_reduction(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                        float p, float eps) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_reduction_primitive_desc_create(&pd, ctx->engine, alg, LIB_MD(src),
                                                         LIB_MD(dst), p, eps, dnnl_ctx_attr());
  return pd_or_null(s, pd, "reduction");
}

dnnl_primitive_desc_t dnnl_pd_eltwise_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_eltwise_forward_primitive_desc_create(
      &pd, ctx->engine, prop, alg, LIB_MD(data), LIB_MD(data), 0.f, 0.f, dnnl_ctx_attr());
  return pd_or_null(s, pd, "eltwise forward");
}

dnnl_primitive_desc_t dnnl_pd_eltwise_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s =
      dnnl_eltwise_backward_primitive_desc_create(&pd, ctx->engine, alg, LIB_MD(data), LIB_MD(data),
                                                  LIB_MD(data), 0.f, 0.f, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "eltwise backward");
}

dnnl_primitive_desc_t dnnl_pd_pooling_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                              const dnnl_dims_t strides, const dnnl_dims_t kernel,
                                              const dnnl_dims_t padding) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_pooling_forward_primitive_desc_create(
      &pd, ctx->engine, prop, alg, LIB_MD(src), LIB_MD(dst), strides, kernel, no_dilation, padding,
      padding, dnnl_ctx_attr());
  return pd_or_null(s, pd, "pooling forward");
}

dnnl_primitive_desc_t dnnl_pd_pooling_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                               DnnlMd diff_dst, const dnnl_dims_t strides,
                                               const dnnl_dims_t kernel, const dnnl_dims_t padding,
                                               const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_pooling_backward_primitive_desc_create(
      &pd, ctx->engine, alg, LIB_MD(diff_src), LIB_MD(diff_dst), strides, kernel, no_dilation,
      padding, padding, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "pooling backward");
}

dnnl_primitive_desc_t dnnl_pd_softmax_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data, int axis) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_softmax_forward_primitive_desc_create(
      &pd, ctx->engine, prop, alg, LIB_MD(data), LIB_MD(data), axis, dnnl_ctx_attr());
  return pd_or_null(s, pd, "softmax forward");
}

dnnl_primitive_desc_t dnnl_pd_softmax_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               int axis, const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_softmax_backward_primitive_desc_create(
      &pd, ctx->engine, alg, LIB_MD(data), LIB_MD(data), LIB_MD(data), axis, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "softmax backward");
}

dnnl_primitive_desc_t dnnl_pd_layer_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 DnnlMd stat, float eps, unsigned flags) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_layer_normalization_forward_primitive_desc_create(
      &pd, ctx->engine, prop, LIB_MD(data), LIB_MD(data), LIB_MD(stat), eps, flags,
      dnnl_ctx_attr());
  return pd_or_null(s, pd, "layer normalization forward");
}

dnnl_primitive_desc_t dnnl_pd_layer_norm_backward(ExecCtx *ctx, DnnlMd data, DnnlMd stat, float eps,
                                                  unsigned flags,
                                                  const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_layer_normalization_backward_primitive_desc_create(
      &pd, ctx->engine, dnnl_backward, LIB_MD(data), LIB_MD(data), LIB_MD(data), LIB_MD(stat), eps,
      flags, hint, dnnl_ctx_attr());
  return pd_or_null(s, pd, "layer normalization backward");
}

dnnl_primitive_desc_t dnnl_pd_batch_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 float eps, unsigned flags) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_batch_normalization_forward_primitive_desc_create(
      &pd, ctx->engine, prop, LIB_MD(data), LIB_MD(data), eps, flags, dnnl_ctx_attr());
  return pd_or_null(s, pd, "batch normalization forward");
}

dnnl_primitive_desc_t dnnl_pd_batch_norm_backward(ExecCtx *ctx, DnnlMd data, float eps,
                                                  unsigned flags,
                                                  const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_batch_normalization_backward_primitive_desc_create(
      &pd, ctx->engine, dnnl_backward, LIB_MD(data), LIB_MD(data), LIB_MD(data), eps, flags, hint,
      dnnl_ctx_attr());
  return pd_or_null(s, pd, "batch normalization backward");
}

#else  // oneDNN 2.x: an op descriptor, then the primitive descriptor from it.

// The primitive descriptor for a filled op descriptor (a DNNL_CHECK'd *_desc_init).
static dnnl_primitive_desc_t pd_from_desc(ExecCtx *ctx, const void *desc,
                                          const_dnnl_primitive_attr_t attr,
                                          const_dnnl_primitive_desc_t hint, const char *kind) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_primitive_desc_create(&pd, desc, attr, ctx->engine, hint);
  return pd_or_null(s, pd, kind);
}

dnnl_primitive_desc_t dnnl_pd_conv_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, dnnl_alg_kind_t alg,
                                           DnnlMd src, DnnlMd weights, DnnlMd bias, DnnlMd dst,
                                           const dnnl_dims_t strides, const dnnl_dims_t padding) {
  dnnl_convolution_desc_t d;
  DNNL_CHECK(dnnl_convolution_forward_desc_init(&d, prop, alg, LIB_MD(src), LIB_MD(weights),
                                                LIB_MD(bias), LIB_MD(dst), strides, padding,
                                                padding));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "convolution forward");
}

dnnl_primitive_desc_t dnnl_pd_conv_backward_data(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                                 DnnlMd weights, DnnlMd diff_dst,
                                                 const dnnl_dims_t strides,
                                                 const dnnl_dims_t padding,
                                                 const_dnnl_primitive_desc_t hint) {
  dnnl_convolution_desc_t d;
  DNNL_CHECK(dnnl_convolution_backward_data_desc_init(&d, alg, LIB_MD(diff_src), LIB_MD(weights),
                                                      LIB_MD(diff_dst), strides, padding, padding));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "convolution backward data");
}

dnnl_primitive_desc_t dnnl_pd_conv_backward_weights(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src,
                                                    DnnlMd diff_weights, DnnlMd diff_bias,
                                                    DnnlMd diff_dst, const dnnl_dims_t strides,
                                                    const dnnl_dims_t padding,
                                                    const_dnnl_primitive_desc_t hint) {
  dnnl_convolution_desc_t d;
  DNNL_CHECK(dnnl_convolution_backward_weights_desc_init(&d, alg, LIB_MD(src), LIB_MD(diff_weights),
                                                         LIB_MD(diff_bias), LIB_MD(diff_dst),
                                                         strides, padding, padding));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "convolution backward weights");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd src,
                                                    DnnlMd weights, DnnlMd bias, DnnlMd dst) {
  dnnl_inner_product_desc_t d;
  DNNL_CHECK(dnnl_inner_product_forward_desc_init(&d, prop, LIB_MD(src), LIB_MD(weights),
                                                  LIB_MD(bias), LIB_MD(dst)));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "inner product forward");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_backward_data(ExecCtx *ctx, DnnlMd diff_src,
                                                          DnnlMd weights, DnnlMd diff_dst,
                                                          const_dnnl_primitive_desc_t hint) {
  dnnl_inner_product_desc_t d;
  DNNL_CHECK(dnnl_inner_product_backward_data_desc_init(&d, LIB_MD(diff_src), LIB_MD(weights),
                                                        LIB_MD(diff_dst)));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "inner product backward data");
}

dnnl_primitive_desc_t dnnl_pd_inner_product_backward_weights(ExecCtx *ctx, DnnlMd src,
                                                             DnnlMd diff_weights, DnnlMd diff_bias,
                                                             DnnlMd diff_dst,
                                                             const_dnnl_primitive_desc_t hint) {
  dnnl_inner_product_desc_t d;
  DNNL_CHECK(dnnl_inner_product_backward_weights_desc_init(&d, LIB_MD(src), LIB_MD(diff_weights),
                                                           LIB_MD(diff_bias), LIB_MD(diff_dst)));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "inner product backward weights");
}

dnnl_primitive_desc_t dnnl_pd_matmul(ExecCtx *ctx, DnnlMd src, DnnlMd weights, DnnlMd dst,
                                     float scale) {
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_clone(&attr, dnnl_ctx_attr()));
  if (scale != 1.0f) DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale));
  dnnl_matmul_desc_t d;
  DNNL_CHECK(dnnl_matmul_desc_init(&d, LIB_MD(src), LIB_MD(weights), NULL, LIB_MD(dst)));
  dnnl_primitive_desc_t pd = pd_from_desc(ctx, &d, attr, NULL, "matmul");
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return pd;
}

static dnnl_primitive_desc_t binary_pd(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0, DnnlMd src1,
                                       DnnlMd dst, const_dnnl_primitive_attr_t attr) {
  dnnl_binary_desc_t d;
  DNNL_CHECK(dnnl_binary_desc_init(&d, alg, LIB_MD(src0), LIB_MD(src1), LIB_MD(dst)));
  return pd_from_desc(ctx, &d, attr, NULL, "binary");
}

static void append_sum(dnnl_post_ops_t ops) { DNNL_CHECK(dnnl_post_ops_append_sum(ops, 1.0f)); }

dnnl_primitive_desc_t dnnl_pd_reduction(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                        float p, float eps) {
  dnnl_reduction_desc_t d;
  DNNL_CHECK(dnnl_reduction_desc_init(&d, alg, LIB_MD(src), LIB_MD(dst), p, eps));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "reduction");
}

dnnl_primitive_desc_t dnnl_pd_eltwise_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data) {
  dnnl_eltwise_desc_t d;
  DNNL_CHECK(dnnl_eltwise_forward_desc_init(&d, prop, alg, LIB_MD(data), 0.f, 0.f));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "eltwise forward");
}

dnnl_primitive_desc_t dnnl_pd_eltwise_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               const_dnnl_primitive_desc_t hint) {
  dnnl_eltwise_desc_t d;
  DNNL_CHECK(dnnl_eltwise_backward_desc_init(&d, alg, LIB_MD(data), LIB_MD(data), 0.f, 0.f));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "eltwise backward");
}

dnnl_primitive_desc_t dnnl_pd_pooling_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                              const dnnl_dims_t strides, const dnnl_dims_t kernel,
                                              const dnnl_dims_t padding) {
  dnnl_pooling_desc_t d;
  DNNL_CHECK(dnnl_pooling_forward_desc_init(&d, prop, alg, LIB_MD(src), LIB_MD(dst), strides,
                                            kernel, padding, padding));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "pooling forward");
}

dnnl_primitive_desc_t dnnl_pd_pooling_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                               DnnlMd diff_dst, const dnnl_dims_t strides,
                                               const dnnl_dims_t kernel, const dnnl_dims_t padding,
                                               const_dnnl_primitive_desc_t hint) {
  dnnl_pooling_desc_t d;
  DNNL_CHECK(dnnl_pooling_backward_desc_init(&d, alg, LIB_MD(diff_src), LIB_MD(diff_dst), strides,
                                             kernel, padding, padding));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "pooling backward");
}

dnnl_primitive_desc_t dnnl_pd_softmax_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data, int axis) {
  dnnl_softmax_v2_desc_t d;
  DNNL_CHECK(dnnl_softmax_v2_forward_desc_init(&d, prop, alg, LIB_MD(data), LIB_MD(data), axis));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "softmax forward");
}

dnnl_primitive_desc_t dnnl_pd_softmax_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               int axis, const_dnnl_primitive_desc_t hint) {
  dnnl_softmax_v2_desc_t d;
  DNNL_CHECK(
      dnnl_softmax_v2_backward_desc_init(&d, alg, LIB_MD(data), LIB_MD(data), LIB_MD(data), axis));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "softmax backward");
}

dnnl_primitive_desc_t dnnl_pd_layer_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 DnnlMd stat, float eps, unsigned flags) {
  dnnl_layer_normalization_desc_t d;
  DNNL_CHECK(
      dnnl_layer_normalization_forward_desc_init(&d, prop, LIB_MD(data), LIB_MD(stat), eps, flags));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "layer normalization forward");
}

dnnl_primitive_desc_t dnnl_pd_layer_norm_backward(ExecCtx *ctx, DnnlMd data, DnnlMd stat, float eps,
                                                  unsigned flags,
                                                  const_dnnl_primitive_desc_t hint) {
  dnnl_layer_normalization_desc_t d;
  DNNL_CHECK(dnnl_layer_normalization_backward_desc_init(&d, dnnl_backward, LIB_MD(data),
                                                         LIB_MD(data), LIB_MD(stat), eps, flags));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "layer normalization backward");
}

dnnl_primitive_desc_t dnnl_pd_batch_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 float eps, unsigned flags) {
  dnnl_batch_normalization_desc_t d;
  DNNL_CHECK(dnnl_batch_normalization_forward_desc_init(&d, prop, LIB_MD(data), eps, flags));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), NULL, "batch normalization forward");
}

dnnl_primitive_desc_t dnnl_pd_batch_norm_backward(ExecCtx *ctx, DnnlMd data, float eps,
                                                  unsigned flags,
                                                  const_dnnl_primitive_desc_t hint) {
  dnnl_batch_normalization_desc_t d;
  DNNL_CHECK(dnnl_batch_normalization_backward_desc_init(&d, dnnl_backward, LIB_MD(data),
                                                         LIB_MD(data), eps, flags));
  return pd_from_desc(ctx, &d, dnnl_ctx_attr(), hint, "batch normalization backward");
}

#endif

// --- Both APIs alike, on the creators above.

dnnl_primitive_desc_t dnnl_pd_binary(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0, DnnlMd src1,
                                     DnnlMd dst) {
  return binary_pd(ctx, alg, src0, src1, dst, dnnl_ctx_attr());
}

dnnl_primitive_desc_t dnnl_pd_binary_accumulate(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0,
                                                DnnlMd src1, DnnlMd dst) {
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_clone(&attr, dnnl_ctx_attr()));
  dnnl_post_ops_t ops;
  DNNL_CHECK(dnnl_post_ops_create(&ops));
  append_sum(ops);
  DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
  DNNL_CHECK(dnnl_post_ops_destroy(ops));
  dnnl_primitive_desc_t pd = binary_pd(ctx, alg, src0, src1, dst, attr);
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return pd;
}
