// Where Tally meets oneDNN's C API: memory descriptors and primitive descriptors, one creator per
// primitive kind, in Tally's shape. The API changed between the versions distributions ship:
// oneDNN 2.x fills an op descriptor (dnnl_*_desc_init) and then creates a primitive descriptor from
// it, with memory descriptors as structs passed by value; 3.x creates the primitive descriptor in
// one call per kind and makes a memory descriptor a handle that is created, queried and destroyed.
// dnnl_seam.c is the one file that knows which it is built against; everything else sees this.
//
// A creator returns the primitive descriptor, or NULL when the library has no implementation for
// it (an algorithm this version or CPU lacks: Winograd in 3.x), so the caller can fall back;
// every other failure ends the run. The context adopts what is kept (dnnl_ctx_adopt: the
// primitive, the scratchpad). Backward creators take the forward's descriptor as `hint`.
// Every descriptor is created with the context's user-managed scratchpad.
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

typedef struct ExecCtx ExecCtx;

// An owned memory descriptor (a heap copy of the struct in 2.x, the library's handle in 3.x).
// Made by dnnl_md_* or dnnl_pd_md, destroyed by dnnl_md_destroy; NULL stands for "none" (no bias).
// Memories and primitive descriptors keep their own copies, so an op destroys its descriptors
// once its primitives are created.
typedef struct DnnlMdHandle *DnnlMd;

// Dense descriptors in the order of `tag` (dnnl_format_tag_any: the primitive chooses).
DnnlMd dnnl_md_typed(int ndims, const dnnl_dims_t dims, dnnl_data_type_t type,
                     dnnl_format_tag_t tag);
// The same in f32.
DnnlMd dnnl_md_plain(int ndims, const dnnl_dims_t dims, dnnl_format_tag_t tag);
// f32 with explicit strides (in elements): views with gaps or transposed.
DnnlMd dnnl_md_strided(int ndims, const dnnl_dims_t dims, const dnnl_dims_t strides);
// The same in `type` (bf16 views of bf16 activations).
DnnlMd dnnl_md_strided_typed(int ndims, const dnnl_dims_t dims, const dnnl_dims_t strides,
                             dnnl_data_type_t type);
// A copy of a primitive descriptor's memory descriptor (e.g. dnnl_query_weights_md, index 0).
DnnlMd dnnl_pd_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index);
// Bytes of a primitive descriptor's memory descriptor (0 when it has none: no scratchpad).
size_t dnnl_pd_md_bytes(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index);
// The dimensions of a primitive descriptor's memory descriptor into `dims`; returns their number
// (0 when it has none).
int dnnl_pd_md_dims(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int index, dnnl_dims_t dims);
size_t dnnl_md_bytes(DnnlMd md);
int dnnl_md_equal(DnnlMd a, DnnlMd b);
void dnnl_md_destroy(DnnlMd md);  // NULL: nothing

// A memory object on the context's engine with no data yet; bind a pointer before each execution.
dnnl_memory_t dnnl_mem_new(ExecCtx *ctx, DnnlMd md);

// --- Primitive descriptors, one creator per kind. Spatial arrays have 2 entries (height,
// width); padding is the same on both sides.
dnnl_primitive_desc_t dnnl_pd_conv_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, dnnl_alg_kind_t alg,
                                           DnnlMd src, DnnlMd weights, DnnlMd bias, DnnlMd dst,
                                           const dnnl_dims_t strides, const dnnl_dims_t padding);
dnnl_primitive_desc_t dnnl_pd_conv_backward_data(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                                 DnnlMd weights, DnnlMd diff_dst,
                                                 const dnnl_dims_t strides,
                                                 const dnnl_dims_t padding,
                                                 const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_conv_backward_weights(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src,
                                                    DnnlMd diff_weights, DnnlMd diff_bias,
                                                    DnnlMd diff_dst, const dnnl_dims_t strides,
                                                    const dnnl_dims_t padding,
                                                    const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_inner_product_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd src,
                                                    DnnlMd weights, DnnlMd bias, DnnlMd dst);
dnnl_primitive_desc_t dnnl_pd_inner_product_backward_data(ExecCtx *ctx, DnnlMd diff_src,
                                                          DnnlMd weights, DnnlMd diff_dst,
                                                          const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_inner_product_backward_weights(ExecCtx *ctx, DnnlMd src,
                                                             DnnlMd diff_weights, DnnlMd diff_bias,
                                                             DnnlMd diff_dst,
                                                             const_dnnl_primitive_desc_t hint);
// dst = scale * (src x weights), batched over the leading dimensions.
dnnl_primitive_desc_t dnnl_pd_matmul(ExecCtx *ctx, DnnlMd src, DnnlMd weights, DnnlMd dst,
                                     float scale);
dnnl_primitive_desc_t dnnl_pd_binary(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0, DnnlMd src1,
                                     DnnlMd dst);
// The same added to what dst holds (a sum post-op): dst += src0 alg src1.
dnnl_primitive_desc_t dnnl_pd_binary_accumulate(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src0,
                                                DnnlMd src1, DnnlMd dst);
// Reduction of src over the dimensions dst has as 1 (alg dnnl_reduction_*, p and eps as oneDNN
// defines them: norm_lp_max is max(sum |x|^p, eps)^(1/p)).
dnnl_primitive_desc_t dnnl_pd_reduction(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                        float p, float eps);
// Element-wise over `data` (source, destination and their gradients alike), alpha = beta = 0.
dnnl_primitive_desc_t dnnl_pd_eltwise_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data);
dnnl_primitive_desc_t dnnl_pd_eltwise_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_pooling_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd src, DnnlMd dst,
                                              const dnnl_dims_t strides, const dnnl_dims_t kernel,
                                              const dnnl_dims_t padding);
dnnl_primitive_desc_t dnnl_pd_pooling_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd diff_src,
                                               DnnlMd diff_dst, const dnnl_dims_t strides,
                                               const dnnl_dims_t kernel, const dnnl_dims_t padding,
                                               const_dnnl_primitive_desc_t hint);
// Softmax along `axis` of `data` (alg dnnl_softmax_accurate or dnnl_softmax_log).
dnnl_primitive_desc_t dnnl_pd_softmax_forward(ExecCtx *ctx, dnnl_prop_kind_t prop,
                                              dnnl_alg_kind_t alg, DnnlMd data, int axis);
dnnl_primitive_desc_t dnnl_pd_softmax_backward(ExecCtx *ctx, dnnl_alg_kind_t alg, DnnlMd data,
                                               int axis, const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_layer_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 DnnlMd stat, float eps, unsigned flags);
dnnl_primitive_desc_t dnnl_pd_layer_norm_backward(ExecCtx *ctx, DnnlMd data, DnnlMd stat, float eps,
                                                  unsigned flags, const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_batch_norm_forward(ExecCtx *ctx, dnnl_prop_kind_t prop, DnnlMd data,
                                                 float eps, unsigned flags);
dnnl_primitive_desc_t dnnl_pd_batch_norm_backward(ExecCtx *ctx, DnnlMd data, float eps,
                                                  unsigned flags, const_dnnl_primitive_desc_t hint);
dnnl_primitive_desc_t dnnl_pd_reorder(ExecCtx *ctx, DnnlMd src, DnnlMd dst);

// Whether batch normalization backward with a shift takes DNNL_ARG_SHIFT at execution, although
// dbeta does not depend on it: oneDNN 2.x requires it, 3.x rejects it as one input too many.
int dnnl_batch_norm_backward_reads_shift(void);
