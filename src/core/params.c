#include "core/params.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

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
// builds; under an address-space limit (ulimit -v) an eighth of the headroom each, as a growing
// set's: 1 GiB each made a run that needs 150 MB fail under a limit of 2 GB, and taking as much
// as would fit left the build too little for its own buffers.
#define COUNTING_WINDOW_FLOATS ((size_t)1 << 24)
#define COUNTING_WINDOW_FLOATS_LEAST ((size_t)1 << 20)

static void *reserve(size_t floats) {
  void *p = mmap(NULL, floats * sizeof(float), PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

// Reserves windows of `n` floats for data and for grad, halving n down to `least` until both fit;
// returns the n reserved, 0 when even `least` does not.
static size_t reserve_pair(ParamSet *ps, size_t n, size_t least) {
  for (; n >= least; n /= 2) {
    void *data = reserve(n), *grad = data ? reserve(n) : NULL;
    if (data && grad) {
      ps->data = data;
      ps->grad = grad;
      return n;
    }
    if (data) munmap(data, n * sizeof(float));
  }
  return 0;
}

static size_t page_bytes(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t round_to_page(size_t bytes) {
  const size_t page = page_bytes();
  return (bytes + page - 1) / page * page;
}

// The floats of each window: `unlimited` when the address space is, else an eighth of an
// address-space limit's headroom (the limit less the process's size now, /proc/self/statm), whole
// pages, at most `unlimited` and at least `least`. The build that holds the windows needs the
// rest of the headroom for its own buffers.
static size_t window_floats(size_t unlimited, size_t least) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return unlimited;
  FILE *f = fopen("/proc/self/statm", "r");
  size_t pages = 0;
  const int read = f && fscanf(f, "%zu", &pages) == 1;
  if (f) fclose(f);
  const size_t size = pages * page_bytes();
  if (!read || size >= (size_t)rl.rlim_cur) return least;
  size_t floats = ((size_t)rl.rlim_cur - size) / 8 / page_bytes() * page_bytes() / sizeof(float);
  if (floats > unlimited) floats = unlimited;
  return floats < least ? least : floats;
}

void paramset_alloc_counting(ParamSet *ps, uint64_t seed) {
  paramset_reset(ps, SIZE_MAX / 2, seed);
  const size_t n =
      reserve_pair(ps, window_floats(COUNTING_WINDOW_FLOATS, COUNTING_WINDOW_FLOATS_LEAST),
                   COUNTING_WINDOW_FLOATS_LEAST);
  if (n) {
    ps->counting_window = n;
    ps->counting = 1;
    return;
  }
  fprintf(stderr,
          "tally: cannot reserve 2 x %zu MiB of address space to count the model's parameters "
          "(an address-space limit: ulimit -v)\n",
          COUNTING_WINDOW_FLOATS_LEAST * sizeof(float) >> 20);
  exit(1);
}

// A growing set's window: 1 Gi floats (4 GiB of address space) each for data and grad, beyond any
// model Tally trains, when the address space is unlimited. Under a limit (ulimit -v) an eighth of
// the headroom left each: the build's own buffers need the rest while the window is held, and the
// tail is released at the seal. A model larger than that overflows and is built again exactly
// (paramset_alloc_growing), which is what a run under a tight limit pays, and all it pays.
#define GROWING_WINDOW_FLOATS ((size_t)1 << 30)
#define GROWING_WINDOW_FLOATS_LEAST COUNTING_WINDOW_FLOATS_LEAST

int paramset_alloc_growing(ParamSet *ps, uint64_t seed) {
  paramset_reset(ps, SIZE_MAX / 2, seed);
  const size_t n =
      reserve_pair(ps, window_floats(GROWING_WINDOW_FLOATS, GROWING_WINDOW_FLOATS_LEAST),
                   GROWING_WINDOW_FLOATS_LEAST);
  if (!n) {
    memset(ps, 0, sizeof *ps);
    return -1;
  }
  ps->window = n;
  ps->growing = 1;
  ps->owns = 1;
  return 0;
}

// Makes the pages under [0, bytes) of data and grad writable (fresh anonymous pages: zeros, as
// tl_alloc's). Not in a plan: nothing touches a plan's parameters, so nothing is committed.
static void grow_commit(ParamSet *ps, size_t bytes) {
  if (tl_alloc_untouched()) return;
  bytes = round_to_page(bytes);
  if (bytes <= ps->committed) return;
  char *data = (char *)ps->data + ps->committed, *grad = (char *)ps->grad + ps->committed;
  if (mprotect(data, bytes - ps->committed, PROT_READ | PROT_WRITE) != 0 ||
      mprotect(grad, bytes - ps->committed, PROT_READ | PROT_WRITE) != 0) {
    fprintf(stderr, "tally: out of memory growing the parameter block to %zu bytes\n", bytes);
    exit(1);
  }
  ps->committed = bytes;
}

// A take that does not fit the window: the set goes on as a counting set (slices wrap round the
// window, alias, and hold nothing: initializers and copies skip a counting set), so the build
// completes harmlessly and its caller learns it must build again.
static void grow_take(ParamSet *ps, size_t n) {
  if (ps->overflowed) return;
  if (ps->used + n > ps->window) {
    ps->overflowed = 1;
    ps->counting = 1;
    ps->counting_window = ps->window;
    ps->owns = 0;
    return;
  }
  grow_commit(ps, (ps->used + n) * sizeof(float));
}

void paramset_seal(ParamSet *ps) {
  TL_ASSERT(ps->growing && !ps->overflowed && !ps->owner);
  const size_t bytes = ps->used * sizeof(float);
  // At least a page: an empty set still has a block, as tl_alloc(0) gives one.
  size_t keep = round_to_page(bytes);
  if (keep == 0) keep = page_bytes();
  grow_commit(ps, keep);
  const size_t window = ps->window * sizeof(float);
  if (window > keep) {
    munmap((char *)ps->data + keep, window - keep);
    munmap((char *)ps->grad + keep, window - keep);
  }
  ps->count = ps->used;
  ps->growing = 0;
  ps->window = 0;
  ps->mapped_bytes = keep;
  ps->data_cat = tl_account(bytes, MEM_PARAM, COMP_OTHER);
  ps->grad_cat = tl_account(bytes, MEM_GRAD, COMP_OTHER);
}

int paramset_complete(const ParamSet *ps) {
  return ps->counting || ps->growing || ps->used == ps->count;
}

void paramset_free(ParamSet *ps) {
  if (ps->owner) {
    // A view: its data, gradients and (counting) reservations are its owner's, freed with it.
    // Unmapping a counting owner's window here as well unmapped it twice, and the second time
    // whatever another thread had mapped there meanwhile.
  } else if (ps->growing) {
    munmap(ps->data, ps->window * sizeof(float));
    munmap(ps->grad, ps->window * sizeof(float));
  } else if (ps->counting) {
    munmap(ps->data, ps->counting_window * sizeof(float));
    munmap(ps->grad, ps->counting_window * sizeof(float));
  } else if (ps->mapped_bytes) {
    munmap(ps->data, ps->mapped_bytes);
    munmap(ps->grad, ps->mapped_bytes);
    tl_unaccount(ps->count * sizeof(float), ps->data_cat, COMP_OTHER);
    tl_unaccount(ps->count * sizeof(float), ps->grad_cat, COMP_OTHER);
  } else if (ps->owns) {
    tl_free(ps->data);
    tl_free(ps->grad);
  }
  tl_free(ps->grad_scratch);
  free(ps->entries);
  memset(ps, 0, sizeof *ps);
}

void paramset_view(ParamSet *view, ParamSet *owner, size_t offset) {
  owner = paramset_root(owner);
  memset(view, 0, sizeof *view);
  view->owner = owner;
  view->data = owner->data;
  view->grad = owner->grad;
  view->count = owner->count;
  view->used = offset;
  view->counting = owner->counting;
  view->counting_window = owner->counting_window;
  while (view->replay_entry < owner->n_entries &&
         owner->entries[view->replay_entry].offset < offset)
    view->replay_entry++;
}

ParamSet *paramset_root(const ParamSet *ps) { return (ParamSet *)(ps->owner ? ps->owner : ps); }

// A view's take: the owner's next slice, which must be the one asked for.
static float *replay_take(ParamSet *view, const char *name, size_t n, float **grad) {
  const ParamSet *owner = view->owner;
  if (view->replay_entry >= owner->n_entries || owner->entries[view->replay_entry].count != n)
    TL_DIE("a second instance takes %s (%zu floats) where the first took %s", name, n,
           view->replay_entry < owner->n_entries ? owner->entries[view->replay_entry].name
                                                 : "nothing");
  const ParamEntry *e = &owner->entries[view->replay_entry++];
  view->used = e->offset + n;
  const size_t at = owner->counting ? e->offset % owner->counting_window : e->offset;
  if (grad) *grad = owner->grad ? owner->grad + at : NULL;
  return owner->data + at;
}

float *paramset_take(ParamSet *ps, const char *name, size_t n, int no_decay, float **grad) {
  if (ps->owner) return replay_take(ps, name, n, grad);
  if (ps->used + n > ps->count)
    TL_DIE("parameter block overflow taking %s (%zu + %zu > %zu)", name, ps->used, n, ps->count);
  if (ps->n_entries == ps->cap_entries) {
    ps->cap_entries = ps->cap_entries ? 2 * ps->cap_entries : 32;
    ps->entries = realloc(ps->entries, sizeof(ParamEntry) * (size_t)ps->cap_entries);
    if (!ps->entries) TL_DIE("out of memory");
  }
  if (ps->growing) grow_take(ps, n);
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
  if (!ps->owner) ps->entries[ps->n_entries - 1].is_buffer = 1;
  return p;
}

void paramset_set_shape(ParamSet *ps, int ndim, const long *shape) {
  if (ps->owner) return;  // the owner's entry has it
  TL_ASSERT(ps->n_entries > 0 && ndim >= 1 && ndim <= PARAM_MAX_DIMS);
  ParamEntry *e = &ps->entries[ps->n_entries - 1];
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  TL_ASSERT(n == e->count);
  e->ndim = ndim;
  memcpy(e->shape, shape, sizeof(long) * (size_t)ndim);
}

void paramset_zero_grad(ParamSet *ps, int dry_run) {
  ps = paramset_root(ps);
  if (ps->grad && !dry_run) memset(ps->grad, 0, ps->count * sizeof(float));
  ps->grad_generation++;
}

void paramset_reserve_grad_scratch(ParamSet *ps, size_t count) {
  ps = paramset_root(ps);
  if (count <= ps->grad_scratch_count) return;
  tl_free(ps->grad_scratch);
  ps->grad_scratch = tl_alloc(count * sizeof(float), MEM_WORKSPACE, COMP_OTHER);
  ps->grad_scratch_count = count;
}

float *paramset_grad_target(const ParamSet *ps, float *grad, size_t count, int accumulate,
                            size_t scratch_offset) {
  if (!accumulate) return grad;
  ps = paramset_root(ps);
  if (scratch_offset + count > ps->grad_scratch_count)
    TL_DIE(
        "gradient accumulation needs %zu scratch floats, %zu reserved (an op run twice "
        "before backward must be built for several calls)",
        scratch_offset + count, ps->grad_scratch_count);
  return ps->grad_scratch + scratch_offset;
}

void paramset_grad_commit(const ParamSet *ps, float *grad, const float *target, size_t count) {
  if (target == grad) return;
  ps = paramset_root(ps);
  TL_ASSERT(target >= ps->grad_scratch &&
            target + count <= ps->grad_scratch + ps->grad_scratch_count);
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (size_t i = 0; i < count; i++) grad[i] += target[i];
}

// The entry whose gradient slice starts at `grad` (entries are in offset order).
static ParamEntry *entry_of(ParamSet *root, const float *grad) {
  TL_ASSERT(root->grad && grad >= root->grad && (size_t)(grad - root->grad) < root->count);
  const size_t offset = (size_t)(grad - root->grad);
  int lo = 0, hi = root->n_entries - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (root->entries[mid].offset > offset)
      hi = mid - 1;
    else
      lo = mid;
  }
  TL_ASSERT(root->n_entries > 0 && root->entries[lo].offset == offset);
  return &root->entries[lo];
}

void paramset_grad_expect(ParamSet *ps, const float *grad, int contributions) {
  ParamSet *root = paramset_root(ps);
  if (root->counting || !grad) return;
  entry_of(root, grad)->grad_expected += contributions;
}

int paramset_grad_expected(const ParamSet *ps, const float *grad) {
  ParamSet *root = paramset_root(ps);
  return root->counting || !grad ? 0 : entry_of(root, grad)->grad_expected;
}

int paramset_grad_accumulates(const ParamSet *ps, const float *grad) {
  ParamSet *root = paramset_root(ps);
  if (root->counting) return 0;
  ParamEntry *e = entry_of(root, grad);
  if (e->grad_written == root->grad_generation) return 1;
  e->grad_written = root->grad_generation;
  return 0;
}

void paramset_grad_contributed(const ParamSet *ps, const float *grad, size_t count) {
  ParamSet *root = paramset_root(ps);
  if (root->counting || !grad) return;
  ParamEntry *e = entry_of(root, grad);
  if (e->grad_seen_generation != root->grad_generation) {
    e->grad_seen_generation = root->grad_generation;
    e->grad_seen = 0;
  }
  if (++e->grad_seen > e->grad_expected)
    TL_DIE("%s: backward contribution %d in one step, %d expected", e->name, e->grad_seen,
           e->grad_expected);
  if (e->grad_seen == e->grad_expected) paramset_grad_ready(root, grad, count);
}

void paramset_grad_ready(const ParamSet *ps, const float *grad, size_t count) {
  ps = paramset_root(ps);
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

const ParamEntry *paramset_first_nonfinite(const ParamSet *ps) {
  if (ps->counting || tl_alloc_untouched()) return NULL;  // a plan: nothing holds values
  // x - x is 0 for finite x and NaN otherwise: one pass, no branch per float.
  float acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static) if (ps->count > 65536)
  for (size_t i = 0; i < ps->count; i++) acc += ps->data[i] - ps->data[i];
  if (acc == 0) return NULL;
  for (int e = 0; e < ps->n_entries; e++) {
    const ParamEntry *pe = &ps->entries[e];
    for (size_t i = 0; i < pe->count; i++)
      if (!isfinite(ps->data[pe->offset + i])) return pe;
  }
  return NULL;
}
