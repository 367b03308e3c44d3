#include "core/params.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"

static void paramset_reset(ParamSet *ps, size_t count, uint64_t seed) {
  memset(ps, 0, sizeof *ps);
  ps->count = count;
  ps->seed = seed;
  ps->grad_generation = 1;
}

void paramset_alloc(ParamSet *ps, size_t count, uint64_t seed) {
  paramset_reset(ps, count, seed);
  ps->data = tl_alloc(count * sizeof(float), MEM_PARAM, COMP_OTHER);
  ps->grad = tl_alloc(count * sizeof(float), MEM_GRAD, COMP_OTHER);
  ps->owns = 1;
}

void paramset_alloc_nograd(ParamSet *ps, size_t count, uint64_t seed, MemCategory cat) {
  paramset_reset(ps, count, seed);
  ps->data = tl_alloc(count * sizeof(float), cat, COMP_OTHER);
  ps->owns = 1;
}

void paramset_bind(ParamSet *ps, float *data, float *grad, size_t count) {
  paramset_reset(ps, count, 0);
  ps->data = data;
  ps->grad = grad;
  ps->owns = 0;
}

// A counting pass hands out slices of a window of address space that is never committed: a model
// larger than the window takes its slices round it again (they alias, but nothing touches them).
// 64 MiB of address space each for data and grad, wider than any one tensor of the models Tally
// builds, or less under a tight address-space limit (ulimit -v): 1 GiB each made a run that needs
// 150 MB fail under a limit of 2 GB.
#define COUNTING_WINDOW_FLOATS ((size_t)1 << 24)
#define COUNTING_WINDOW_FLOATS_LEAST ((size_t)1 << 20)

static void *reserve(size_t floats) {
  void *p = mmap(NULL, floats * sizeof(float), PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void paramset_alloc_counting(ParamSet *ps, uint64_t seed) {
  paramset_reset(ps, SIZE_MAX / 2, seed);
  for (size_t n = COUNTING_WINDOW_FLOATS; n >= COUNTING_WINDOW_FLOATS_LEAST; n /= 2) {
    void *data = reserve(n), *grad = data ? reserve(n) : NULL;
    if (data && grad) {
      ps->data = data;
      ps->grad = grad;
      ps->counting_window = n;
      ps->counting = 1;
      return;
    }
    if (data) munmap(data, n * sizeof(float));
  }
  fprintf(stderr,
          "tally: cannot reserve 2 x %zu MiB of address space to count the model's parameters "
          "(an address-space limit: ulimit -v)\n",
          COUNTING_WINDOW_FLOATS_LEAST * sizeof(float) >> 20);
  exit(1);
}

int paramset_complete(const ParamSet *ps) { return ps->counting || ps->used == ps->count; }

void paramset_free(ParamSet *ps) {
  if (ps->counting) {
    munmap(ps->data, ps->counting_window * sizeof(float));
    munmap(ps->grad, ps->counting_window * sizeof(float));
  } else if (ps->owns) {
    tl_free(ps->data);
    tl_free(ps->grad);
  }
  tl_free(ps->grad_scratch);
  free(ps->entries);
  memset(ps, 0, sizeof *ps);
}

float *paramset_take(ParamSet *ps, const char *name, size_t n, int no_decay, float **grad) {
  if (ps->used + n > ps->count)
    TL_DIE("parameter block overflow taking %s (%zu + %zu > %zu)", name, ps->used, n, ps->count);
  if (ps->n_entries == ps->cap_entries) {
    ps->cap_entries = ps->cap_entries ? 2 * ps->cap_entries : 32;
    ps->entries = realloc(ps->entries, sizeof(ParamEntry) * (size_t)ps->cap_entries);
    if (!ps->entries) TL_DIE("out of memory");
  }
  ParamEntry *e = &ps->entries[ps->n_entries++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->offset = ps->used;
  e->count = n;
  e->no_decay = no_decay;
  e->ndim = 1;
  e->shape[0] = (long)n;
  ps->used += n;
  const size_t at = ps->counting ? e->offset % ps->counting_window : e->offset;
  if (grad) *grad = ps->grad ? ps->grad + at : NULL;
  return ps->data + at;
}

float *paramset_take_buffer(ParamSet *ps, const char *name, size_t n) {
  float *p = paramset_take(ps, name, n, 1, NULL);
  ps->entries[ps->n_entries - 1].is_buffer = 1;
  return p;
}

void paramset_set_shape(ParamSet *ps, int ndim, const long *shape) {
  TL_ASSERT(ps->n_entries > 0 && ndim >= 1 && ndim <= PARAM_MAX_DIMS);
  ParamEntry *e = &ps->entries[ps->n_entries - 1];
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  TL_ASSERT(n == e->count);
  e->ndim = ndim;
  memcpy(e->shape, shape, sizeof(long) * (size_t)ndim);
}

void paramset_zero_grad(ParamSet *ps, int dry_run) {
  if (ps->grad && !dry_run) memset(ps->grad, 0, ps->count * sizeof(float));
  ps->grad_generation++;
}

void paramset_reserve_grad_scratch(ParamSet *ps, size_t count) {
  if (count <= ps->grad_scratch_count) return;
  tl_free(ps->grad_scratch);
  ps->grad_scratch = tl_alloc(count * sizeof(float), MEM_WORKSPACE, COMP_OTHER);
  ps->grad_scratch_count = count;
}

float *paramset_grad_target(const ParamSet *ps, float *grad, size_t count, int accumulate,
                            size_t scratch_offset) {
  if (!accumulate) return grad;
  if (scratch_offset + count > ps->grad_scratch_count)
    TL_DIE(
        "gradient accumulation needs %zu scratch floats, %zu reserved (an op run twice "
        "before backward must be built for several calls)",
        scratch_offset + count, ps->grad_scratch_count);
  return ps->grad_scratch + scratch_offset;
}

void paramset_grad_commit(const ParamSet *ps, float *grad, const float *target, size_t count) {
  if (target == grad) return;
  TL_ASSERT(target >= ps->grad_scratch &&
            target + count <= ps->grad_scratch + ps->grad_scratch_count);
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (size_t i = 0; i < count; i++) grad[i] += target[i];
}

void paramset_grad_ready(const ParamSet *ps, const float *grad, size_t count) {
  if (!ps->grad_ready || !grad) return;
  TL_ASSERT(grad >= ps->grad && count <= ps->count &&
            (size_t)(grad - ps->grad) <= ps->count - count);
  ps->grad_ready(ps->grad_ready_user, (size_t)(grad - ps->grad), count);
}

static Rng stream_for(ParamSet *ps, const float *p) {
  return rng_stream(ps->seed, RNG_INIT, (uint64_t)(p - ps->data), 0);
}

void paramset_init_normal(ParamSet *ps, float *p, size_t n, float stddev) {
  if (!ps->owns || tl_alloc_untouched()) return;  // a plan: nothing reads them
  Rng r = stream_for(ps, p);
  for (size_t i = 0; i < n; i++) p[i] = stddev * rng_normal(&r);
}

void paramset_init_uniform(ParamSet *ps, float *p, size_t n, float bound) {
  if (!ps->owns || tl_alloc_untouched()) return;  // a plan: nothing reads them
  Rng r = stream_for(ps, p);
  for (size_t i = 0; i < n; i++) p[i] = rng_uniform_range(&r, -bound, bound);
}

void paramset_init_const(ParamSet *ps, float *p, size_t n, float value) {
  if (!ps->owns || tl_alloc_untouched()) return;  // a plan: nothing reads them
  for (size_t i = 0; i < n; i++) p[i] = value;
}
