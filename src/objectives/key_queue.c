#include "objectives/key_queue.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"

void key_queue_init(KeyQueue *q, int capacity, int dim, uint64_t seed) {
  memset(q, 0, sizeof *q);
  q->capacity = capacity;
  q->dim = dim;
  q->keys = tl_alloc(sizeof(float) * (size_t)capacity * dim, MEM_QUEUE, COMP_LOSS);
  q->step_of = tl_alloc(sizeof(long) * (size_t)capacity, MEM_QUEUE, COMP_LOSS);
  // A plan never reads the keys: filling them would make a dry run touch the whole queue.
  if (tl_alloc_untouched()) return;
  for (int i = 0; i < capacity; i++) {
    Rng r = rng_stream(seed, RNG_QUEUE, (uint64_t)i, 0);
    float *k = q->keys + (size_t)i * dim;
    double ss = 0;
    for (int j = 0; j < dim; j++) {
      k[j] = rng_normal(&r);
      ss += (double)k[j] * k[j];
    }
    float inv = (float)(1.0 / sqrt(ss > 0 ? ss : 1.0));
    for (int j = 0; j < dim; j++) k[j] *= inv;
    q->step_of[i] = KEY_QUEUE_RANDOM;
  }
}

void key_queue_destroy(KeyQueue *q) {
  tl_free(q->keys);
  tl_free(q->step_of);
  memset(q, 0, sizeof *q);
}

void key_queue_push(KeyQueue *q, const float *keys, int n, long step) {
  for (int i = 0; i < n; i++) {
    memcpy(q->keys + (size_t)q->next * q->dim, keys + (size_t)i * q->dim,
           sizeof(float) * (size_t)q->dim);
    q->step_of[q->next] = step;
    q->next = (q->next + 1) % q->capacity;
  }
}

size_t key_queue_bytes(const KeyQueue *q) {
  return sizeof(float) * (size_t)q->capacity * q->dim + sizeof(long) * (size_t)q->capacity;
}

int key_queue_usable(const KeyQueue *q, int i, long step, int max_age_steps) {
  long s = q->step_of[i];
  return s == KEY_QUEUE_RANDOM || max_age_steps <= 0 || step - s <= max_age_steps;
}

KeyQueueStats key_queue_stats(const KeyQueue *q, long step, int max_age_steps) {
  KeyQueueStats st = {0};
  double age_sum = 0;
  for (int i = 0; i < q->capacity; i++) {
    if (q->step_of[i] == KEY_QUEUE_RANDOM) {
      st.random++;
    } else {
      double age = (double)(step - q->step_of[i]);
      st.real++;
      age_sum += age;
      if (age > st.oldest_age_steps) st.oldest_age_steps = age;
    }
    st.usable += key_queue_usable(q, i, step, max_age_steps);
  }
  st.mean_age_steps = st.real ? age_sum / st.real : 0;
  return st;
}

KeyQueueStats key_queue_planned_stats(long K, long keys_per_step, long max_age_steps, long step) {
  KeyQueueStats st = {0};
  long pushed = step * keys_per_step;
  long real = pushed < K ? pushed : K;
  long full_steps = real / keys_per_step, partial = real % keys_per_step;
  // Keys from step - j are j steps old: keys_per_step of each age 1..full_steps, then the
  // surviving `partial` keys of the step before.
  double age_sum = (double)keys_per_step * full_steps * (full_steps + 1) / 2.0 +
                   (double)partial * (full_steps + 1);
  st.real = real;
  st.random = K - real;
  st.oldest_age_steps = (double)(partial ? full_steps + 1 : full_steps);
  st.mean_age_steps = real ? age_sum / real : 0;
  long young = max_age_steps > 0 && max_age_steps * keys_per_step < real
                   ? max_age_steps * keys_per_step
                   : real;
  st.usable = (K - real) + young;
  return st;
}
