// Image datasets: Fashion-MNIST style IDX files (gzip through zlib), held in memory as 8-bit
// pixels, and ImageFolder trees (root/<class>/*.png|jpg|bmp), streamed from their files (only the
// list and each image's size in memory; data/decode.h) or held in memory at the training size.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/decode.h"

typedef struct {
  int n;            // images
  int h, w, c;      // in memory: every image has this size (ImageFolder images are resized on
                    // load); streamed: the training size, views are cut from the source
  uint8_t *pixels;  // (n, h, w, c), MEM_DATA; NULL when streamed
  // Streamed ImageFolder: each file's own size (from its header at load), MEM_DATA; else NULL.
  uint16_t *source_h, *source_w;  // (n)
  FileIdentity *source_id;        // (n) each file as listed; a file that is not is refused
  int *labels;                    // (n), MEM_DATA
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

// What dataset_load_imagefolder is told, or-ed: DATASET_STREAM, and DATASET_UNLABELED (data.labels
// = none): subfolders are not classes; every image under root, at any depth, is one unlabeled set.
enum { DATASET_STREAM = 1, DATASET_UNLABELED = 2 };

// Lists root/<class>/*.{png,jpg,jpeg,bmp} (classes sorted by name, files by name). DATASET_STREAM:
// reads every image's header (its size, checked as image_read_header does) and keeps only the
// list; views are decoded from the files later (dataset_image). Otherwise decodes every image
// once, converted to `channels` and resized to image_size x image_size (bilinear; the aspect
// ratio is not kept). An unreadable image is an error naming its path, as is an entry with an
// image's name that is not a regular file (a FIFO, a device). A root without subfolders is
// unlabeled data: its own images, labels 0 and n_classes 0.
int dataset_load_imagefolder(Dataset *ds, const char *root, int image_size, int channels, int limit,
                             int flags);

// Image `index` as views are cut from it. In memory: its pixels (h, w, c), not copied. Streamed:
// its file decoded at 1/reduction of each side (JPEG only; other formats at full size), and
// checked to still be the file that was listed (its inode, size in bytes and modification time)
// with the size it had at load: a file changed under a run, even to another image of the same
// size, is an error naming it. img->h, img->w say what was decoded; image_free releases it. -1 with
// tl_last_error().
int dataset_image(const Dataset *ds, int index, int reduction, Image *img);
// The size crops are chosen in: the file's own size when streamed, else (h, w).
void dataset_source_size(const Dataset *ds, int index, int *h, int *w);
// The largest reduction dataset_image may be given for image `index`: 8 for a streamed JPEG
// (libjpeg's scaled decode), else 1.
int dataset_max_reduction(const Dataset *ds, int index);

void dataset_free(Dataset *ds);

// Puts a test set's labels in the training set's terms before anything is scored: ImageFolder
// classes are matched by name (a test set may hold a subset; a class the training set lacks is
// an error naming it), IDX labels must lie among the training labels. -1 with tl_last_error().
int dataset_align_test_labels(const Dataset *train, Dataset *test, const char *test_path);

// Sizing without loading (`tally plan`). The IDX header of an images file: image count and size
// (before any limit), read without touching the pixels; same errors as dataset_load_idx.
int dataset_idx_peek(const char *images_path, int *n, int *h, int *w);
// Images an ImageFolder tree holds under `limit` (as dataset_load_imagefolder would keep), from
// the directory listing alone (flags: DATASET_UNLABELED as there).
int dataset_imagefolder_count(const char *root, int limit, int flags, int *n);
// MEM_DATA bytes a loaded dataset of n images (h, w, c) holds: pixels and labels; streamed,
// labels and each image's size and file identity.
size_t dataset_bytes(int n, int h, int w, int c, int streaming);

// Per-channel mean and std of the pixel values in [0,1] (c entries each). In memory: over every
// pixel of the dataset. Streamed: over the evaluation views (eval_view's crop, at h x w) of
// DATASET_STATS_SAMPLE images spread evenly over the dataset (all of them when it holds fewer),
// summed in image order, so the result does not depend on the thread count. -1 with
// tl_last_error() when an image cannot be decoded.
enum { DATASET_STATS_SAMPLE = 1024 };
int dataset_channel_stats(const Dataset *ds, float *mean, float *std);

// Resamples the region rows [y0, y0+crop_h) x cols [x0, x0+crop_w) of an (h, w, c) 8-bit image to
// (out_h, out_w, c) floats on the 0..255 scale, as if the region were cropped out and resized.
// Bilinear (pixel centres aligned); when shrinking, the triangle widens with the scale factor
// so a small output averages the pixels it covers instead of aliasing (as PIL's bilinear).
void image_resample_bilinear(const uint8_t *src, int h, int w, int c, int y0, int x0, int crop_h,
                             int crop_w, float *out, int out_h, int out_w);
// The same over a fractional box (inside the image, up to a rounding).
void image_resample_box(const uint8_t *src, int h, int w, int c, float y0, float x0, float crop_h,
                        float crop_w, float *out, int out_h, int out_w);

// A crop in an image's own (source) pixel coordinates.
typedef struct {
  int y0, x0, h, w;
} CropBox;
// Resamples `box`, given in the source's coordinates, out of img (decoded at img->reduction) to
// (out_h, out_w, c) floats on the 0..255 scale: the box is cut from the source and resized once.
void image_crop_resize(const Image *img, CropBox box, int out_h, int out_w, float *out);
// The evaluation crop of an h x w image: its centred square of the short side (torchvision's
// Resize(S) then CenterCrop(S) is this square resized to S).
CropBox eval_crop_box(int h, int w);
// Image `index`'s evaluation crop resized to (out_size, out_size, c) floats on the 0..255 scale.
// -1 with tl_last_error() when a streamed image cannot be decoded.
int dataset_eval_pixels(const Dataset *ds, int index, int out_size, float *out);
