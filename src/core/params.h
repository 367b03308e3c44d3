// A model's parameters live in one contiguous block (and their gradients in another), so the
// optimizer, the gradient allreduce, the momentum encoder and checkpoints each see one flat array.
// Layers take named slices in build order. llm.c sizes its block up front from a formula beside
// the model (fill_in_parameter_sizes); here the count is the build's own: a replica's set grows in
// place while the model is built (paramset_alloc_growing: address space reserved, pages committed
// as slices are taken, the tail released at paramset_seal), so one build both counts and
// allocates, and plan and allocation agree by construction. Ops hold pointers into the block, so
// it never moves.
#pragma once
#include <stddef.h>

#include "core/alloc.h"
#include "core/rng.h"

enum { PARAM_MAX_DIMS = 4 };

typedef struct {
  char name[64];
  size_t offset, count;
  int ndim;                    // 1 unless the op that took it says otherwise
  long shape[PARAM_MAX_DIMS];  // conv (O, I, kh, kw), linear (O, I): PyTorch's layouts
  int no_decay;   // biases and normalization parameters: no weight decay, excluded from LARS
  int is_buffer;  // running statistics: saved and copied with the model, never optimized
  // Its gradient's bookkeeping, whichever op instances write it: the backward contributions a
  // step brings (one per forward call of each op built over it), those seen this step, and the
  // set's grad_generation when a backward last wrote it (a later one adds) and when `grad_seen`
  // was counted.
  int grad_expected, grad_seen;
  unsigned grad_written, grad_seen_generation;
} ParamEntry;

typedef struct ParamSet ParamSet;
struct ParamSet {
  float *data;  // (count)
  float *grad;  // (count), NULL for a bound (inference or momentum) copy
  size_t count, used;
  ParamEntry *entries;
  int n_entries, cap_entries;
  int owns;                // 1: allocated here; 0: bound to another set's data
  int counting;            // a counting pass: data and grad are reservations, `used` is the answer
  size_t counting_window;  // floats in each of those reservations
  // A growing set (paramset_alloc_growing) until paramset_seal: data and grad are reservations of
  // `window` floats each, their first `committed` bytes writable. `overflowed`: the build took
  // more than the window; the set went on as a counting set and must be rebuilt exactly.
  int growing, overflowed;
  size_t window, committed;
  // A sealed growing set: the bytes of each mapping (unmapped by paramset_free) and the
  // categories tl_account counted data and grad as. 0: data and grad came from tl_alloc.
  size_t mapped_bytes;
  MemCategory data_cat, grad_cat;
  uint64_t seed;  // initialization stream
  // Optional: told when backward has finished writing gradient floats [offset, offset + count)
  // for this step, so their averaging across replicas can start while backward goes on
  // (parallel/grad_sync.h installs it). NULL: nobody listens.
  void (*grad_ready)(void *user, size_t offset, size_t count);
  void *grad_ready_user;
  // Gradient accumulation (ops/builder.h): bumped by each zero, starting at 1, so an op can tell
  // its first backward of a step from a later call's; the scratch holds a later call's gradient
  // before it is added, sized by the ops built for several calls.
  unsigned grad_generation;
  float *grad_scratch;
  size_t grad_scratch_count;
  // A view (paramset_view): takes hand out the owner's slices again, in its order from
  // `replay_entry`, and every gradient's bookkeeping is the owner's. NULL: a set of its own.
  ParamSet *owner;
  int replay_entry;
};

// Allocates data (MEM_PARAM) and grad (MEM_GRAD) for exactly `count` floats.
void paramset_alloc(ParamSet *ps, size_t count, uint64_t seed);
// Allocates data only, tagged as `cat` (MEM_MOMENTUM for a key encoder): no gradients.
void paramset_alloc_nograd(ParamSet *ps, size_t count, uint64_t seed, MemCategory cat);
// Binds to existing storage (an inference copy of a trained model): takes hand out the same
// slices in the same order, and initialization is skipped.
void paramset_bind(ParamSet *ps, float *data, float *grad, size_t count);
// A counting pass: takes hand out slices of a reservation that is never touched (initialization
// is skipped while tl_alloc_untouched), so building a model once in dry run leaves its parameter
// count in `used` — the count comes from the builders themselves, not from a formula beside them.
void paramset_alloc_counting(ParamSet *ps, uint64_t seed);
// A set whose size is the build's: takes hand out slices of a reservation of address space (as
// large as is safe: a fixed window, or a share of what an address-space limit leaves), committing
// its pages as they are taken (none while tl_alloc_untouched: a plan). Returns -1 when no window
// can be reserved. A build that outgrows the window leaves the set `overflowed`: its later slices
// alias (a counting set's) and it holds no values, so the caller destroys that build and builds
// again on an exact set (objective_param_count, then paramset_alloc).
int paramset_alloc_growing(ParamSet *ps, uint64_t seed);
// After the build: count = used, the reservations' tail beyond the used pages released (the block
// does not move) and the bytes counted as paramset_alloc's tl_alloc counts them. From here the
// set is one of paramset_alloc's for every consumer, paramset_free included.
void paramset_seal(ParamSet *ps);
// A second instance of a module over the same weights (another batch or image size): `view`
// hands out the owner's slices again, from the one at `offset` on, in the order the first
// instance took them (a take of another size dies: a build bug). Gradients add into the owner's.
void paramset_view(ParamSet *view, ParamSet *owner, size_t offset);
// The set that owns the slices and their bookkeeping: ps, or the set a view replays.
ParamSet *paramset_root(const ParamSet *ps);
// Every slice of the block was taken (a counting or growing set is complete whatever it holds).
int paramset_complete(const ParamSet *ps);
void paramset_free(ParamSet *ps);

// Takes the next `n` floats; *grad receives the matching gradient slice (NULL if none).
// Returns a pointer into data. Dies if the set would overflow (a sizing bug, not user input).
float *paramset_take(ParamSet *ps, const char *name, size_t n, int no_decay, float **grad);
// Takes a non-trainable buffer (BatchNorm running statistics): its gradient slice stays zero and
// the optimizer skips it.
float *paramset_take_buffer(ParamSet *ps, const char *name, size_t n);

// Gives the entry taken last its shape (the product must equal its count), for checkpoints and
// exports.
void paramset_set_shape(ParamSet *ps, int ndim, const long *shape);

// Starts a step's gradients: zeroes the whole gradient block (slices no op writes this step stay
// zero) and opens a new generation, so each op's first backward writes and later ones add.
// `dry_run` (a plan): only the generation moves.
void paramset_zero_grad(ParamSet *ps, int dry_run);
// An op built for several calls reserves scratch for the gradient floats one backward writes.
void paramset_reserve_grad_scratch(ParamSet *ps, size_t count);
// Where a backward writes `count` gradient floats: `grad` itself, or when `accumulate`, the
// scratch at `scratch_offset` (the op's slices side by side, within what it reserved).
float *paramset_grad_target(const ParamSet *ps, float *grad, size_t count, int accumulate,
                            size_t scratch_offset);
// After writing to `target`: adds it into `grad` when it is the scratch (not in a plan: the
// caller skips it when its context is a dry run).
void paramset_grad_commit(const ParamSet *ps, float *grad, const float *target, size_t count);

// Gradient bookkeeping of a slice (`grad` as paramset_take handed it out, from the set or a view
// of it): an op built in training over it expects `contributions` backward calls a step; a
// backward asks whether it adds to what an earlier one wrote since the step's zero (1) or writes
// (0); after writing it reports its contribution, and after the last expected one the set's
// grad_ready hears the slice is complete. No-ops on a counting set.
void paramset_grad_expect(ParamSet *ps, const float *grad, int contributions);
int paramset_grad_expected(const ParamSet *ps, const float *grad);
int paramset_grad_accumulates(const ParamSet *ps, const float *grad);
void paramset_grad_contributed(const ParamSet *ps, const float *grad, size_t count);

// Tells the set's listener that gradient floats [grad, grad + count) are complete for the step
// (paramset_grad_contributed does, after the last contribution). No-op without a callback or when
// grad is NULL.
void paramset_grad_ready(const ParamSet *ps, const float *grad, size_t count);

// The first entry (parameter or buffer) holding a NaN or an infinity, or NULL.
const ParamEntry *paramset_first_nonfinite(const ParamSet *ps);

// Initialization helpers for an owned set (no-ops on a bound set). Each tensor gets its own
// RNG stream keyed by its entry index, so initialization does not depend on build details.
void paramset_init_normal(ParamSet *ps, float *p, size_t n, float stddev);
void paramset_init_uniform(ParamSet *ps, float *p, size_t n, float bound);
void paramset_init_const(ParamSet *ps, float *p, size_t n, float value);
