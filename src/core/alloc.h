// The accounting allocator: every buffer Tally owns is allocated here, tagged with the ledger
// category it belongs to and the model component that holds it, so the ledger can say what the
// memory is for and `tally plan` can predict it exactly.
#pragma once
#include <stddef.h>

typedef enum {
  MEM_PARAM,      // trainable parameters
  MEM_GRAD,       // their gradients
  MEM_OPTIM,      // optimizer state (momentum, Adam moments)
  MEM_MOMENTUM,   // momentum (key) encoder parameters and its own buffers
  MEM_ACT,        // activations retained for the backward pass
  MEM_ACT_GRAD,   // gradients flowing back through activations (transient per step)
  MEM_QUEUE,      // features cached across steps (MoCo queue)
  MEM_WORKSPACE,  // oneDNN scratchpads, reorder buffers, forward-only temporaries
  MEM_DATA,       // batches of images and labels, datasets held in memory
  MEM_EVAL,       // evaluation buffers (kNN feature banks)
  MEM_NCAT
} MemCategory;

typedef enum {
  COMP_ENCODER,
  COMP_HEAD,
  COMP_DECODER,
  COMP_LOSS,
  COMP_OTHER,
  COMP_NCOMP
} MemComponent;

const char *mem_component_name(MemComponent c);

// 64-byte aligned, zero-filled. Aborts with a clear message when memory runs out.
void *tl_alloc(size_t bytes, MemCategory cat, MemComponent comp);
void tl_free(void *p);

// Memory mapped outside tl_alloc (a parameter block grown in place, core/params.h) counted
// exactly as tl_alloc(bytes, cat, comp) counts a block, an open scope included. Returns the
// category it was counted as: tl_unaccount, when the mapping goes, must be given that one.
MemCategory tl_account(size_t bytes, MemCategory cat, MemComponent comp);
void tl_unaccount(size_t bytes, MemCategory cat, MemComponent comp);

// Planning (this thread only): while set, new blocks are not zero-filled, and blocks of a page or
// more are address space only (never committed; touching one faults), so a model of any size can be
// built to be measured (`tally plan`) in a few megabytes. Code that runs during a plan must not
// read or write them: ops check ExecCtx.dry_run, initializers tl_alloc_untouched().
void tl_alloc_set_untouched(int untouched);
// 1 while planning: initializers may skip filling what they allocate (nothing will read it).
int tl_alloc_untouched(void);

// While a scope is open on this thread, every allocation is counted as `cat` whatever its
// caller asked for (the kNN monitor's inference model is evaluation memory, not training's).
void tl_alloc_scope_begin(MemCategory cat);
void tl_alloc_scope_end(void);

// Live and peak bytes, per category and component (thread-safe counters).
size_t tl_mem_live(MemCategory cat);
size_t tl_mem_live_comp(MemCategory cat, MemComponent comp);
// Bytes this thread has allocated less those it has freed, per category and component: the
// difference across a build is what that build holds, whatever other threads allocate meanwhile.
long long tl_mem_thread_net(MemCategory cat, MemComponent comp);
size_t tl_mem_peak_total(void);
size_t tl_mem_live_total(void);

// Peak resident set size of the process (VmHWM), in bytes.
size_t tl_peak_rss_bytes(void);

// The memory this process can have: physical memory, or its cgroup's limit when lower.
double tl_machine_memory_bytes(void);
