#include "core/exec_ctx.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void exec_ctx_init(ExecCtx *ctx) {
  memset(ctx, 0, sizeof *ctx);
  DNNL_CHECK(dnnl_engine_create(&ctx->engine, dnnl_cpu, 0));
  DNNL_CHECK(dnnl_stream_create(&ctx->stream, ctx->engine, dnnl_stream_default_flags));
  ctx->scratchpad_category = MEM_WORKSPACE;
}

void exec_ctx_destroy(ExecCtx *ctx) {
  if (ctx->scratchpad_mem) dnnl_memory_destroy(ctx->scratchpad_mem);
  tl_free(ctx->scratchpad);
  dnnl_stream_destroy(ctx->stream);
  dnnl_engine_destroy(ctx->engine);
  memset(ctx, 0, sizeof *ctx);
}

void exec_ctx_reset_flops(ExecCtx *ctx) {
  memset(ctx->flops_forward, 0, sizeof ctx->flops_forward);
  memset(ctx->flops_backward, 0, sizeof ctx->flops_backward);
  ctx->flops_winograd = 0;
}

double exec_ctx_total_flops(const ExecCtx *ctx) {
  double s = 0;
  for (int c = 0; c < COMP_NCOMP; c++) s += ctx->flops_forward[c] + ctx->flops_backward[c];
  return s;
}

// One attribute for the whole process (read-only once made), destroyed at exit.
static dnnl_primitive_attr_t user_scratchpad_attr;
static pthread_once_t attr_once = PTHREAD_ONCE_INIT;

static void destroy_attr(void) { dnnl_primitive_attr_destroy(user_scratchpad_attr); }

static void make_attr(void) {
  DNNL_CHECK(dnnl_primitive_attr_create(&user_scratchpad_attr));
  DNNL_CHECK(
      dnnl_primitive_attr_set_scratchpad_mode(user_scratchpad_attr, dnnl_scratchpad_mode_user));
  atexit(destroy_attr);
}

dnnl_primitive_attr_t dnnl_ctx_attr(void) {
  pthread_once(&attr_once, make_attr);
  return user_scratchpad_attr;
}

void dnnl_out_of_memory_exit(const char *call) {
  const char *paren = strchr(call, '(');
  tl_fatal_input(
      "out of memory in oneDNN (%.*s): the machine's memory or an address-space limit (ulimit "
      "-v) is too small for this run; a smaller train.batch_size needs less",
      paren ? (int)(paren - call) : (int)strlen(call), call);
}

int cpu_has_avx512(void) {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

int cpu_has_native_bf16(void) {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

void exec_build_lazy_kernels(void) {
  // 64 is above the sizes oneDNN hands to its small-matrix paths; every transposition, as the
  // forward, backward-data and backward-weights passes of an inner product use them.
  enum { n = 64 };
  static float a[n * n], b[n * n], c[n * n];
  const char trans[2] = {'N', 'T'};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      DNNL_CHECK(dnnl_sgemm(trans[i], trans[j], n, n, n, 1.f, a, n, b, n, 0.f, c, n));
}
