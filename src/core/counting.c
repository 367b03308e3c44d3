#include "core/counting.h"

void counting_begin(CountingPass *c, uint64_t seed) {
  c->was_untouched = tl_alloc_untouched();
  tl_alloc_set_untouched(1);
  exec_ctx_init(&c->ctx);
  c->ctx.dry_run = 1;
  paramset_alloc_counting(&c->ps, seed);
}

size_t counting_end(CountingPass *c) {
  const size_t count = c->ps.used;
  paramset_free(&c->ps);
  exec_ctx_destroy(&c->ctx);
  tl_alloc_set_untouched(c->was_untouched);
  return count;
}
