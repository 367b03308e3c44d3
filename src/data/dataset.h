// Image datasets held in memory as 8-bit pixels: Fashion-MNIST style IDX files (gzip through zlib)
// and ImageFolder trees (root/<class>/*.png|jpg through stb_image).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int n;            // images
  int h, w, c;      // every image has this size (ImageFolder images are resized on load)
  uint8_t *pixels;  // (n, h, w, c), MEM_DATA
  int *labels;      // (n), MEM_DATA
  int n_classes;
  char **class_names;  // (n_classes), ImageFolder only; NULL for IDX
  char **files;        // (n) each image's file (root/class/name), ImageFolder only; NULL for IDX
} Dataset;

// Reads an IDX images file (optionally .gz) and the labels file beside it, found by the standard
// name (train-images-idx3-ubyte.gz -> train-labels-idx1-ubyte.gz; t10k-images... likewise).
// `limit` > 0 keeps only the first `limit` images. `channels` 1 or 3 (grayscale replicated).
// Errors (missing file, not a regular file, truncated or corrupt gzip, bad magic, header sizes
// beyond sane bounds or beyond what the file can hold, label count mismatch) return -1 with a
// one-line tl_last_error() naming the path. Memory grows with the data actually read, never
// from the header's counts alone.
int dataset_load_idx(Dataset *ds, const char *images_path, int channels, int limit);

// Reads root/<class>/*.{png,jpg,jpeg,bmp} (classes sorted by name), converted to `channels` and
// resized to image_size x image_size (bilinear). An unreadable image is an error naming its path,
// as is an entry with an image's name that is not a regular file (a FIFO, a device), and an image
// whose header claims more than 16384 pixels a side or 64 megapixels (refused before decoding).
// A root without subfolders is unlabeled data: its own images, labels 0 and n_classes 0.
int dataset_load_imagefolder(Dataset *ds, const char *root, int image_size, int channels,
                             int limit);

void dataset_free(Dataset *ds);

// Puts a test set's labels in the training set's terms before anything is scored: ImageFolder
// classes are matched by name (a test set may hold a subset; a class the training set lacks is
// an error naming it), IDX labels must lie among the training labels. -1 with tl_last_error().
int dataset_align_test_labels(const Dataset *train, Dataset *test, const char *test_path);

// Sizing without loading (`tally plan`). The IDX header of an images file: image count and size
// (before any limit), read without touching the pixels; same errors as dataset_load_idx.
int dataset_idx_peek(const char *images_path, int *n, int *h, int *w);
// Images an ImageFolder tree holds under `limit` (as dataset_load_imagefolder would keep), from
// the directory listing alone.
int dataset_imagefolder_count(const char *root, int limit, int *n);
// MEM_DATA bytes a loaded dataset of n images (h, w, c) holds: pixels and labels.
size_t dataset_bytes(int n, int h, int w, int c);

// Per-channel mean and std of the pixel values in [0,1] over the whole dataset (c entries each).
void dataset_channel_stats(const Dataset *ds, float *mean, float *std);

// Resamples the region rows [y0, y0+crop_h) x cols [x0, x0+crop_w) of an (h, w, c) 8-bit image to
// (out_h, out_w, c) floats on the 0..255 scale, as if the region were cropped out and resized.
// Bilinear (pixel centres aligned); when shrinking, the triangle widens with the scale factor
// so a small output averages the pixels it covers instead of aliasing (as PIL's bilinear).
void image_resample_bilinear(const uint8_t *src, int h, int w, int c, int y0, int x0, int crop_h,
                             int crop_w, float *out, int out_h, int out_w);
