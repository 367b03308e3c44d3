// Decode throughput on one core (scripts/bench.sh --decode DIR): the first N images of a folder
// (its files, or its class subfolders' files, by name), each decoded in turn by
//   stb_image at full size,
//   libjpeg-turbo at full size,
//   libjpeg-turbo at the reduction a view of S pixels cut from the whole image allows (the
//   loader's largest box; smaller crops need the same or less),
// at `channels`; best of `repeats` passes over the files (they are read once first, so the page
// cache holds them). Prints images/s and decoded megapixels/s per core.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/decode.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef enum { STB_FULL, TURBO_FULL, TURBO_REDUCED, N_WAYS } Way;
static const char *const way_names[N_WAYS] = {"stb_image, full size", "libjpeg-turbo, full size",
                                              "libjpeg-turbo, reduced for the view"};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_decode DIR [N=500] [VIEW_SIZE=64] [CHANNELS=3] [REPEATS=3]\n");
    return 2;
  }
  const int n_max = argc > 2 ? atoi(argv[2]) : 500, view = argc > 3 ? atoi(argv[3]) : 64;
  const int channels = argc > 4 ? atoi(argv[4]) : 3, repeats = argc > 5 ? atoi(argv[5]) : 3;
  Dataset ds;
  if (dataset_load_imagefolder(&ds, argv[1], view, channels, n_max, 1) != 0) {
    fprintf(stderr, "bench_decode: %s\n", tl_last_error());
    return 1;
  }
  double best[N_WAYS], pixels[N_WAYS] = {0};
  for (int w = 0; w < N_WAYS; w++) best[w] = 1e30;
  for (int rep = 0; rep <= repeats; rep++)  // pass 0 warms the page cache, untimed
    for (int w = 0; w < N_WAYS; w++) {
      double t0 = now_s(), px = 0;
      for (int i = 0; i < ds.n; i++) {
        int reduction = 1;
        if (w == TURBO_REDUCED && dataset_max_reduction(&ds, i) > 1)
          reduction = image_reduction_for(ds.source_h[i], ds.source_w[i], view, view);
        Image img;
        if (image_decode(ds.files[i], channels, reduction,
                         w == STB_FULL ? DECODER_STB : DECODER_DEFAULT, &img) != 0) {
          fprintf(stderr, "bench_decode: %s\n", tl_last_error());
          return 1;
        }
        px += (double)img.h * img.w;
        image_free(&img);
      }
      const double t = now_s() - t0;
      if (rep > 0 && t < best[w]) best[w] = t, pixels[w] = px;
    }
  printf("%d images of %s, %d channels, views of %d px, best of %d, one core:\n", ds.n, argv[1],
         channels, view, repeats);
  for (int w = 0; w < N_WAYS; w++)
    printf("  %-38s %8.0f images/s  %7.1f Mpixel/s decoded  (%.2fx stb_image)\n", way_names[w],
           ds.n / best[w], pixels[w] / best[w] / 1e6, best[STB_FULL] / best[w]);
  dataset_free(&ds);
  return 0;
}
