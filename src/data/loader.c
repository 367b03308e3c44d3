// Double-buffered prefetch: the worker fills slot (step % 2) while the caller trains on the other.
// A slot is refilled only after the caller has moved past it (the pointer loader_next returned
// stays valid until the following call).
#include "data/loader.h"

#include <limits.h>
#include <stdio.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"

enum { N_SLOTS = 2 };

struct LoaderPrivate {
  pthread_t thread;
  pthread_mutex_t mutex;
  pthread_cond_t changed;  // signalled when a slot is filled or released, and on stop
  Batch slots[N_SLOTS];
  int ready_step[N_SLOTS];  // step held ready in the slot, -1 when none
  int slot_in_use;          // slot the caller holds, -1 when none
  int next_fill_step;       // worker side
  int next_take_step;       // caller side
  atomic_int stop;
  int omp_threads;  // the caller's OpenMP thread count, applied in the worker thread
  // The permutation of the epoch last used, recomputed when a step crosses into a new epoch.
  int *permutation;  // (ds->n), MEM_DATA
  int permutation_epoch;
  int failed_step;   // the step whose batch could not be made (an image failed to decode), or -1
  char error[1024];  // why
};

// Fisher-Yates from the epoch's own stream: every replica derives the same order.
static void epoch_permutation(int n, uint64_t seed, int epoch, int *perm) {
  Rng rng = rng_stream(seed, RNG_SHUFFLE, (uint64_t)epoch, 0);
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)rng_below(&rng, (uint32_t)i + 1);
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

// Sample i's views, group by group: every view's crop box is drawn first (in its own stream,
// keyed by dataset index, not position in the shard, so the pixels do not depend on how the
// batch is split over replicas or threads), the image decoded once at the reduction every box
// allows, then each view rendered with the rest of its stream. v counts the image's views over
// every group, so a recipe of one group draws what it always drew.
static int fill_sample(Loader *l, int step, Batch *b, int i) {
  const Dataset *ds = l->ds;
  const int index = b->indices[i];
  Rng rngs[LOADER_MAX_VIEWS];
  CropBox boxes[LOADER_MAX_VIEWS];
  int h, w;
  dataset_source_size(ds, index, &h, &w);
  for (int g = 0, v = 0; g < l->views.n_groups; g++) {
    const AugmentParams *aug = &l->views.group[g].aug;
    for (int k = 0; k < l->views.group[g].count; k++, v++) {
      rngs[v] =
          rng_stream(l->seed, RNG_AUGMENT, (uint64_t)step << 32 | (uint64_t)v, (uint64_t)index);
      boxes[v] = augment_crop_box(h, w, aug, &rngs[v]);
    }
  }
  // Every box keeps at least its group's view size.
  int reduction = 8;
  for (int g = 0, v = 0; g < l->views.n_groups; g++) {
    const int count = l->views.group[g].count;
    const int r = augment_reduction(ds, index, boxes + v, count, l->views.group[g].aug.out_size);
    if (r < reduction) reduction = r;
    v += count;
  }
  Image img;
  if (dataset_image(ds, index, reduction, &img) != 0) return -1;
  for (int g = 0, v = 0; g < l->views.n_groups; g++) {
    const ViewGroup *group = &l->views.group[g];
    const size_t view_floats = (size_t)group->aug.out_size * group->aug.out_size * ds->c;
    for (int k = 0; k < group->count; k++, v++)
      augment_render(&img, boxes[v], &group->aug, &rngs[v],
                     b->group[g].views + ((size_t)k * b->n + i) * view_floats);
  }
  image_free(&img);
  return 0;
}

static int fill_batch(Loader *l, int step, Batch *b) {
  struct LoaderPrivate *pv = l->priv;
  const int epoch = step / l->steps_per_epoch;
  const int position_in_epoch = step % l->steps_per_epoch;
  if (pv->permutation_epoch != epoch) {
    epoch_permutation(l->ds->n, l->seed, epoch, pv->permutation);
    pv->permutation_epoch = epoch;
  }
  b->global_step = step;
  b->epoch = epoch;
  const int *first =
      pv->permutation + (size_t)position_in_epoch * l->global_batch + l->shard_offset;
  for (int i = 0; i < b->n; i++) {
    b->indices[i] = first[i];
    b->labels[i] = l->ds->labels[first[i]];
  }
  int first_failed = INT_MAX;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < b->n; i++) {
    // Skipping the rest lets loader_destroy return promptly in the middle of a batch.
    if (atomic_load(&pv->stop)) continue;
    if (fill_sample(l, step, b, i) != 0) {
#pragma omp critical(loader_first_error)
      if (i < first_failed) {
        first_failed = i;
        snprintf(pv->error, sizeof pv->error, "%s", tl_last_error());
      }
    }
  }
  return first_failed == INT_MAX ? 0 : -1;
}

static void *prefetch_main(void *arg) {
  Loader *l = arg;
  struct LoaderPrivate *pv = l->priv;
  omp_set_num_threads(pv->omp_threads);
  pthread_mutex_lock(&pv->mutex);
  for (;;) {
    const int step = pv->next_fill_step, slot = step % N_SLOTS;
    while (!atomic_load(&pv->stop) && (pv->ready_step[slot] >= 0 || pv->slot_in_use == slot))
      pthread_cond_wait(&pv->changed, &pv->mutex);
    if (atomic_load(&pv->stop)) break;
    pthread_mutex_unlock(&pv->mutex);
    const int failed = fill_batch(l, step, &pv->slots[slot]) != 0;
    pthread_mutex_lock(&pv->mutex);
    if (atomic_load(&pv->stop)) break;
    if (failed) {  // the caller gets the error when it asks for this step; nothing after it
      pv->failed_step = step;
      pthread_cond_broadcast(&pv->changed);
      break;
    }
    pv->ready_step[slot] = step;
    pv->next_fill_step = step + 1;
    pthread_cond_broadcast(&pv->changed);
  }
  pthread_mutex_unlock(&pv->mutex);
  return NULL;
}

// Bytes of one slot's buffers and of the epoch permutation: loader_init allocates exactly these,
// and loader_buffer_bytes adds them up for `tally plan`.
typedef struct {
  size_t views;        // every group's (count, shard, size, size, C) floats
  size_t indices;      // (shard) ints
  size_t labels;       // (shard) ints
  size_t permutation;  // (dataset_n) ints
} LoaderSizes;

static LoaderSizes loader_sizes(int dataset_n, int shard_size, const ViewRecipe *views,
                                int channels) {
  return (LoaderSizes){sizeof(float) * (size_t)shard_size * view_recipe_floats(views, channels),
                       sizeof(int) * (size_t)shard_size, sizeof(int) * (size_t)shard_size,
                       sizeof(int) * (size_t)dataset_n};
}

size_t loader_buffer_bytes(int dataset_n, int shard_size, const ViewRecipe *views, int channels) {
  LoaderSizes z = loader_sizes(dataset_n, shard_size, views, channels);
  return N_SLOTS * (z.views + z.indices + z.labels) + z.permutation;
}

static int check_args(const Dataset *ds, const ViewRecipe *views, int global_batch,
                      int shard_offset, int shard_size, int start_step) {
  if (views->n_groups < 1 || views->n_groups > VIEW_MAX_GROUPS)
    return tl_fail("loader: %d view groups, expected 1 to %d", views->n_groups, VIEW_MAX_GROUPS);
  if (view_recipe_count(views) > LOADER_MAX_VIEWS)
    return tl_fail("loader: %d views of each image, more than %d", view_recipe_count(views),
                   LOADER_MAX_VIEWS);
  for (int g = 0; g < views->n_groups; g++) {
    const AugmentParams *aug = &views->group[g].aug;
    if (views->group[g].count < 1)
      return tl_fail("loader: view group %d has %d views", g, views->group[g].count);
    if (aug->out_size < 1)
      return tl_fail("loader: view group %d: size must be positive, got %d", g, aug->out_size);
    if (!(aug->crop_ratio_min > 0 && aug->crop_ratio_max >= aug->crop_ratio_min))
      return tl_fail("loader: view group %d: crop ratio range [%g, %g] is not a positive interval",
                     g, aug->crop_ratio_min, aug->crop_ratio_max);
  }
  if (global_batch < 1 || global_batch > ds->n)
    return tl_fail("loader: global batch %d must be between 1 and the %d images of the dataset",
                   global_batch, ds->n);
  if (shard_offset < 0 || shard_size < 1 || shard_size > global_batch - shard_offset)
    return tl_fail("loader: a shard of %d samples from sample %d is not in the global batch of %d",
                   shard_size, shard_offset, global_batch);
  if (start_step < 0) return tl_fail("loader: start step %d is negative", start_step);
  return 0;
}

int loader_init(Loader *l, const Dataset *ds, const ViewRecipe *views, int global_batch,
                uint64_t seed, int shard_offset, int shard_size, int start_step) {
  memset(l, 0, sizeof *l);
  if (check_args(ds, views, global_batch, shard_offset, shard_size, start_step) < 0) return -1;
  l->ds = ds;
  l->views = *views;
  l->global_batch = global_batch;
  l->steps_per_epoch = ds->n / global_batch;
  l->seed = seed;
  l->shard_offset = shard_offset;
  l->shard_size = shard_size;

  struct LoaderPrivate *pv = calloc(1, sizeof *pv);
  if (!pv) TL_DIE("out of memory");
  l->priv = pv;
  const LoaderSizes z = loader_sizes(ds->n, shard_size, views, ds->c);
  for (int s = 0; s < N_SLOTS; s++) {
    Batch *b = &pv->slots[s];
    b->n = shard_size;
    // views: every group's (count, n, size, size, C)
    b->views = tl_alloc(z.views, MEM_DATA, COMP_OTHER);
    batch_set_groups(b, views, ds->c);
    b->indices = tl_alloc(z.indices, MEM_DATA, COMP_OTHER);
    b->labels = tl_alloc(z.labels, MEM_DATA, COMP_OTHER);
    pv->ready_step[s] = -1;
  }
  pv->permutation = tl_alloc(z.permutation, MEM_DATA, COMP_OTHER);
  pv->permutation_epoch = -1;
  pv->failed_step = -1;
  pv->slot_in_use = -1;
  pv->next_fill_step = pv->next_take_step = start_step;
  pv->omp_threads = omp_get_max_threads();
  atomic_init(&pv->stop, 0);
  pthread_mutex_init(&pv->mutex, NULL);
  pthread_cond_init(&pv->changed, NULL);
  const int rc = pthread_create(&pv->thread, NULL, prefetch_main, l);
  if (rc != 0)
    tl_fatal_input(
        "cannot start the loader's thread: %s (too little memory or address space for "
        "its stack: an address-space limit, ulimit -v?)",
        strerror(rc));
  return 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

const Batch *loader_next(Loader *l, double *wait_ms) {
  struct LoaderPrivate *pv = l->priv;
  const double start_ms = now_ms();
  pthread_mutex_lock(&pv->mutex);
  pv->slot_in_use = -1;
  pthread_cond_broadcast(&pv->changed);
  const int step = pv->next_take_step, slot = step % N_SLOTS;
  while (pv->ready_step[slot] != step && pv->failed_step != step)
    pthread_cond_wait(&pv->changed, &pv->mutex);
  if (pv->failed_step == step) {
    pthread_mutex_unlock(&pv->mutex);
    tl_fail("step %d: %s", step, pv->error);
    return NULL;
  }
  pv->ready_step[slot] = -1;
  pv->slot_in_use = slot;
  pv->next_take_step = step + 1;
  pthread_mutex_unlock(&pv->mutex);
  if (wait_ms) *wait_ms = now_ms() - start_ms;
  return &pv->slots[slot];
}

void loader_destroy(Loader *l) {
  struct LoaderPrivate *pv = l->priv;
  if (!pv) return;
  pthread_mutex_lock(&pv->mutex);
  atomic_store(&pv->stop, 1);
  pthread_cond_broadcast(&pv->changed);
  pthread_mutex_unlock(&pv->mutex);
  pthread_join(pv->thread, NULL);
  for (int s = 0; s < N_SLOTS; s++) {
    tl_free(pv->slots[s].views);
    tl_free(pv->slots[s].indices);
    tl_free(pv->slots[s].labels);
  }
  tl_free(pv->permutation);
  pthread_mutex_destroy(&pv->mutex);
  pthread_cond_destroy(&pv->changed);
  free(pv);
  l->priv = NULL;
}
