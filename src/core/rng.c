#include "core/rng.h"

#include <math.h>

// splitmix64 finalizer: a strong 64-bit mixing function, good enough as a keyed counter hash.
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Rng rng_stream(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
  k = mix64(k ^ (a + 0x632be59bd9b4e019ULL));
  k = mix64(k ^ (b + 0x85157af5ULL * 0x100000001ULL));
  k = mix64(k ^ (c + 0xd6e8feb86659fd93ULL));
  return (Rng){.key = k, .counter = 0};
}

uint64_t rng_next_u64(Rng *r) { return mix64(r->key ^ mix64(++r->counter)); }

float rng_uniform(Rng *r) { return (float)(rng_next_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_uniform_range(Rng *r, float lo, float hi) { return lo + (hi - lo) * rng_uniform(r); }

float rng_normal(Rng *r) {
  double u1 = ((rng_next_u64(r) >> 11) + 1) * (1.0 / 9007199254740993.0);
  double u2 = (rng_next_u64(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint32_t rng_below(Rng *r, uint32_t n) {
  return (uint32_t)(((rng_next_u64(r) >> 32) * (uint64_t)n) >> 32);
}
