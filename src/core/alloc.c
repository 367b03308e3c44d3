#include "core/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { ALIGN = 64 };

// Blocks at least this large are only reserved while planning (see tl_alloc_set_untouched): one
// page, so that a plan of an ordinary configuration already faults wherever a huge one would.
#define PLANNED_RESERVE_BYTES ((size_t)4096)

// Header stored in front of each block, padded to ALIGN so the user pointer stays aligned.
typedef struct {
  size_t bytes;
  size_t mapped_bytes;  // a planned reservation: the whole mapping, header page included; else 0
  int cat, comp;
} BlockHeader;
_Static_assert(sizeof(BlockHeader) <= ALIGN, "header must fit the alignment pad");

static _Atomic size_t live_bytes[MEM_NCAT][COMP_NCOMP];
static _Atomic size_t live_total, peak_total;
static _Thread_local int untouched;  // per thread: a plan may run beside a training
static _Thread_local int scope_category = -1;

void tl_alloc_set_untouched(int on) { untouched = on; }
int tl_alloc_untouched(void) { return untouched; }
void tl_alloc_scope_begin(MemCategory cat) { scope_category = (int)cat; }
void tl_alloc_scope_end(void) { scope_category = -1; }

static const char *const category_names[MEM_NCAT] = {
    "param",     "grad", "optimizer", "momentum_encoder", "activation", "activation_grad", "queue",
    "workspace", "data", "eval"};
static const char *const component_names[COMP_NCOMP] = {"encoder", "head", "decoder", "loss",
                                                        "other"};

const char *mem_component_name(MemComponent c) { return component_names[c]; }

// A plan's large block: address space only (PROT_NONE, never committed), behind one writable
// page that holds the header. A plan's size is arithmetic, not memory: a configuration far larger
// than the machine is planned in the same megabytes as a small one, and any code that touches a
// planned buffer stops at once instead of quietly committing it. NULL when the address space
// itself is too small.
static char *reserve(size_t bytes, size_t *mapped) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (bytes > SIZE_MAX - 2 * page) return NULL;
  *mapped = page + (bytes + page - 1) / page * page;
  char *raw = mmap(NULL, *mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  if (mprotect(raw, page, PROT_READ | PROT_WRITE) != 0) {
    munmap(raw, *mapped);
    return NULL;
  }
  return raw + page - ALIGN;
}

// What this thread allocated less what it freed: a builder's own share while several replicas'
// threads build at once.
static _Thread_local long long thread_live_bytes[MEM_NCAT][COMP_NCOMP];

long long tl_mem_thread_net(MemCategory cat, MemComponent comp) {
  return thread_live_bytes[cat][comp];
}

static void count_in(size_t bytes, MemCategory cat, MemComponent comp) {
  atomic_fetch_add(&live_bytes[cat][comp], bytes);
  thread_live_bytes[cat][comp] += (long long)bytes;
  size_t now = atomic_fetch_add(&live_total, bytes) + bytes;
  size_t peak = atomic_load(&peak_total);
  while (now > peak && !atomic_compare_exchange_weak(&peak_total, &peak, now)) {
  }
}

static void count_out(size_t bytes, MemCategory cat, MemComponent comp) {
  atomic_fetch_sub(&live_bytes[cat][comp], bytes);
  thread_live_bytes[cat][comp] -= (long long)bytes;
  atomic_fetch_sub(&live_total, bytes);
}

void *tl_alloc(size_t bytes, MemCategory cat, MemComponent comp) {
  if (scope_category >= 0) cat = (MemCategory)scope_category;
  const int planned = untouched && bytes >= PLANNED_RESERVE_BYTES;
  size_t padded = (bytes + ALIGN - 1) / ALIGN * ALIGN, mapped = 0;
  char *raw = planned          ? reserve(bytes, &mapped)
              : padded < bytes ? NULL
                               : aligned_alloc(ALIGN, padded + ALIGN);
  if (!raw) {
    // What fails is the process's whole address space, not necessarily this buffer: say both.
    if (planned)
      fprintf(stderr,
              "tally: planning this configuration reserves more address space than this process "
              "has (the machine's limit, or ulimit -v): %.1f MiB reserved so far, then %.1f MiB "
              "for %s/%s\n",
              (double)atomic_load(&live_total) / 0x1p20, (double)bytes / 0x1p20,
              category_names[cat], component_names[comp]);
    else
      fprintf(stderr, "tally: out of memory allocating %zu bytes for %s/%s\n", bytes,
              category_names[cat], component_names[comp]);
    exit(1);
  }
  if (!untouched) memset(raw + ALIGN, 0, padded);
  BlockHeader *h = (BlockHeader *)raw;
  h->bytes = bytes;
  h->mapped_bytes = mapped;
  h->cat = cat;
  h->comp = comp;
  count_in(bytes, cat, comp);
  return raw + ALIGN;
}

MemCategory tl_account(size_t bytes, MemCategory cat, MemComponent comp) {
  if (scope_category >= 0) cat = (MemCategory)scope_category;
  count_in(bytes, cat, comp);
  return cat;
}

void tl_unaccount(size_t bytes, MemCategory cat, MemComponent comp) { count_out(bytes, cat, comp); }

void tl_free(void *p) {
  if (!p) return;
  char *raw = (char *)p - ALIGN;
  BlockHeader *h = (BlockHeader *)raw;
  count_out(h->bytes, (MemCategory)h->cat, (MemComponent)h->comp);
  if (h->mapped_bytes)
    munmap((char *)p - (size_t)sysconf(_SC_PAGESIZE), h->mapped_bytes);
  else
    free(raw);
}

size_t tl_mem_live(MemCategory cat) {
  size_t s = 0;
  for (int c = 0; c < COMP_NCOMP; c++) s += atomic_load(&live_bytes[cat][c]);
  return s;
}
size_t tl_mem_live_comp(MemCategory cat, MemComponent comp) {
  return atomic_load(&live_bytes[cat][comp]);
}
size_t tl_mem_peak_total(void) { return atomic_load(&peak_total); }
size_t tl_mem_live_total(void) { return atomic_load(&live_total); }

size_t tl_peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

double tl_machine_memory_bytes(void) {
  double bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  // cgroup v2: "max" or a byte count (a container's limit).
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
  double limit;
  if (f && fscanf(f, "%lf", &limit) == 1 && limit > 0 && limit < bytes) bytes = limit;
  if (f) fclose(f);
  return bytes;
}
