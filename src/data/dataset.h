// Image datasets held in memory as 8-bit pixels: Fashion-MNIST style IDX files (gzip through zlib)
// and ImageFolder trees (root/<class>/*.png|jpg through stb_image).
#pragma once
#include <stdint.h>

typedef struct {
  int n;            // images
  int h, w, c;      // every image has this size (ImageFolder images are resized on load)
  uint8_t *pixels;  // (n, h, w, c), MEM_DATA
  int *labels;      // (n), MEM_DATA
  int n_classes;
  char **class_names;  // (n_classes), ImageFolder only; NULL for IDX
} Dataset;

// Reads an IDX images file (optionally .gz) and the labels file beside it, found by the standard
// name (train-images-idx3-ubyte.gz -> train-labels-idx1-ubyte.gz; t10k-images... likewise).
// `limit` > 0 keeps only the first `limit` images. `channels` 1 or 3 (grayscale replicated).
// Errors (missing file, truncated or corrupt gzip, bad magic, header sizes beyond sane bounds,
// label count mismatch) return -1 with a one-line tl_last_error() naming the path.
int dataset_load_idx(Dataset *ds, const char *images_path, int channels, int limit);

// Reads root/<class>/*.{png,jpg,jpeg,bmp} (classes sorted by name), converted to `channels` and
// resized to image_size x image_size (bilinear). An unreadable image is an error naming its path.
int dataset_load_imagefolder(Dataset *ds, const char *root, int image_size, int channels,
                             int limit);

void dataset_free(Dataset *ds);

// Per-channel mean and std of the pixel values in [0,1] over the whole dataset (c entries each).
void dataset_channel_stats(const Dataset *ds, float *mean, float *std);
