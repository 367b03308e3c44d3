// Counter-based random numbers: every draw is a pure function of (seed, stream, counter), so a
// sample's augmentation depends on its index and the step, never on which thread or replica
// drew it, and runs are reproducible on any replica count.
#pragma once
#include <stdint.h>

typedef struct {
  uint64_t key;      // derived from seed and the stream ids
  uint64_t counter;  // advanced by every draw
} Rng;

// Streams are named by up to three ids (e.g. purpose, step, sample index).
Rng rng_stream(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);
uint64_t rng_next_u64(Rng *r);
float rng_uniform(Rng *r);  // [0, 1)
float rng_uniform_range(Rng *r, float lo, float hi);
float rng_normal(Rng *r);                // standard normal (Box-Muller)
uint32_t rng_below(Rng *r, uint32_t n);  // uniform integer in [0, n)

// Purposes, so that streams for different uses never collide.
enum {
  RNG_INIT = 1,     // parameter initialization
  RNG_AUGMENT = 2,  // data augmentation
  RNG_SHUFFLE = 3,  // epoch order
  RNG_MASK = 4,     // MAE masking
  RNG_QUEUE = 5,    // MoCo initial queue
  RNG_QUALITY = 6,  // the training images the label-free quality measures read
  RNG_TEST = 99
};
