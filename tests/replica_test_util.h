// Local replicas for the tests that split one batch over several: each replica on a thread of its
// own, all of them started before any is joined, since a collective returns only once every
// member of the group has entered it.
#pragma once
#include <pthread.h>
#include <stddef.h>

enum { REPLICA_THREADS_MAX = 8 };

// replica(&args[r]) for every r < world at once, args an array of `arg_bytes`-byte elements;
// returns when every replica has.
static inline void run_on_threads(int world, void *(*replica)(void *), void *args,
                                  size_t arg_bytes) {
  pthread_t ids[REPLICA_THREADS_MAX];
  assert_true(world >= 1 && world <= REPLICA_THREADS_MAX);
  for (int r = 0; r < world; r++)
    assert_int_equal(pthread_create(&ids[r], NULL, replica, (char *)args + (size_t)r * arg_bytes),
                     0);
  for (int r = 0; r < world; r++) pthread_join(ids[r], NULL);
}
