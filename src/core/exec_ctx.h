// One replica's oneDNN execution context: engine, stream, the shared user-managed scratchpad
// (so the ledger counts it), and the FLOP counters every op adds its own analytic count to. It
// executes and holds no policy: how a network is built (precision, recompute, convolution
// algorithm, BatchNorm groups and sync, the component it counts to) travels in the Builder
// (ops/builder.h), and each op keeps what it needs of it.
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/error.h"

// oneDNN running out of memory (its own buffers, or the JIT code of a kernel, under an
// address-space limit or --no-memory-check) is the machine's limit, not a defect: exit 1 with a
// line that says so. Any other failure is a bug.
#define DNNL_CHECK(call)                                                 \
  do {                                                                   \
    dnnl_status_t status_ = (call);                                      \
    if (status_ == dnnl_out_of_memory) dnnl_out_of_memory_exit(#call);   \
    if (status_ != dnnl_success)                                         \
      TL_DIE("oneDNN call failed (status %d): %s", (int)status_, #call); \
  } while (0)
_Noreturn void dnnl_out_of_memory_exit(const char *call);

// Whether oneDNN runs AVX-512 (avx512_core) kernels on this CPU: blocked nChw16c activations and
// Winograd convolutions are native there only.
int cpu_has_avx512(void);
// Whether oneDNN runs bf16 natively on this CPU (AVX512-BF16 or AMX): what train.precision = auto
// takes bf16 for.
int cpu_has_native_bf16(void);

typedef struct ExecCtx ExecCtx;

struct ExecCtx {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  // Shared scratchpad for all primitives of this replica; they run one at a time.
  void *scratchpad;
  size_t scratchpad_bytes;
  dnnl_memory_t scratchpad_mem;     // the whole buffer as one u8 memory, passed to every primitive
  MemCategory scratchpad_category;  // MEM_WORKSPACE; MEM_EVAL for the evaluation context
  // Planning: primitives are created and FLOPs counted, but nothing executes.
  int dry_run;
  // Analytic FLOPs (multiply-add = 2) added by ops as they execute, reset by the trainer per step.
  double flops_forward[COMP_NCOMP];
  double flops_backward[COMP_NCOMP];
  // The part of the above (forward and backward, every component) that convolution passes run by
  // Winograd kernels added: still the direct count, the arithmetic of the model.
  double flops_winograd;
};

// Builds what oneDNN builds only on first execution, never at primitive creation: the JIT
// kernels of its gemm (which the f32 inner products of every head run on), the code pages of its
// gemm driver and the OpenMP worker threads with their stacks. A plan, whose networks are built
// in dry run and never execute, calls it before it takes its process's resident memory, so that
// memory includes what a training's first step adds to it (about 5 MiB here).
void exec_build_lazy_kernels(void);

void exec_ctx_init(ExecCtx *ctx);
void exec_ctx_destroy(ExecCtx *ctx);
void exec_ctx_reset_flops(ExecCtx *ctx);
double exec_ctx_total_flops(const ExecCtx *ctx);

// Attribute with user-managed scratchpad: every primitive descriptor is created with this.
dnnl_primitive_attr_t dnnl_ctx_attr(void);
