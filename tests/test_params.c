// The parameter block built once (core/params.h): a growing set hands out the slices an exact set
// of the same takes would, holds the same initial values, is sealed at the count its takes reached
// with the rest of its address space released and its bytes counted as tl_alloc's would be; a
// build that outgrows the window an address-space limit leaves is detected, and the replica built
// again exactly holds the same parameters bit for bit. A replica's objective is created once.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/params.h"
#include "objective_test_util.h"
#include "train/replica.h"

// Sizes of the takes: odd ones, one of several pages, one past a million floats.
static const size_t sizes[] = {3, 1000, 70001, 5, 262144, 17, (1u << 20) + 7, 64};
enum { N_SIZES = sizeof sizes / sizeof sizes[0] };

static size_t total_floats(void) {
  size_t n = 0;
  for (int i = 0; i < N_SIZES; i++) n += sizes[i];
  return n;
}

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

// Whether [p, p + one page) is mapped: a MAP_FIXED_NOREPLACE mapping there fails with EEXIST
// exactly when something is.
static int page_mapped(void *p) {
  void *q = mmap(p, page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (q == MAP_FAILED) return errno == EEXIST;
  munmap(q, page());
  assert_ptr_equal(q, p);  // a kernel that ignored the flag would say nothing
  return 0;
}

static size_t live(MemCategory cat) { return tl_mem_live_comp(cat, COMP_OTHER); }

static void growing_set_is_the_exact_one(void **state) {
  (void)state;
  const size_t total = total_floats();
  const size_t param0 = live(MEM_PARAM), grad0 = live(MEM_GRAD);
  const long long net0 = tl_mem_thread_net(MEM_PARAM, COMP_OTHER);
  ParamSet exact, grown;
  paramset_alloc(&exact, total, 7);
  const size_t exact_param = live(MEM_PARAM) - param0, exact_grad = live(MEM_GRAD) - grad0;
  assert_int_equal(exact_param, total * sizeof(float));  // tl_alloc's count, independently
  assert_int_equal(exact_grad, total * sizeof(float));
  paramset_free(&exact);

  paramset_alloc(&exact, total, 7);
  assert_int_equal(paramset_alloc_growing(&grown, 7), 0);
  assert_true(paramset_complete(&grown));
  float *const data = grown.data, *const grad = grown.grad;
  for (int i = 0; i < N_SIZES; i++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    float *ge, *gg;
    float *pe = i == 5 ? paramset_take_buffer(&exact, name, sizes[i])
                       : paramset_take(&exact, name, sizes[i], i % 2, &ge);
    float *pg = i == 5 ? paramset_take_buffer(&grown, name, sizes[i])
                       : paramset_take(&grown, name, sizes[i], i % 2, &gg);
    assert_int_equal(pe - exact.data, pg - grown.data);
    if (i != 5) assert_int_equal(ge - exact.grad, gg - grown.grad);
    if (i == 5) {
      paramset_init_const(&exact, pe, sizes[i], 1.0f);
      paramset_init_const(&grown, pg, sizes[i], 1.0f);
    } else if (i % 2) {
      paramset_init_uniform(&exact, pe, sizes[i], 0.5f);
      paramset_init_uniform(&grown, pg, sizes[i], 0.5f);
    } else {
      paramset_init_normal(&exact, pe, sizes[i], 0.02f);
      paramset_init_normal(&grown, pg, sizes[i], 0.02f);
    }
  }
  // Nothing counted until the seal: the build's size is not known before it ends.
  assert_int_equal(live(MEM_PARAM) - param0, exact_param);
  assert_false(grown.overflowed);
  paramset_seal(&grown);
  assert_ptr_equal(grown.data, data);  // the block never moves: ops hold pointers into it
  assert_ptr_equal(grown.grad, grad);
  assert_int_equal(grown.count, total);
  assert_int_equal(grown.used, grown.count);
  assert_true(paramset_complete(&grown));
  assert_int_equal(grown.n_entries, exact.n_entries);
  for (int e = 0; e < exact.n_entries; e++) {
    assert_int_equal(grown.entries[e].offset, exact.entries[e].offset);
    assert_int_equal(grown.entries[e].is_buffer, exact.entries[e].is_buffer);
  }
  assert_memory_equal(grown.data, exact.data, total * sizeof(float));
  assert_memory_equal(grown.grad, exact.grad, total * sizeof(float));  // zeros, both
  assert_null(paramset_first_nonfinite(&grown));
  // Counted as tl_alloc counted the exact set's: both sets live now, twice the bytes.
  assert_int_equal(live(MEM_PARAM) - param0, 2 * exact_param);
  assert_int_equal(live(MEM_GRAD) - grad0, 2 * exact_grad);
  assert_int_equal(tl_mem_thread_net(MEM_PARAM, COMP_OTHER) - net0, 2 * (long long)exact_param);

  // The tail is released: the last page the floats reach stays, the one after it is free.
  const size_t keep = (total * sizeof(float) + page() - 1) / page() * page();
  assert_true(page_mapped((char *)grown.data + keep - page()));
  assert_true(page_mapped((char *)grown.grad + keep - page()));
  assert_false(page_mapped((char *)grown.data + keep));
  assert_false(page_mapped((char *)grown.grad + keep));
  // Writable to the end, as tl_alloc's block is.
  grown.data[total - 1] = 3.0f;
  grown.grad[total - 1] = 3.0f;
  paramset_zero_grad(&grown, 0);
  assert_true(grown.grad[total - 1] == 0.0f);

  paramset_free(&grown);
  paramset_free(&exact);
  assert_int_equal(live(MEM_PARAM), param0);
  assert_int_equal(live(MEM_GRAD), grad0);
  assert_int_equal(tl_mem_thread_net(MEM_PARAM, COMP_OTHER), net0);
}

// In a plan nothing is committed, as a planned tl_alloc reservation commits nothing; the seal
// still counts the bytes.
static void a_plan_commits_nothing(void **state) {
  (void)state;
  const size_t param0 = live(MEM_PARAM);
  tl_alloc_set_untouched(1);
  ParamSet ps;
  assert_int_equal(paramset_alloc_growing(&ps, 7), 0);
  for (int i = 0; i < N_SIZES; i++) paramset_take(&ps, "t", sizes[i], 0, NULL);
  assert_int_equal(ps.committed, 0);
  paramset_seal(&ps);
  assert_int_equal(live(MEM_PARAM) - param0, total_floats() * sizeof(float));
  paramset_free(&ps);
  tl_alloc_set_untouched(0);
  assert_int_equal(live(MEM_PARAM), param0);
}

// AddressSanitizer's shadow and allocator need more address space than these limits leave.
#if defined(__SANITIZE_ADDRESS__)
enum { UNDER_ASAN = 1 };
#else
enum { UNDER_ASAN = 0 };
#endif

// The process's size now (/proc/self/statm), bytes.
static size_t process_size(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  size_t pages = 0;
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%zu", &pages), 1);
  fclose(f);
  return pages * page();
}

// An address-space limit `headroom` bytes above the process's size now (the soft limit only, so
// it can be lifted again); returns the limit it replaced.
static struct rlimit limit_address_space(size_t headroom) {
  struct rlimit was, now;
  assert_int_equal(getrlimit(RLIMIT_AS, &was), 0);
  now = was;
  now.rlim_cur = process_size() + headroom;
  assert_int_equal(setrlimit(RLIMIT_AS, &now), 0);
  return was;
}

static void an_overflow_under_a_limit_is_detected(void **state) {
  (void)state;
  if (UNDER_ASAN) skip();
  ParamSet ps;
  const struct rlimit was = limit_address_space((size_t)48 << 20);
  const int got = paramset_alloc_growing(&ps, 7);
  setrlimit(RLIMIT_AS, &was);
  assert_int_equal(got, 0);
  // An eighth of 48 MiB each: 1.5 Mi floats, less than the fixed window of an unlimited process.
  assert_true(ps.window >= (1u << 20) && ps.window <= (3u << 19));
  float *a = paramset_take(&ps, "a", ps.window - 10, 0, NULL);
  paramset_init_normal(&ps, a, ps.window - 10, 0.02f);  // committed: writable
  assert_false(ps.overflowed);
  float *b = paramset_take(&ps, "b", 100, 0, NULL);
  assert_true(ps.overflowed && ps.counting);
  assert_true(paramset_complete(&ps));
  // Its slices alias inside the window (nothing touches them), and the takes go on counting.
  assert_true(b >= ps.data && b < ps.data + ps.window);
  paramset_take(&ps, "c", 3u << 20, 0, NULL);
  assert_int_equal(ps.used, ps.window - 10 + 100 + (3u << 20));
  paramset_free(&ps);
}

// ---- a replica: built once, or again after an overflow, to the same parameters ----

static int creates;
static ObjectiveDef counted;  // inbatch's, its create counted
static Objective *counted_create(const ObjectiveEnv *env) {
  creates++;
  return objective_find("inbatch")->create(env);
}

// The tiny network's inbatch on a ViT wide enough (about 3.2 M floats) to outgrow the window a
// limit of 64 MiB headroom leaves (8 MiB each).
static void wide_config(Config *cfg) {
  tiny_config(cfg, "vit", tiny_settings);
  cfg->model.spec.dim = 256;
  cfg->model.spec.heads = 4;
  cfg->model.spec.depth = 6;
}

static void build(Replica *r, const Config *cfg, RunLayout *layout, Comm *comm) {
  assert_int_equal(run_layout_init(layout, cfg, &counted, 1), 0);
  const ReplicaSpec spec = {.cfg = cfg, .layout = layout, .rank = 0, .total_steps = 10};
  creates = 0;
  assert_int_equal(replica_build(r, &spec, comm), 0);
}

static void a_replica_is_built_once_and_again_exactly(void **state) {
  (void)state;
  counted = *objective_find("inbatch");
  counted.create = counted_create;
  static Config cfg;
  wide_config(&cfg);
  LocalGroup *group = comm_local_group_create(1);
  Comm *comm = comm_local_rank(group, 0);
  RunLayout layout;
  Replica r;

  build(&r, &cfg, &layout, comm);
  assert_int_equal(creates, 1);  // one build counts and allocates
  assert_true(r.ps.mapped_bytes > 0);
  const size_t count = r.ps.count;
  assert_true(count > (3u << 20));
  assert_int_equal(r.optim->backbone_floats,
                   backbone_param_count(&cfg.model.spec, cfg.data.image_size, cfg.data.channels));
  float *first = malloc(sizeof(float) * count);
  memcpy(first, r.ps.data, sizeof(float) * count);
  const size_t param0 = live(MEM_PARAM);
  replica_destroy(&r);
  assert_int_equal(param0 - live(MEM_PARAM), count * sizeof(float));

  if (!UNDER_ASAN) {
    // Under a limit the window holds 2 Mi floats: the build overflows, goes, and the replica is
    // built again on an exact set (counted first: three creates).
    const struct rlimit was = limit_address_space((size_t)64 << 20);
    build(&r, &cfg, &layout, comm);
    setrlimit(RLIMIT_AS, &was);
    assert_int_equal(creates, 3);
    assert_int_equal(r.ps.mapped_bytes, 0);  // tl_alloc's
    assert_int_equal(r.ps.count, count);
    assert_memory_equal(r.ps.data, first, sizeof(float) * count);
    assert_int_equal(live(MEM_PARAM), param0);
    assert_int_equal(r.optim->backbone_floats,
                     backbone_param_count(&cfg.model.spec, cfg.data.image_size, cfg.data.channels));
    replica_destroy(&r);
  }
  free(first);
  comm_destroy(comm);
  comm_local_group_destroy(group);
}

int main(void) {
  objective_register_config();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(growing_set_is_the_exact_one),
      cmocka_unit_test(a_plan_commits_nothing),
      cmocka_unit_test(an_overflow_under_a_limit_is_detected),
      cmocka_unit_test(a_replica_is_built_once_and_again_exactly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
