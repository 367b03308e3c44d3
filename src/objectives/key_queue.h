// MoCo's FIFO queue of L2-normalized keys from earlier steps. Each slot remembers the step whose
// key encoder produced it, so the ledger can say how stale the negatives are and
// queue_max_age_steps can drop the stalest. Slots start as random unit vectors, marked as such
// and counted apart from real keys.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KEY_QUEUE_RANDOM (-1L)

typedef struct {
  int capacity;   // K
  int dim;        // d
  int next;       // slot the next key goes into (the oldest)
  float *keys;    // (K, d), MEM_QUEUE
  long *step_of;  // (K) step that encoded the key, KEY_QUEUE_RANDOM for initial entries
} KeyQueue;

void key_queue_init(KeyQueue *q, int capacity, int dim, uint64_t seed);
void key_queue_destroy(KeyQueue *q);
// Appends n keys (n, d) encoded at `step`, overwriting the oldest; wraps around.
void key_queue_push(KeyQueue *q, const float *keys, int n, long step);
size_t key_queue_bytes(const KeyQueue *q);

typedef struct {
  long real;                // slots holding keys from training
  long random;              // initial random slots not yet replaced
  long usable;              // slots used as negatives (real + random, minus those too old)
  double oldest_age_steps;  // over real keys; 0 when there are none
  double mean_age_steps;
} KeyQueueStats;

// Ages are measured at `step` (the step whose loss uses the queue); max_age 0 = no limit.
KeyQueueStats key_queue_stats(const KeyQueue *q, long step, int max_age_steps);
// 1 if slot i is used as a negative at `step`.
int key_queue_usable(const KeyQueue *q, int i, long step, int max_age_steps);

// The statistics key_queue_stats reports at `step` of a run that pushes keys_per_step keys every
// step into a FIFO of capacity K, from arithmetic alone (`tally plan`).
KeyQueueStats key_queue_planned_stats(long K, long keys_per_step, long max_age_steps, long step);
