// C = op(A) op(B) for fixed 2-D shapes (oneDNN matmul), op = optional transpose expressed through
// the memory descriptor's strides, so no data is copied. Used by losses (similarity matrices)
// and their gradients; counts 2*M*K*N FLOPs to the given component and direction.
#pragma once
#include "core/dnnl_prim.h"

typedef struct {
  int M, K, N, trans_a, trans_b;
  MemComponent comp;
  int is_backward;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c;
} Matmul;

// A is (M, K) row-major, or (K, M) when trans_a; B is (K, N), or (N, K) when trans_b; C (M, N).
void matmul_init(Matmul *m, ExecCtx *ctx, int M, int K, int N, int trans_a, int trans_b,
                 MemComponent comp, int is_backward);
// The same with A's and C's rows `lda` and `ldc` floats apart (0: packed), e.g. C written into
// columns of a wider matrix.
void matmul_init_ld(Matmul *m, ExecCtx *ctx, int M, int K, int N, int trans_a, int trans_b, int lda,
                    int ldc, MemComponent comp, int is_backward);
void matmul_run(Matmul *m, ExecCtx *ctx, const float *a, const float *b, float *c);
void matmul_destroy(Matmul *m);
