// Data layer: IDX and ImageFolder reading (and their failures), resampling, augmentations and the
// prefetching loader, checked against hand-computed values and naive reference loops.
// cmocka needs these first, in this order.
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <ftw.h>
#include <math.h>
#include <omp.h>
#include <stb_image_write.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
// jpeglib.h needs stdio.h's FILE and size_t first.
#include <jpeglib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"

// ---------------------------------------------------------------------------------------------
// Temporary files

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

typedef struct {
  char dir[64];
} TempDir;

// cmocka setup and teardown: each file test gets a fresh directory as its state.
static int temp_dir_make(void **state) {
  TempDir *t = malloc(sizeof *t);
  snprintf(t->dir, sizeof t->dir, "/tmp/tally-test-data-XXXXXX");
  if (!mkdtemp(t->dir)) return -1;
  *state = t;
  return 0;
}

static int temp_dir_remove(void **state) {
  TempDir *t = *state;
  nftw(t->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(t);
  return 0;
}

static char *temp_path(const TempDir *t, const char *name) {
  static char paths[4][256];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, sizeof paths[0], "%s/%s", t->dir, name);
  return p;
}

static void make_dir(const char *path) { assert_int_equal(mkdir(path, 0755), 0); }

static void write_bytes(const char *path, const void *data, size_t n, int gzip) {
  if (gzip) {
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(gz), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
  }
}

static size_t file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (size_t)st.st_size;
}

// The whole file, malloc'd; its size in *n.
static uint8_t *read_whole(const char *path, size_t *n) {
  *n = file_size(path);
  uint8_t *bytes = malloc(*n);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(bytes, 1, *n, f), *n);
  fclose(f);
  return bytes;
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// An IDX file: magic, the dims, then `n_payload` bytes of data.
static void write_idx(const char *path, int gzip, uint32_t magic, const uint32_t *dims, int n_dims,
                      const uint8_t *payload, size_t n_payload) {
  size_t header = 4 * (size_t)(1 + n_dims);
  uint8_t *buf = malloc(header + n_payload);
  put_be32(buf, magic);
  for (int k = 0; k < n_dims; k++) put_be32(buf + 4 * (k + 1), dims[k]);
  if (n_payload) memcpy(buf + header, payload, n_payload);
  write_bytes(path, buf, header + n_payload, gzip);
  free(buf);
}

// The small IDX set every test uses: 6 images of 4x5 pixels, labels i % 3.
enum { SET_N = 6, SET_H = 4, SET_W = 5 };

static uint8_t set_pixel(int i, int y, int x) { return (uint8_t)((i * 31 + y * 7 + x * 3) % 256); }

static void write_idx_set(const char *images_path, const char *labels_path, int gzip, int n_images,
                          int n_labels) {
  uint8_t pixels[SET_N * SET_H * SET_W], labels[SET_N];
  for (int i = 0; i < SET_N; i++) {
    labels[i] = (uint8_t)(i % 3);
    for (int y = 0; y < SET_H; y++)
      for (int x = 0; x < SET_W; x++) pixels[(i * SET_H + y) * SET_W + x] = set_pixel(i, y, x);
  }
  write_idx(images_path, gzip, 0x803, (uint32_t[]){SET_N, SET_H, SET_W}, 3, pixels,
            (size_t)n_images * SET_H * SET_W);
  write_idx(labels_path, gzip, 0x801, (uint32_t[]){(uint32_t)n_labels}, 1, labels,
            (size_t)n_labels);
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

// A failing load must leave no data allocated and name the file in its message.
static void assert_load_idx_fails(const char *path, const char *expect_in_message) {
  size_t data_before = tl_mem_live(MEM_DATA);
  Dataset ds;
  assert_int_equal(dataset_load_idx(&ds, path, 1, 0), -1);
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
  assert_null(ds.pixels);
  assert_contains(tl_last_error(), expect_in_message);
}

// ---------------------------------------------------------------------------------------------
// IDX

static void check_idx_set(const Dataset *ds, int n, int channels) {
  assert_int_equal(ds->n, n);
  assert_int_equal(ds->h, SET_H);
  assert_int_equal(ds->w, SET_W);
  assert_int_equal(ds->c, channels);
  assert_int_equal(ds->n_classes, 3);
  assert_null(ds->class_names);
  for (int i = 0; i < n; i++) {
    assert_int_equal(ds->labels[i], i % 3);
    for (int y = 0; y < SET_H; y++)
      for (int x = 0; x < SET_W; x++)
        for (int ch = 0; ch < channels; ch++)
          assert_int_equal(ds->pixels[((i * SET_H + y) * SET_W + x) * channels + ch],
                           set_pixel(i, y, x));
  }
}

static void test_idx_roundtrip(void **state) {
  const TempDir *t = *state;
  size_t data_before = tl_mem_live(MEM_DATA);
  for (int gzip = 0; gzip <= 1; gzip++) {
    const char *images = temp_path(t, gzip ? "a-images-idx3-ubyte.gz" : "a-images-idx3-ubyte");
    write_idx_set(images, temp_path(t, gzip ? "a-labels-idx1-ubyte.gz" : "a-labels-idx1-ubyte"),
                  gzip, SET_N, SET_N);
    Dataset ds;
    assert_int_equal(dataset_load_idx(&ds, images, 1, 0), 0);
    check_idx_set(&ds, SET_N, 1);
    dataset_free(&ds);
    assert_int_equal(dataset_load_idx(&ds, images, 3, 0), 0);
    check_idx_set(&ds, SET_N, 3);
    dataset_free(&ds);
    assert_int_equal(dataset_load_idx(&ds, images, 1, 4), 0);
    check_idx_set(&ds, 4, 1);
    dataset_free(&ds);
  }
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
}

static void test_idx_missing_file(void **state) {
  const TempDir *t = *state;
  const char *images = temp_path(t, "train-images-idx3-ubyte.gz");
  assert_load_idx_fails(images, images);
  assert_contains(tl_last_error(), "no such file");
  assert_contains(tl_last_error(), "apt-get install dataset-fashion-mnist");
  // The labels file missing alone is an error naming the labels file.
  uint8_t pixel = 7;
  write_idx(images, 1, 0x803, (uint32_t[]){1, 1, 1}, 3, &pixel, 1);
  assert_load_idx_fails(images, temp_path(t, "train-labels-idx1-ubyte.gz"));
  assert_contains(tl_last_error(), "no such file");
  assert_contains(tl_last_error(), images);  // whose labels were looked for
  // A name that does not say where its labels are: missing, it is missing (its labels are
  // not looked for); present, its labels cannot be named.
  const char *odd = temp_path(t, "pictures.gz");
  assert_load_idx_fails(odd, odd);
  assert_contains(tl_last_error(), "no such file");
  write_idx(odd, 1, 0x803, (uint32_t[]){1, 1, 1}, 3, &pixel, 1);
  assert_load_idx_fails(odd, odd);
  assert_contains(tl_last_error(), "cannot name the labels file");
}

static void test_idx_bad_magic(void **state) {
  const TempDir *t = *state;
  const char *images = temp_path(t, "x-images-idx3-ubyte.gz");
  write_idx_set(images, temp_path(t, "x-labels-idx1-ubyte.gz"), 1, SET_N, SET_N);
  // A labels file where the images should be: magic 0x801.
  uint8_t labels[SET_N] = {0};
  write_idx(images, 1, 0x801, (uint32_t[]){SET_N}, 1, labels, SET_N);
  assert_load_idx_fails(images, images);
  assert_contains(tl_last_error(), "magic");
  // Not IDX at all (zlib reads a non-gzip file as is).
  write_bytes(images, "hello, this is text", 19, 0);
  assert_load_idx_fails(images, "magic");
  // Shorter than a header: the magic, then 2 of the 12 bytes of dimensions.
  write_bytes(images, "\0\0\x08\x03\0\0", 6, 1);
  assert_load_idx_fails(images, images);
  assert_contains(tl_last_error(), "truncated: expected 12 bytes of dimensions, got 2");
}

static void test_idx_absurd_header(void **state) {
  const TempDir *t = *state;
  const char *images = temp_path(t, "x-images-idx3-ubyte.gz");
  write_idx_set(images, temp_path(t, "x-labels-idx1-ubyte.gz"), 1, SET_N, SET_N);
  const uint32_t absurd[][3] = {
      {1u << 31, 28, 28},     // 2^31 images
      {100, 5000, 28},        // rows beyond 4096
      {100, 28, 0},           // empty images
      {0, 28, 28},            // no images
      {9000000, 4096, 4096},  // each bound passes, the product (about 140 TiB) does not
  };
  for (size_t k = 0; k < sizeof absurd / sizeof *absurd; k++) {
    write_idx(images, 1, 0x803, absurd[k], 3, NULL, 0);
    assert_load_idx_fails(images, images);
    assert_contains(tl_last_error(), "header claims");
  }
}

static void test_idx_truncated(void **state) {
  const TempDir *t = *state;
  // Raw: the header promises 6 images of 4x5 = 120 bytes; 2 images = 40 bytes are there.
  const char *raw = temp_path(t, "r-images-idx3-ubyte");
  write_idx_set(raw, temp_path(t, "r-labels-idx1-ubyte"), 0, 2, SET_N);
  assert_load_idx_fails(raw, raw);
  assert_contains(tl_last_error(), "truncated: header says 6 images of 4x5, the file holds 2");
  // Gzip: a whole stream cut in half.
  const char *gz = temp_path(t, "g-images-idx3-ubyte.gz");
  write_idx_set(gz, temp_path(t, "g-labels-idx1-ubyte.gz"), 1, SET_N, SET_N);
  assert_int_equal(truncate(gz, (off_t)file_size(gz) / 2), 0);
  assert_load_idx_fails(gz, gz);
  // Labels: fewer bytes than the labels header declares.
  const char *images = temp_path(t, "l-images-idx3-ubyte.gz");
  const char *labels = temp_path(t, "l-labels-idx1-ubyte.gz");
  write_idx_set(images, labels, 1, SET_N, SET_N);
  write_idx(labels, 1, 0x801, (uint32_t[]){SET_N}, 1, (const uint8_t *)"\1\2", 2);
  assert_load_idx_fails(images, labels);
  assert_contains(tl_last_error(), "truncated: header says 6 labels, the file holds 2");
  // Plain labels with more bytes than declared.
  const char *plain_images = temp_path(t, "p-images-idx3-ubyte");
  const char *plain_labels = temp_path(t, "p-labels-idx1-ubyte");
  write_idx_set(plain_images, plain_labels, 0, SET_N, SET_N);
  write_idx(plain_labels, 0, 0x801, (uint32_t[]){SET_N}, 1, (const uint8_t *)"\1\2\0\1\2\0\1\2", 8);
  assert_load_idx_fails(plain_images, plain_labels);
  assert_contains(tl_last_error(), "more data than the header declares");
}

static void test_idx_corrupt_gzip(void **state) {
  const TempDir *t = *state;
  const char *images = temp_path(t, "c-images-idx3-ubyte.gz");
  write_idx_set(images, temp_path(t, "c-labels-idx1-ubyte.gz"), 1, SET_N, SET_N);
  size_t n;
  uint8_t *bytes = read_whole(images, &n);
  // Past the 10-byte gzip header: the deflate data, and the CRC at the end catches what still
  // inflates.
  for (size_t i = 12; i < n - 8; i += 3) bytes[i] ^= 0x5a;
  write_bytes(images, bytes, n, 0);
  free(bytes);
  assert_load_idx_fails(images, images);
}

static void test_idx_label_mismatch(void **state) {
  const TempDir *t = *state;
  const char *images = temp_path(t, "m-images-idx3-ubyte.gz");
  const char *labels = temp_path(t, "m-labels-idx1-ubyte.gz");
  write_idx_set(images, labels, 1, SET_N, SET_N - 1);
  assert_load_idx_fails(images, labels);
  assert_contains(tl_last_error(), "5 labels for the 6 images");
}

// A header that claims far more images than the file holds fails on what the file holds, and
// memory is never allocated from the claim: a plain file's size is compared before anything is
// allocated; a gzip file's claim must fit 1032 times its size (deflate's limit), and below that
// its pixels are allocated as they arrive. 100 images of 28x28 (random, so gzip cannot shrink
// them) under a header of 50000 (39 MB) or 2 million (1.5 GB).
static void test_idx_lying_header(void **state) {
  const TempDir *t = *state;
  enum { REAL = 100, SIDE = 28 };
  static uint8_t pixels[REAL * SIDE * SIDE], labels[REAL];
  uint64_t noise = 42;
  for (size_t i = 0; i < sizeof pixels; i++) {
    noise = noise * 6364136223846793005ull + 1442695040888963407ull;
    pixels[i] = (uint8_t)(noise >> 56);
    if (i < REAL) labels[i] = pixels[i];
  }
  size_t live_before = tl_mem_live_total(), peak_before = tl_mem_peak_total();
  static const struct {
    int gzip;
    uint32_t claimed;
    const char *message;
  } lies[] = {
      {0, 50000, "truncated: header says 50000 images of 28x28, the file holds 100"},
      {1, 50000, "truncated: header says 50000 images of 28x28, the file holds 100"},
      {1, 2000000, "more than a gzip file of"},
  };
  for (size_t k = 0; k < sizeof lies / sizeof *lies; k++) {
    const char *images =
        temp_path(t, lies[k].gzip ? "l-images-idx3-ubyte.gz" : "l-images-idx3-ubyte");
    const char *label_path =
        temp_path(t, lies[k].gzip ? "l-labels-idx1-ubyte.gz" : "l-labels-idx1-ubyte");
    // The labels tell the same lie, so the images are what fails.
    write_idx(images, lies[k].gzip, 0x803, (uint32_t[]){lies[k].claimed, SIDE, SIDE}, 3, pixels,
              sizeof pixels);
    write_idx(label_path, lies[k].gzip, 0x801, (uint32_t[]){lies[k].claimed}, 1, labels, REAL);
    assert_load_idx_fails(images, images);
    assert_contains(tl_last_error(), lies[k].message);
  }
  // At most the first 4 MiB chunk of a gzip file was ever allocated (the earlier tests of this
  // file allocate a few hundred bytes, so the peak before is no cover).
  size_t bound = live_before + (5u << 20);
  size_t peak = tl_mem_peak_total();
  if (peak > (peak_before > bound ? peak_before : bound))
    fail_msg("peak %zu bytes, more than %zu", peak, bound);
  // The image count is checked by `tally plan`'s peek too.
  int n, h, w;
  const char *plain = temp_path(t, "l-images-idx3-ubyte");
  assert_int_equal(dataset_idx_peek(plain, &n, &h, &w), -1);
  assert_contains(tl_last_error(), "truncated: header says 50000 images");
}

// A true header over data that compresses far more than image data usually does (2000 flat
// images: 1.5 MB in 2 KB of gzip) is believed as the data arrives: the block grows past its
// first plausible size and everything loads, widened to 3 channels.
static void test_idx_highly_compressed_loads(void **state) {
  const TempDir *t = *state;
  enum { N = 2000, SIDE = 28 };
  uint8_t *pixels = malloc((size_t)N * SIDE * SIDE), labels[N];
  for (int i = 0; i < N; i++) {
    memset(pixels + (size_t)i * SIDE * SIDE, i % 251, SIDE * SIDE);
    labels[i] = (uint8_t)(i % 10);
  }
  const char *images = temp_path(t, "z-images-idx3-ubyte.gz");
  write_idx(images, 1, 0x803, (uint32_t[]){N, SIDE, SIDE}, 3, pixels, (size_t)N * SIDE * SIDE);
  write_idx(temp_path(t, "z-labels-idx1-ubyte.gz"), 1, 0x801, (uint32_t[]){N}, 1, labels, N);
  free(pixels);
  assert_true(file_size(images) * 16 < (size_t)N * SIDE * SIDE);
  Dataset ds;
  if (dataset_load_idx(&ds, images, 3, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(ds.n, N);
  assert_int_equal(ds.n_classes, 10);
  for (int i = 0; i < N; i++) {
    assert_int_equal(ds.labels[i], i % 10);
    const uint8_t *image = ds.pixels + (size_t)i * SIDE * SIDE * 3;
    assert_int_equal(image[0], i % 251);
    assert_int_equal(image[SIDE * SIDE * 3 - 1], i % 251);
  }
  dataset_free(&ds);
}

// Only regular files are read: a FIFO would block the open (or the first read) forever waiting
// for a writer, and a device may never end. They are refused by name. The alarm turns a reader
// that blocks into a failed test rather than a hung one.
static void test_idx_not_regular(void **state) {
  const TempDir *t = *state;
  alarm(30);
  const char *fifo = temp_path(t, "f-images-idx3-ubyte");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  assert_load_idx_fails(fifo, "f-images-idx3-ubyte: not a regular file");
  int n, h, w;
  assert_int_equal(dataset_idx_peek(fifo, &n, &h, &w), -1);
  assert_contains(tl_last_error(), "not a regular file");
  assert_load_idx_fails("/dev/zero", "/dev/zero: not a regular file");
  const char *dir = temp_path(t, "d-images-idx3-ubyte.gz");
  make_dir(dir);
  assert_load_idx_fails(dir, "d-images-idx3-ubyte.gz: not a regular file");
  // Real images beside a FIFO of labels.
  const char *images = temp_path(t, "g-images-idx3-ubyte.gz");
  const char *labels = temp_path(t, "g-labels-idx1-ubyte.gz");
  write_idx_set(images, labels, 1, SET_N, SET_N);
  remove(labels);
  assert_int_equal(mkfifo(labels, 0644), 0);
  assert_load_idx_fails(images, "g-labels-idx1-ubyte.gz: not a regular file");
  alarm(0);
}

static void test_fashion_mnist(void **state) {
  (void)state;
  const char *path = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  if (access(path, R_OK) != 0) skip();
  Dataset ds;
  if (dataset_load_idx(&ds, path, 1, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(ds.n, 10000);
  assert_int_equal(ds.h, 28);
  assert_int_equal(ds.w, 28);
  assert_int_equal(ds.n_classes, 10);
  // The test set is balanced: 1000 images of each of the 10 classes.
  int per_class[10] = {0};
  for (int i = 0; i < ds.n; i++) {
    assert_in_range(ds.labels[i], 0, 9);
    per_class[ds.labels[i]]++;
  }
  for (int k = 0; k < 10; k++) assert_int_equal(per_class[k], 1000);
  dataset_free(&ds);
}

// ---------------------------------------------------------------------------------------------
// In-memory datasets for the transforms and the loader

static Dataset make_dataset(int n, int h, int w, int c, uint64_t seed) {
  Dataset ds = {.n = n, .h = h, .w = w, .c = c, .n_classes = 4};
  ds.pixels = tl_alloc((size_t)n * h * w * c, MEM_DATA, COMP_OTHER);
  ds.labels = tl_alloc(sizeof *ds.labels * n, MEM_DATA, COMP_OTHER);
  Rng r = rng_stream(seed, RNG_TEST, 0, 0);
  for (size_t i = 0; i < (size_t)n * h * w * c; i++) ds.pixels[i] = (uint8_t)rng_below(&r, 256);
  for (int i = 0; i < n; i++) ds.labels[i] = i % 4;
  return ds;
}

static AugmentParams plain_params(int out_size) {
  AugmentParams p = {.out_size = out_size,
                     .crop_scale_min = 1,
                     .crop_scale_max = 1,
                     .crop_ratio_min = 1,
                     .crop_ratio_max = 1,
                     .mean = {0.5f, 0.25f, 0.75f},
                     .std = {0.25f, 0.5f, 2.0f}};
  return p;
}

static AugmentParams ssl_params(int out_size) {
  AugmentParams p = {.out_size = out_size,
                     .crop_scale_min = 0.2f,
                     .crop_scale_max = 1.0f,
                     .crop_ratio_min = 3.0f / 4.0f,
                     .crop_ratio_max = 4.0f / 3.0f,
                     .flip_prob = 0.5f,
                     .jitter_strength = 0.4f,
                     .jitter_prob = 0.8f,
                     .grayscale_prob = 0.2f,
                     .mean = {0.5f, 0.5f, 0.5f},
                     .std = {0.25f, 0.25f, 0.25f}};
  return p;
}

// Textbook bilinear with half-pixel centres and edge clamping (OpenCV INTER_LINEAR, PyTorch
// align_corners=False), valid when enlarging.
static float reference_bilinear(const uint8_t *img, int h, int w, int c, int ch, int oy, int ox,
                                int out_h, int out_w) {
  float sy = ((float)oy + 0.5f) * h / out_h - 0.5f, sx = ((float)ox + 0.5f) * w / out_w - 0.5f;
  sy = sy < 0 ? 0 : sy;
  sx = sx < 0 ? 0 : sx;
  int y0 = (int)sy, x0 = (int)sx;
  int y1 = y0 + 1 < h ? y0 + 1 : h - 1, x1 = x0 + 1 < w ? x0 + 1 : w - 1;
  float fy = sy - y0, fx = sx - x0;
#define PX(y, x) (float)img[((y)*w + (x)) * c + ch]
  return (1 - fy) * ((1 - fx) * PX(y0, x0) + fx * PX(y0, x1)) +
         fy * ((1 - fx) * PX(y1, x0) + fx * PX(y1, x1));
#undef PX
}

static void test_resample(void **state) {
  (void)state;
  // Enlarging 3x4 (2 channels) to 7x5 matches the textbook formula.
  Dataset ds = make_dataset(1, 3, 4, 2, 5);
  float out[7 * 5 * 2];
  image_resample_bilinear(ds.pixels, 3, 4, 2, 0, 0, 3, 4, out, 7, 5);
  for (int oy = 0; oy < 7; oy++)
    for (int ox = 0; ox < 5; ox++)
      for (int ch = 0; ch < 2; ch++)
        assert_float_equal(out[(oy * 5 + ox) * 2 + ch],
                           reference_bilinear(ds.pixels, 3, 4, 2, ch, oy, ox, 7, 5), 1e-3);
  // A crop at the same size is the sub-block, exactly.
  float block[2 * 2 * 2];
  image_resample_bilinear(ds.pixels, 3, 4, 2, 1, 2, 2, 2, block, 2, 2);
  for (int y = 0; y < 2; y++)
    for (int x = 0; x < 2; x++)
      for (int ch = 0; ch < 2; ch++)
        assert_true(block[(y * 2 + x) * 2 + ch] == ds.pixels[((1 + y) * 4 + 2 + x) * 2 + ch]);
  dataset_free(&ds);
  // Halving [0 40 80 120]: the triangle widens to 2 pixels. Output 0 is centred at 1.0, weights
  // 0.75, 0.75, 0.25 on pixels 0..2; output 1 at 3.0, weights 0.25, 0.75, 0.75 on pixels 1..3.
  const uint8_t row[4] = {0, 40, 80, 120};
  float half[2];
  image_resample_bilinear(row, 1, 4, 1, 0, 0, 1, 4, half, 1, 2);
  assert_float_equal(half[0], (0.75f * 0 + 0.75f * 40 + 0.25f * 80) / 1.75f, 1e-4);
  assert_float_equal(half[1], (0.25f * 40 + 0.75f * 80 + 0.75f * 120) / 1.75f, 1e-4);
}

static void test_channel_stats(void **state) {
  (void)state;
  // Channel 0: 0, 255, 255, 255 -> mean 0.75, std sqrt(0.75 * 0.25). Channel 1: 51 everywhere.
  Dataset ds = make_dataset(2, 1, 2, 2, 1);
  const uint8_t px[8] = {0, 51, 255, 51, 255, 51, 255, 51};
  memcpy(ds.pixels, px, sizeof px);
  float mean[2], std[2];
  dataset_channel_stats(&ds, mean, std);
  assert_float_equal(mean[0], 0.75, 1e-6);
  assert_float_equal(std[0], sqrt(0.75 * 0.25), 1e-6);
  assert_float_equal(mean[1], 0.2, 1e-6);
  assert_float_equal(std[1], 0, 1e-3);
  dataset_free(&ds);
}

// ---------------------------------------------------------------------------------------------
// Augmentations

static void test_augment_determinism(void **state) {
  (void)state;
  Dataset ds = make_dataset(3, 12, 12, 3, 2);
  AugmentParams p = ssl_params(10);
  float a[10 * 10 * 3], b[10 * 10 * 3];
  for (int index = 0; index < 3; index++) {
    Rng r1 = rng_stream(42, RNG_AUGMENT, 7, (uint64_t)index);
    Rng r2 = rng_stream(42, RNG_AUGMENT, 7, (uint64_t)index);
    augment_view(&ds, index, &p, &r1, a);
    augment_view(&ds, index, &p, &r2, b);
    assert_memory_equal(a, b, sizeof a);
    Rng r3 = rng_stream(42, RNG_AUGMENT, 8, (uint64_t)index);
    augment_view(&ds, index, &p, &r3, b);
    assert_memory_not_equal(a, b, sizeof a);
  }
  dataset_free(&ds);
}

// With the crop fixed to the whole image and no colour changes, a view is the normalized image,
// mirrored when flipped: exactly.
static void test_augment_flip_exact(void **state) {
  (void)state;
  // Odd and even widths: the middle column stays put only in the odd one.
  for (int c = 1; c <= 3; c += 2) {
    const int size = c == 1 ? 9 : 8, n_values = size * size * c;
    Dataset ds = make_dataset(2, size, size, c, 3);
    AugmentParams p = plain_params(size);
    float out[9 * 9 * 3], eval[9 * 9 * 3];
    const uint8_t *img = ds.pixels + n_values;  // image 1
    for (int flip = 0; flip <= 1; flip++) {
      p.flip_prob = (float)flip;
      Rng r = rng_stream(1, RNG_AUGMENT, 0, 1);
      augment_view(&ds, 1, &p, &r, out);
      for (int y = 0; y < size; y++)
        for (int x = 0; x < size; x++)
          for (int ch = 0; ch < c; ch++) {
            int src_x = flip ? size - 1 - x : x;
            float v = img[(y * size + src_x) * c + ch] / 255.0f;
            assert_true(out[(y * size + x) * c + ch] == (v - p.mean[ch]) / p.std[ch]);
          }
    }
    // The evaluation view at the image's own size is the unflipped case.
    eval_view(&ds, 1, &p, eval);
    p.flip_prob = 0;
    Rng r = rng_stream(1, RNG_AUGMENT, 0, 1);
    augment_view(&ds, 1, &p, &r, out);
    assert_memory_equal(eval, out, sizeof(float) * n_values);
    dataset_free(&ds);
  }
}

static void test_eval_view_resize(void **state) {
  (void)state;
  Dataset ds = make_dataset(2, 4, 4, 1, 4);
  AugmentParams p = plain_params(10);
  float out[100];
  eval_view(&ds, 1, &p, out);
  for (int oy = 0; oy < 10; oy++)
    for (int ox = 0; ox < 10; ox++) {
      float v = reference_bilinear(ds.pixels + 16, 4, 4, 1, 0, oy, ox, 10, 10) / 255.0f;
      assert_float_equal(out[oy * 10 + ox], (v - 0.5f) / 0.25f, 1e-4);
    }
  dataset_free(&ds);
}

// Ramps make the crop readable from the output: red = 8x, green = 8y, so the first and last
// output columns (rows) hold the crop's first and last source columns (rows) exactly.
static void test_augment_crop_statistics(void **state) {
  (void)state;
  enum { S = 32, DRAWS = 400 };
  Dataset ds = make_dataset(1, S, S, 3, 0);
  for (int y = 0; y < S; y++)
    for (int x = 0; x < S; x++) {
      uint8_t *px = ds.pixels + (y * S + x) * 3;
      px[0] = (uint8_t)(8 * x), px[1] = (uint8_t)(8 * y), px[2] = 0;
    }
  AugmentParams p = ssl_params(S);
  p.jitter_prob = p.grayscale_prob = 0;
  for (int ch = 0; ch < 3; ch++) p.mean[ch] = 0, p.std[ch] = 1;
  static float out[S * S * 3];
  double area_sum = 0;
  int flips = 0, touches_left = 0, away_from_left = 0;
  for (int d = 0; d < DRAWS; d++) {
    Rng r = rng_stream(9, RNG_AUGMENT, (uint64_t)d, 0);
    augment_view(&ds, 0, &p, &r, out);
    float first_red = out[0] * 255 / 8, last_red = out[(S - 1) * 3] * 255 / 8;
    float top_green = out[1] * 255 / 8, bottom_green = out[((S - 1) * S) * 3 + 1] * 255 / 8;
    int flipped = first_red > last_red;
    flips += flipped;
    int x0 = (int)lrintf(flipped ? last_red : first_red);
    int w = (int)lrintf(fabsf(last_red - first_red)) + 1;
    int y0 = (int)lrintf(top_green), h = (int)lrintf(bottom_green - top_green) + 1;
    assert_true(x0 >= 0 && x0 + w <= S && y0 >= 0 && y0 + h <= S);
    float area = (float)(w * h) / (S * S), ratio = (float)w / h;
    // Rounding the sides to whole pixels moves area and ratio a little past their ranges.
    assert_true(area >= 0.17f && area <= 1.0f);
    assert_true(ratio >= 0.75f - 0.1f && ratio <= 4.0f / 3.0f + 0.1f);
    area_sum += area;
    touches_left += x0 == 0;
    away_from_left += x0 > 4;
  }
  // Uniform scale in [0.2, 1] has mean 0.6; boxes that overflow a side are redrawn, which pulls
  // the mean down a little.
  double mean_area = area_sum / DRAWS;
  assert_true(mean_area > 0.45 && mean_area < 0.65);
  assert_in_range(flips, DRAWS * 4 / 10, DRAWS * 6 / 10);
  assert_true(touches_left > 0 && away_from_left > 0);
  dataset_free(&ds);
}

// On a constant gray image contrast changes nothing, so the view is the pixel times the
// brightness factor, which must spread over [1-s, 1+s].
static void test_augment_brightness_range(void **state) {
  (void)state;
  Dataset ds = make_dataset(1, 6, 6, 1, 0);
  memset(ds.pixels, 100, 36);
  AugmentParams p = plain_params(6);
  p.jitter_prob = 1;
  p.jitter_strength = 0.4f;
  p.mean[0] = 0, p.std[0] = 1;
  float out[36], lowest = 2, highest = 0;
  for (int d = 0; d < 200; d++) {
    Rng r = rng_stream(3, RNG_AUGMENT, (uint64_t)d, 0);
    augment_view(&ds, 0, &p, &r, out);
    float factor = out[0] * 255 / 100;
    for (int i = 1; i < 36; i++) assert_float_equal(out[i], out[0], 1e-6);
    assert_true(factor >= 0.6f - 1e-4f && factor <= 1.4f + 1e-4f);
    lowest = factor < lowest ? factor : lowest;
    highest = factor > highest ? factor : highest;
  }
  assert_true(lowest < 0.65f && highest > 1.35f);
  dataset_free(&ds);
}

static void test_augment_grayscale(void **state) {
  (void)state;
  Dataset ds = make_dataset(1, 5, 5, 3, 6);
  AugmentParams p = plain_params(5);
  p.grayscale_prob = 1;
  for (int ch = 0; ch < 3; ch++) p.mean[ch] = 0, p.std[ch] = 1;
  float out[75];
  Rng r = rng_stream(1, RNG_AUGMENT, 0, 0);
  augment_view(&ds, 0, &p, &r, out);
  for (int i = 0; i < 25; i++) {
    const uint8_t *px = ds.pixels + 3 * i;
    float luma = (0.2989f * px[0] + 0.587f * px[1] + 0.114f * px[2]) / 255.0f;
    for (int ch = 0; ch < 3; ch++) assert_float_equal(out[3 * i + ch], luma, 1e-5);
  }
  dataset_free(&ds);
}

static void test_augment_solarize(void **state) {
  (void)state;
  Dataset ds = make_dataset(1, 6, 6, 1, 9);
  for (int i = 0; i < 36; i++) ds.pixels[i] = (uint8_t)(i * 7);  // 0 .. 245: both sides of 0.5
  AugmentParams p = plain_params(6);
  p.solarize_prob = 1;
  p.mean[0] = 0, p.std[0] = 1;
  float out[36];
  Rng r = rng_stream(1, RNG_AUGMENT, 0, 0);
  augment_view(&ds, 0, &p, &r, out);
  for (int i = 0; i < 36; i++) {
    float v = ds.pixels[i] / 255.0f;
    assert_float_equal(out[i], v >= 0.5f ? 1.0f - v : v, 1e-6);
  }
  dataset_free(&ds);
}

// blur_prob = 1 in a view: the same crop smoothed (never more total variation, nearly the same
// mean), visibly so in most draws (sigma near its 0.1 px minimum leaves the image as it was).
static void test_augment_blur_applied(void **state) {
  (void)state;
  Dataset ds = make_dataset(1, 12, 12, 1, 10);
  AugmentParams p = plain_params(12);
  p.mean[0] = 0, p.std[0] = 1;
  float sharp[144], blurred[144];
  int smoothed = 0;
  for (int d = 0; d < 20; d++) {
    Rng r1 = rng_stream(4, RNG_AUGMENT, (uint64_t)d, 0), r2 = r1;
    p.blur_prob = 0;
    augment_view(&ds, 0, &p, &r1, sharp);
    p.blur_prob = 1;
    augment_view(&ds, 0, &p, &r2, blurred);
    double tv_sharp = 0, tv_blurred = 0, mean_sharp = 0, mean_blurred = 0;
    for (int y = 0; y < 12; y++)
      for (int x = 0; x < 12; x++) {
        mean_sharp += sharp[y * 12 + x] / 144.0;
        mean_blurred += blurred[y * 12 + x] / 144.0;
        if (x + 1 < 12) {
          tv_sharp += fabs(sharp[y * 12 + x + 1] - sharp[y * 12 + x]);
          tv_blurred += fabs(blurred[y * 12 + x + 1] - blurred[y * 12 + x]);
        }
      }
    assert_true(tv_blurred <= tv_sharp + 1e-6);
    smoothed += tv_blurred < 0.9 * tv_sharp;
    assert_float_equal(mean_blurred, mean_sharp, 0.05);
  }
  assert_true(smoothed >= 10);
  dataset_free(&ds);
}

// Mirror index with the edge pixel not repeated (numpy/torch "reflect"), written out by cases
// (one reflection suffices for kernels up to 2 * S - 1).
static int reflect_reference(int i, int n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * n - 2 - i;
  return i;
}

// The separable blur against a direct 2-D sum with weights exp(-d^2 / (2 sigma^2)) normalized
// over the whole kernel, on an RGB image; and a constant image stays constant.
static void test_gaussian_blur(void **state) {
  (void)state;
  enum { S = 7, C = 3 };
  const float sigma = 1.3f;
  float img[S * S * C], ref[S * S * C];
  for (int i = 0; i < S * S * C; i++) img[i] = (float)((i * 37) % 101) / 100.0f;
  // 9 is wider than the image.
  for (int kernel = 3; kernel <= 9; kernel += 2) {
    const int r = kernel / 2;
    float blurred[S * S * C];
    memcpy(blurred, img, sizeof img);
    gaussian_blur(blurred, S, C, kernel, sigma);
    double norm = 0;
    for (int dy = -r; dy <= r; dy++)
      for (int dx = -r; dx <= r; dx++) norm += exp(-(dx * dx + dy * dy) / (2.0 * sigma * sigma));
    for (int y = 0; y < S; y++)
      for (int x = 0; x < S; x++)
        for (int ch = 0; ch < C; ch++) {
          double acc = 0;
          for (int dy = -r; dy <= r; dy++)
            for (int dx = -r; dx <= r; dx++) {
              int sy = reflect_reference(y + dy, S), sx = reflect_reference(x + dx, S);
              acc +=
                  exp(-(dx * dx + dy * dy) / (2.0 * sigma * sigma)) * img[(sy * S + sx) * C + ch];
            }
          ref[(y * S + x) * C + ch] = (float)(acc / norm);
        }
    for (int i = 0; i < S * S * C; i++) assert_float_equal(blurred[i], ref[i], 1e-5);
  }
  float flat[S * S * C];
  for (int i = 0; i < S * S * C; i++) flat[i] = 0.25f;
  gaussian_blur(flat, S, C, 5, 2.0f);
  for (int i = 0; i < S * S * C; i++) assert_float_equal(flat[i], 0.25f, 1e-6);
  // SimCLR's kernel: 10% of the side, odd, at least 3.
  assert_int_equal(augment_blur_kernel(28), 3);
  assert_int_equal(augment_blur_kernel(96), 9);
  assert_int_equal(augment_blur_kernel(224), 23);
}

// ---------------------------------------------------------------------------------------------
// ImageFolder

static void write_png(const char *path, int w, int h, int c, const uint8_t *pixels) {
  assert_int_not_equal(stbi_write_png(path, w, h, c, pixels, w * c), 0);
}

// A PNG that is only its signature, an IHDR chunk claiming w x h RGB pixels (with its CRC, as a
// decoder may check it) and IEND: enough for stbi_info, with none of the pixels.
static void write_png_header(const char *path, uint32_t w, uint32_t h) {
  uint8_t png[8 + 25 + 12] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  uint8_t *ihdr = png + 8, *iend = png + 33;
  put_be32(ihdr, 13);
  memcpy(ihdr + 4, "IHDR", 4);
  put_be32(ihdr + 8, w);
  put_be32(ihdr + 12, h);
  ihdr[16] = 8, ihdr[17] = 2;  // 8 bits, RGB; compression, filter, interlace 0
  put_be32(ihdr + 21, (uint32_t)crc32(0, ihdr + 4, 17));
  memcpy(iend + 4, "IEND", 4);
  put_be32(iend + 8, (uint32_t)crc32(0, iend + 4, 4));
  write_bytes(path, png, sizeof png, 0);
}

static uint8_t pattern(int y, int x, int ch) { return (uint8_t)(y * 29 + x * 13 + ch * 71); }

// root/zebra/b.png (8x8 RGB pattern), root/zebra/a.png (12x6 constant RGB), root/ant/c.png
// (8x8 gray pattern), plus files that are not images.
static void write_image_tree(const TempDir *t) {
  make_dir(temp_path(t, "zebra"));
  make_dir(temp_path(t, "ant"));
  uint8_t rgb[8 * 8 * 3], constant[12 * 6 * 3], gray[8 * 8];
  for (int y = 0; y < 8; y++)
    for (int x = 0; x < 8; x++) {
      gray[y * 8 + x] = pattern(y, x, 2);
      for (int ch = 0; ch < 3; ch++) rgb[(y * 8 + x) * 3 + ch] = pattern(y, x, ch);
    }
  for (int i = 0; i < 12 * 6; i++)
    constant[3 * i] = 10, constant[3 * i + 1] = 200, constant[3 * i + 2] = 90;
  write_png(temp_path(t, "zebra/b.png"), 8, 8, 3, rgb);
  write_png(temp_path(t, "zebra/a.png"), 12, 6, 3, constant);
  write_png(temp_path(t, "ant/c.png"), 8, 8, 1, gray);
  write_bytes(temp_path(t, "zebra/notes.txt"), "not an image", 12, 0);
  write_bytes(temp_path(t, "README"), "a file beside the classes", 25, 0);
}

static void test_imagefolder(void **state) {
  const TempDir *t = *state;
  write_image_tree(t);
  size_t data_before = tl_mem_live(MEM_DATA);
  Dataset ds;
  if (dataset_load_imagefolder(&ds, t->dir, 8, 3, 0, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.h, 8);
  assert_int_equal(ds.w, 8);
  assert_int_equal(ds.c, 3);
  assert_int_equal(ds.n_classes, 2);
  assert_string_equal(ds.class_names[0], "ant");
  assert_string_equal(ds.class_names[1], "zebra");
  // Order: ant/c.png, zebra/a.png, zebra/b.png.
  assert_int_equal(ds.labels[0], 0);
  assert_int_equal(ds.labels[1], 1);
  assert_int_equal(ds.labels[2], 1);
  const uint8_t *c_png = ds.pixels, *a_png = ds.pixels + 192, *b_png = ds.pixels + 384;
  for (int y = 0; y < 8; y++)
    for (int x = 0; x < 8; x++)
      for (int ch = 0; ch < 3; ch++) {
        int i = (y * 8 + x) * 3 + ch;
        assert_int_equal(c_png[i], pattern(y, x, 2));                   // gray replicated
        assert_int_equal(a_png[i], ch == 0 ? 10 : ch == 1 ? 200 : 90);  // resized constant
        assert_int_equal(b_png[i], pattern(y, x, ch));                  // same size: untouched
      }
  dataset_free(&ds);

  // One channel: RGB becomes luminance (stb's integer weights round slightly differently).
  assert_int_equal(dataset_load_imagefolder(&ds, t->dir, 8, 1, 0, 0), 0);
  for (int y = 0; y < 8; y++)
    for (int x = 0; x < 8; x++) {
      float luma =
          0.299f * pattern(y, x, 0) + 0.587f * pattern(y, x, 1) + 0.114f * pattern(y, x, 2);
      assert_float_equal(ds.pixels[128 + y * 8 + x], luma, 1.5);
    }
  dataset_free(&ds);

  // A limit of 2 keeps one image of each class, not the first two of the tree.
  assert_int_equal(dataset_load_imagefolder(&ds, t->dir, 4, 3, 2, 0), 0);
  assert_int_equal(ds.n, 2);
  assert_int_equal(ds.labels[0], 0);
  assert_int_equal(ds.labels[1], 1);
  dataset_free(&ds);
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
}

// Images above 4 Mi pixels are decoded one at a time (bounding the memory of parallel decodes);
// they load as any other. Two of them (2048x2049, gray) in one class, plus the small tree.
static void test_imagefolder_large_images(void **state) {
  const TempDir *t = *state;
  write_image_tree(t);
  uint8_t *big = malloc(2048 * 2049);
  memset(big, 77, 2048 * 2049);
  write_png(temp_path(t, "ant/big1.png"), 2048, 2049, 1, big);
  memset(big, 99, 2048 * 2049);
  write_png(temp_path(t, "ant/big2.png"), 2048, 2049, 1, big);
  free(big);
  Dataset ds;
  if (dataset_load_imagefolder(&ds, t->dir, 8, 1, 0, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(ds.n, 5);
  // Order: ant/big1.png, ant/big2.png, ant/c.png, zebra/...
  for (int i = 0; i < 64; i++) {
    assert_int_equal(ds.pixels[i], 77);
    assert_int_equal(ds.pixels[64 + i], 99);
  }
  dataset_free(&ds);
}

// A bilevel (1 bit a pixel) greyscale PNG of w x h white pixels, as scanners and line art store
// them: 8 pixels a byte before deflate, so far more pixels per file byte than 8-bit images.
static void write_bilevel_png(const char *path, uint32_t w, uint32_t h) {
  const size_t row = 1 + (w + 7) / 8, raw_n = row * h;
  uint8_t *raw = malloc(raw_n);
  for (size_t y = 0; y < h; y++) {
    raw[y * row] = 0;  // filter: none
    memset(raw + y * row + 1, 0xff, row - 1);
  }
  uLongf packed_n = compressBound(raw_n);
  uint8_t *png = malloc(8 + 25 + 12 + packed_n + 12);
  assert_int_equal(compress2(png + 8 + 25 + 8, &packed_n, raw, raw_n, 9), Z_OK);
  memcpy(png, "\x89PNG\r\n\x1a\n", 8);
  uint8_t *ihdr = png + 8, *idat = png + 33, *iend = idat + 12 + packed_n;
  put_be32(ihdr, 13);
  memcpy(ihdr + 4, "IHDR", 4);
  put_be32(ihdr + 8, w);
  put_be32(ihdr + 12, h);
  ihdr[16] = 1, ihdr[17] = 0, ihdr[18] = ihdr[19] = ihdr[20] = 0;  // 1 bit, greyscale
  put_be32(ihdr + 21, (uint32_t)crc32(0, ihdr + 4, 17));
  put_be32(idat, (uint32_t)packed_n);
  memcpy(idat + 4, "IDAT", 4);
  put_be32(idat + 8 + packed_n, (uint32_t)crc32(0, idat + 4, 4 + (uInt)packed_n));
  put_be32(iend, 0);
  memcpy(iend + 4, "IEND", 4);
  put_be32(iend + 8, (uint32_t)crc32(0, iend + 4, 4));
  write_bytes(path, png, (size_t)(iend + 12 - png), 0);
  free(raw);
  free(png);
}

// A valid bilevel scan stores more than 1100 pixels per file byte (a white 2048x2048 page is a
// few hundred bytes): the check against made-up headers counts its stored bytes, not pixels.
static void test_imagefolder_bilevel_png(void **state) {
  const TempDir *t = *state;
  write_image_tree(t);
  write_bilevel_png(temp_path(t, "ant/page.png"), 2048, 2048);
  struct stat st;
  assert_int_equal(stat(temp_path(t, "ant/page.png"), &st), 0);
  assert_true((double)2048 * 2048 / (double)st.st_size > 1100);
  Dataset ds;
  if (dataset_load_imagefolder(&ds, t->dir, 8, 1, 0, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(ds.n, 4);
  for (int i = 0; i < 64; i++) assert_int_equal(ds.pixels[64 + i], 255);  // ant/page.png
  dataset_free(&ds);
}

static void assert_imagefolder_fails(const char *root, const char *expect_in_message) {
  size_t data_before = tl_mem_live(MEM_DATA);
  Dataset ds;
  assert_int_equal(dataset_load_imagefolder(&ds, root, 8, 3, 0, 0), -1);
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
  assert_contains(tl_last_error(), expect_in_message);
}

static void test_imagefolder_errors(void **state) {
  const TempDir *t = *state;
  write_image_tree(t);
  // Not an image at all.
  const char *garbage = temp_path(t, "zebra/d.png");
  write_bytes(garbage, "this is not a png file at all", 29, 0);
  assert_imagefolder_fails(t->dir, garbage);
  remove(garbage);
  // A PNG cut short: the header still reads, the pixels do not.
  const char *whole = temp_path(t, "zebra/b.png");
  const char *cut = temp_path(t, "zebra/e.png");
  size_t n;
  uint8_t *bytes = read_whole(whole, &n);
  write_bytes(cut, bytes, n / 2, 0);
  free(bytes);
  assert_imagefolder_fails(t->dir, cut);
  remove(cut);
  // Larger than 16384 pixels on a side is refused before decoding.
  const char *wide = temp_path(t, "ant/wide.png");
  uint8_t *row = calloc(16385, 1);
  write_png(wide, 16385, 1, 1, row);
  free(row);
  assert_imagefolder_fails(t->dir, wide);
  remove(wide);
  // A header claiming 9000x9000 (81 Mi pixels: each side passes, the whole does not) is refused
  // from the header, before stb allocates anything.
  const char *huge = temp_path(t, "ant/huge.png");
  write_png_header(huge, 9000, 9000);
  assert_imagefolder_fails(t->dir, huge);
  assert_contains(tl_last_error(), "9000x9000 pixels");
  remove(huge);
  // Something named like an image that is not a regular file: a FIFO would block stb's fopen
  // until a writer came. The alarm fails the test instead of hanging it.
  const char *fifo = temp_path(t, "zebra/x.png");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  alarm(30);
  assert_imagefolder_fails(t->dir, "zebra/x.png: not a regular file");
  int count;
  assert_int_equal(dataset_imagefolder_count(t->dir, 0, 0, &count), -1);
  assert_contains(tl_last_error(), "zebra/x.png: not a regular file");
  alarm(0);
  remove(fifo);
  // Control characters in a file name are shown escaped, not sent to the terminal.
  const char *escape = temp_path(t, "zebra/\x1b[31mred.png");
  write_bytes(escape, "not a png", 9, 0);
  assert_imagefolder_fails(t->dir, "zebra/\\x1b[31mred.png: its content is not the image format");
  assert_null(strchr(tl_last_error(), '\x1b'));
  remove(escape);
  // An image beside the class folders belongs to no class: refused, not left out unsaid.
  const uint8_t gray[64] = {0};
  write_png(temp_path(t, "stray.png"), 8, 8, 1, gray);
  assert_imagefolder_fails(t->dir, "1 image beside the class folders (stray.png)");
  remove(temp_path(t, "stray.png"));
  // An empty class folder, and a root that is missing.
  make_dir(temp_path(t, "empty"));
  assert_imagefolder_fails(t->dir, temp_path(t, "empty"));
  assert_imagefolder_fails(temp_path(t, "nowhere"), temp_path(t, "nowhere"));
}

// ---------------------------------------------------------------------------------------------
// Loader

// A recipe of one group (what every objective but a multi-crop one asks for); the loader copies
// it, so one static recipe serves every call.
static const ViewRecipe *one_group(const AugmentParams *p, int count) {
  static ViewRecipe r;
  r = view_recipe_single(p, count);
  return &r;
}

// Groups of views at their own sizes and augmentations (a multi-crop recipe: two large crops,
// three small ones without flips): each view is augment_view of its group's parameters with the
// stream of its index over all groups, laid out group after group, each view-major.
static void test_loader_view_groups(void **state) {
  (void)state;
  enum { N_IMG = 12, BATCH = 4, LARGE = 10, SMALL = 6 };
  Dataset ds = make_dataset(N_IMG, 12, 12, 3, 5);
  ViewRecipe r = {.n_groups = 2};
  r.group[0] = (ViewGroup){.count = 2, .aug = ssl_params(LARGE)};
  r.group[1] = (ViewGroup){.count = 3, .aug = ssl_params(SMALL)};
  r.group[1].aug.flip_prob = 0;
  r.group[1].aug.crop_scale_min = 0.05f, r.group[1].aug.crop_scale_max = 0.4f;
  Loader l;
  assert_int_equal(loader_init(&l, &ds, &r, BATCH, 7, 0, BATCH, 0), 0);
  const Batch *b = loader_next(&l, NULL);
  assert_int_equal(b->n_views, 5);
  assert_int_equal(b->n_groups, 2);
  assert_int_equal(b->group[0].count, 2);
  assert_int_equal(b->group[1].size, SMALL);
  assert_ptr_equal(b->group[0].views, b->views);
  assert_ptr_equal(b->group[1].views, b->views + (size_t)2 * BATCH * LARGE * LARGE * 3);
  float want[LARGE * LARGE * 3];
  for (int i = 0; i < BATCH; i++)
    for (int g = 0, v = 0; g < 2; g++) {
      const int side = r.group[g].aug.out_size;
      const size_t floats = (size_t)side * side * 3;
      for (int k = 0; k < r.group[g].count; k++, v++) {
        Rng rng =
            rng_stream(7, RNG_AUGMENT, (uint64_t)0 << 32 | (uint64_t)v, (uint64_t)b->indices[i]);
        augment_view(&ds, b->indices[i], &r.group[g].aug, &rng, want);
        assert_memory_equal(b->group[g].views + ((size_t)k * BATCH + i) * floats, want,
                            sizeof(float) * floats);
      }
    }
  loader_destroy(&l);
  // The memory a plan counts for it: both slots' views at each group's size.
  assert_int_equal(loader_buffer_bytes(N_IMG, BATCH, &r, 3) -
                       loader_buffer_bytes(N_IMG, BATCH, one_group(&r.group[0].aug, 2), 3),
                   2 * sizeof(float) * BATCH * 3 * SMALL * SMALL * 3);
  dataset_free(&ds);
}

// Every rank's shard, view by view, laid side by side must be the world=1 batch.
static void check_shards_concatenate(const Dataset *ds, const AugmentParams *p, int world,
                                     const int *shard_sizes) {
  int shard_offsets[4] = {0};
  for (int r = 1; r < world; r++) shard_offsets[r] = shard_offsets[r - 1] + shard_sizes[r - 1];
  enum { BATCH = 6, VIEWS = 2, STEPS = 5 };
  const size_t view_floats = (size_t)p->out_size * p->out_size * ds->c;
  Loader whole, parts[4];
  assert_int_equal(loader_init(&whole, ds, one_group(p, VIEWS), BATCH, 11, 0, BATCH, 0), 0);
  for (int r = 0; r < world; r++)
    assert_int_equal(loader_init(&parts[r], ds, one_group(p, VIEWS), BATCH, 11, shard_offsets[r],
                                 shard_sizes[r], 0),
                     0);
  for (int s = 0; s < STEPS; s++) {
    const Batch *w = loader_next(&whole, NULL);
    assert_int_equal(w->n, BATCH);
    int at = 0;
    for (int r = 0; r < world; r++) {
      const Batch *b = loader_next(&parts[r], NULL);
      assert_int_equal(b->global_step, s);
      assert_memory_equal(b->indices, w->indices + at, sizeof(int) * b->n);
      assert_memory_equal(b->labels, w->labels + at, sizeof(int) * b->n);
      for (int v = 0; v < VIEWS; v++)
        assert_memory_equal(b->views + (size_t)v * b->n * view_floats,
                            w->views + ((size_t)v * BATCH + at) * view_floats,
                            sizeof(float) * b->n * view_floats);
      at += b->n;
    }
    assert_int_equal(at, BATCH);
  }
  loader_destroy(&whole);
  for (int r = 0; r < world; r++) loader_destroy(&parts[r]);
}

static void test_loader_shards_concatenate(void **state) {
  (void)state;
  Dataset ds = make_dataset(24, 10, 10, 1, 8);
  AugmentParams p = ssl_params(8);
  check_shards_concatenate(&ds, &p, 2, (const int[]){3, 3});
  check_shards_concatenate(&ds, &p, 2, (const int[]){1, 5});
  check_shards_concatenate(&ds, &p, 3, (const int[]){2, 1, 3});
  dataset_free(&ds);
}

static void test_loader_epochs(void **state) {
  (void)state;
  AugmentParams p = ssl_params(4);
  // 22 images in batches of 5: 4 steps per epoch, 2 images left out each epoch.
  for (int n = 20; n <= 22; n += 2) {
    Dataset ds = make_dataset(n, 4, 4, 1, 1);
    Loader l;
    assert_int_equal(loader_init(&l, &ds, one_group(&p, 1), 5, 3, 0, 5, 0), 0);
    assert_int_equal(l.steps_per_epoch, 4);
    int first_of_epoch[3];
    for (int e = 0; e < 3; e++) {
      int seen[22] = {0};
      for (int s = 0; s < 4; s++) {
        const Batch *b = loader_next(&l, NULL);
        assert_int_equal(b->global_step, e * 4 + s);
        assert_int_equal(b->epoch, e);
        if (s == 0) first_of_epoch[e] = b->indices[0];
        for (int i = 0; i < b->n; i++) {
          assert_in_range(b->indices[i], 0, n - 1);
          assert_int_equal(b->labels[i], b->indices[i] % 4);
          seen[b->indices[i]]++;
        }
      }
      int visited = 0;
      for (int i = 0; i < n; i++) {
        assert_in_range(seen[i], 0, 1);
        visited += seen[i];
      }
      assert_int_equal(visited, 20);
    }
    // Each epoch is its own permutation (the three first picks coinciding would be 1 in 400).
    assert_false(first_of_epoch[0] == first_of_epoch[1] && first_of_epoch[1] == first_of_epoch[2]);
    loader_destroy(&l);
    dataset_free(&ds);
  }
}

static void test_loader_threads_and_resume(void **state) {
  (void)state;
  Dataset ds = make_dataset(16, 12, 12, 3, 9);
  AugmentParams p = ssl_params(10);
  const size_t batch_floats = (size_t)2 * 4 * 10 * 10 * 3;
  Loader one, two, resumed;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  assert_int_equal(loader_init(&one, &ds, one_group(&p, 2), 4, 5, 0, 4, 0), 0);
  omp_set_num_threads(2);
  assert_int_equal(loader_init(&two, &ds, one_group(&p, 2), 4, 5, 0, 4, 0), 0);
  assert_int_equal(loader_init(&resumed, &ds, one_group(&p, 2), 4, 5, 0, 4, 6), 0);
  omp_set_num_threads(saved_threads);
  for (int s = 0; s < 9; s++) {
    double wait_ms = -1;
    const Batch *a = loader_next(&one, &wait_ms);
    const Batch *b = loader_next(&two, NULL);
    assert_true(wait_ms >= 0);
    assert_memory_equal(a->indices, b->indices, sizeof(int) * 4);
    assert_memory_equal(a->views, b->views, sizeof(float) * batch_floats);
    if (s >= 6) {
      const Batch *c = loader_next(&resumed, NULL);
      assert_int_equal(c->global_step, s);
      assert_memory_equal(a->indices, c->indices, sizeof(int) * 4);
      assert_memory_equal(a->views, c->views, sizeof(float) * batch_floats);
    }
  }
  loader_destroy(&one);
  loader_destroy(&two);
  loader_destroy(&resumed);
  dataset_free(&ds);
}

// Destroying at any moment (before the first batch, right after one, with the worker busy)
// joins the worker and frees every batch buffer.
static void test_loader_destroy_and_errors(void **state) {
  (void)state;
  size_t data_before = tl_mem_live(MEM_DATA);
  Dataset ds = make_dataset(64, 32, 32, 3, 2);
  AugmentParams p = ssl_params(32);
  for (int takes = 0; takes < 3; takes++) {
    Loader l;
    assert_int_equal(loader_init(&l, &ds, one_group(&p, 2), 32, 1, 0, 32, 0), 0);
    for (int s = 0; s < takes; s++) assert_non_null(loader_next(&l, NULL));
    loader_destroy(&l);
  }
  Loader bad;
  assert_int_equal(loader_init(&bad, &ds, one_group(&p, 2), 65, 1, 0, 65, 0), -1);
  assert_contains(tl_last_error(), "global batch 65");
  assert_int_equal(loader_init(&bad, &ds, one_group(&p, 2), 8, 1, 4, 5, 0), -1);
  assert_contains(tl_last_error(), "not in the global batch of 8");
  assert_int_equal(loader_init(&bad, &ds, one_group(&p, 2), 8, 1, 0, 0, 0), -1);
  dataset_free(&ds);
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
}

// ---------------------------------------------------------------------------------------------
// Streamed ImageFolder: views cropped from the decoded files

// A smooth RGB picture (gradients and a ring), so resampling and JPEG leave it close to itself.
static uint8_t smooth(int y, int x, int h, int w, int ch) {
  const double r = hypot(y - h / 2.0, x - w / 2.0) / (h < w ? h : w);
  const double v = ch == 0 ? 255.0 * y / h : ch == 1 ? 255.0 * x / w : 127.5 * (1 + cos(9 * r));
  return (uint8_t)lround(v);
}

// jpeg: 0 = PNG, else the JPEG quality (stb_image_write subsamples chroma 2x2 below 90).
static void write_smooth(const char *path, int h, int w, int jpeg) {
  uint8_t *px = malloc((size_t)h * w * 3);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int ch = 0; ch < 3; ch++) px[((size_t)y * w + x) * 3 + ch] = smooth(y, x, h, w, ch);
  if (jpeg)
    assert_int_not_equal(stbi_write_jpg(path, w, h, 3, px, jpeg), 0);
  else
    write_png(path, w, h, 3, px);
  free(px);
}

// A tree of PNGs already at the training size: streamed and in-memory datasets hold the same
// images, so for one normalization their loaders give the same batches, byte for byte.
static void test_stream_matches_memory(void **state) {
  const TempDir *t = *state;
  enum { N = 10, S = 12, BATCH = 4 };
  make_dir(temp_path(t, "a"));
  make_dir(temp_path(t, "b"));
  Rng rng = rng_stream(3, RNG_TEST, 0, 0);
  for (int i = 0; i < N; i++) {
    uint8_t px[S * S * 3];
    for (size_t k = 0; k < sizeof px; k++) px[k] = (uint8_t)rng_below(&rng, 256);
    char name[32];
    snprintf(name, sizeof name, "%s/%02d.png", i % 2 ? "a" : "b", i);
    write_png(temp_path(t, name), S, S, 3, px);
  }
  size_t data_before = tl_mem_live(MEM_DATA);
  Dataset mem, str;
  if (dataset_load_imagefolder(&mem, t->dir, S, 3, 0, 0) != 0) fail_msg("%s", tl_last_error());
  if (dataset_load_imagefolder(&str, t->dir, S, 3, 0, 1) != 0) fail_msg("%s", tl_last_error());
  assert_null(str.pixels);
  assert_int_equal(str.n, N);
  assert_int_equal(str.n_classes, 2);
  assert_memory_equal(str.labels, mem.labels, sizeof(int) * N);
  for (int i = 0; i < N; i++) {
    assert_string_equal(str.files[i], mem.files[i]);
    assert_int_equal(str.source_h[i], S);
  }
  // In memory: pixels and a label an image. Streamed, only the list and the sizes are held: a
  // label, two 16-bit sides and the file's identity (device, inode, bytes, modification time:
  // four 8-byte numbers) an image.
  assert_int_equal(tl_mem_live(MEM_DATA) - data_before,
                   N * (S * S * 3 + 4) + N * (4 + 2 * 2 + 4 * 8));
  float mean_m[3], std_m[3], mean_s[3], std_s[3];
  assert_int_equal(dataset_channel_stats(&mem, mean_m, std_m), 0);
  assert_int_equal(dataset_channel_stats(&str, mean_s, std_s), 0);
  for (int ch = 0; ch < 3; ch++) {
    assert_float_equal(mean_s[ch], mean_m[ch], 1e-6);
    assert_float_equal(std_s[ch], std_m[ch], 1e-6);
  }
  ViewRecipe r = {.n_groups = 2};
  r.group[0] = (ViewGroup){.count = 2, .aug = ssl_params(S)};
  r.group[1] = (ViewGroup){.count = 2, .aug = ssl_params(S / 2)};
  r.group[1].aug.blur_prob = 0.5f, r.group[1].aug.solarize_prob = 0.5f;
  Loader lm, ls;
  assert_int_equal(loader_init(&lm, &mem, &r, BATCH, 5, 0, BATCH, 0), 0);
  assert_int_equal(loader_init(&ls, &str, &r, BATCH, 5, 0, BATCH, 0), 0);
  const size_t floats = (size_t)BATCH * view_recipe_floats(&r, 3);
  for (int step = 0; step < 4; step++) {
    const Batch *bm = loader_next(&lm, NULL), *bs = loader_next(&ls, NULL);
    assert_non_null(bs);
    assert_memory_equal(bs->indices, bm->indices, sizeof(int) * BATCH);
    assert_memory_equal(bs->views, bm->views, sizeof(float) * floats);
  }
  loader_destroy(&lm);
  loader_destroy(&ls);
  float em[S * S * 3], es[S * S * 3];
  AugmentParams ev = plain_params(S);
  assert_int_equal(eval_view(&mem, 3, &ev, em), 0);
  assert_int_equal(eval_view(&str, 3, &ev, es), 0);
  assert_memory_equal(em, es, sizeof em);
  dataset_free(&mem);
  dataset_free(&str);
  assert_int_equal(tl_mem_live(MEM_DATA), data_before);
}

// A streamed view is the crop box cut out of the full-size source and resized once; the reference
// cuts the box out by hand into its own image and resizes that whole image. The in-memory dataset,
// shrunk to the training size first, gives a blurrier view of the same box.
static void test_stream_crops_from_source(void **state) {
  const TempDir *t = *state;
  enum { H = 60, W = 90, S = 10 };
  write_smooth(temp_path(t, "x.png"), H, W, 0);
  Dataset str, mem;
  if (dataset_load_imagefolder(&str, t->dir, S, 3, 0, 1) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(dataset_load_imagefolder(&mem, t->dir, S, 3, 0, 0), 0);
  assert_int_equal(str.source_h[0], H);
  assert_int_equal(str.source_w[0], W);
  assert_int_equal(str.n_classes, 0);
  AugmentParams p = plain_params(S);
  p.crop_scale_min = 0.05f, p.crop_scale_max = 0.3f;
  p.crop_ratio_min = 0.75f, p.crop_ratio_max = 1.333f;
  for (int ch = 0; ch < 3; ch++) p.mean[ch] = 0, p.std[ch] = 1;
  double far_from_memory = 0;
  for (int trial = 0; trial < 8; trial++) {
    Rng r1 = rng_stream(9, RNG_AUGMENT, (uint64_t)trial, 0), r2 = r1, r3 = r1;
    float got[S * S * 3], want[S * S * 3], shrunk[S * S * 3];
    assert_int_equal(augment_view(&str, 0, &p, &r1, got), 0);
    const CropBox box = augment_crop_box(H, W, &p, &r2);
    assert_true(box.h > S && box.w > S && box.y0 + box.h <= H && box.x0 + box.w <= W);
    uint8_t *crop = malloc((size_t)box.h * box.w * 3);
    for (int y = 0; y < box.h; y++)
      for (int x = 0; x < box.w; x++)
        for (int ch = 0; ch < 3; ch++)
          crop[((size_t)y * box.w + x) * 3 + ch] = smooth(box.y0 + y, box.x0 + x, H, W, ch);
    image_resample_bilinear(crop, box.h, box.w, 3, 0, 0, box.h, box.w, want, S, S);
    free(crop);
    for (int i = 0; i < S * S * 3; i++) assert_float_equal(got[i], want[i] / 255.0f, 1e-5);
    assert_int_equal(augment_view(&mem, 0, &p, &r3, shrunk), 0);
    for (int i = 0; i < S * S * 3; i++) far_from_memory += fabs(shrunk[i] - got[i]);
  }
  assert_true(far_from_memory / (8 * S * S * 3) > 0.01);
  // Evaluation: the centred 60x60 square of the source.
  float got[S * S * 3], want[S * S * 3];
  assert_int_equal(eval_view(&str, 0, &p, got), 0);
  uint8_t *square = malloc((size_t)H * H * 3);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < H; x++)
      for (int ch = 0; ch < 3; ch++)
        square[((size_t)y * H + x) * 3 + ch] = smooth(y, x + (W - H) / 2, H, W, ch);
  image_resample_bilinear(square, H, H, 3, 0, 0, H, H, want, S, S);
  free(square);
  for (int i = 0; i < S * S * 3; i++) assert_float_equal(got[i], want[i] / 255.0f, 1e-5);
  dataset_free(&str);
  dataset_free(&mem);
}

static double mean_abs_diff(const uint8_t *a, const uint8_t *b, size_t n, int *max) {
  double sum = 0;
  *max = 0;
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)a[i] - (int)b[i]);
    sum += d;
    if (d > *max) *max = d;
  }
  return sum / (double)n;
}

// libjpeg-turbo and stb_image decode the same JPEG to nearly the same pixels (both IDCTs are
// accurate to the standard's tolerance; they upsample chroma differently), and libjpeg's scaled
// decodes are close to block means of its full decode. Measured here at JPEG quality 75 (chroma
// subsampled) and 95: mean |difference| at most 0.11 of 255 levels between the decoders, at most
// 0.56 between a 1/2, 1/4 or 1/8 decode and the block means; asserted below 0.5 and 1.
static void test_jpeg_decoders_agree(void **state) {
  const TempDir *t = *state;
  enum { H = 96, W = 128 };
  const char *path = temp_path(t, "x.jpg");
  for (int quality = 75; quality <= 95; quality += 20) {
    write_smooth(path, H, W, quality);
    ImageHeader hdr;
    assert_int_equal(image_read_header(path, &hdr), 0);
    assert_true(hdr.jpeg && hdr.h == H && hdr.w == W);
    for (int c = 1; c <= 3; c += 2) {
      Image turbo, stb;
      assert_int_equal(image_decode(path, c, 1, DECODER_DEFAULT, &turbo), 0);
      assert_int_equal(image_decode(path, c, 1, DECODER_STB, &stb), 0);
      assert_true(turbo.h == H && turbo.w == W && stb.h == H && stb.w == W);
      int max;
      const double mad = mean_abs_diff(turbo.pixels, stb.pixels, (size_t)H * W * c, &max);
      print_message("quality %d, channels %d: libjpeg-turbo vs stb_image mean |d| %.3f, max %d\n",
                    quality, c, mad, max);
      assert_true(mad < 0.5 && max <= 8);
      // And against the picture it was written from (JPEG at quality 95).
      uint8_t *truth = malloc((size_t)H * W * 3);
      for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
          for (int ch = 0; ch < 3; ch++)
            truth[((size_t)y * W + x) * 3 + ch] = smooth(y, x, H, W, ch);
      if (c == 3) assert_true(mean_abs_diff(turbo.pixels, truth, (size_t)H * W * 3, &max) < 2.0);
      free(truth);
      for (int r = 2; r <= 8; r *= 2) {
        Image small;
        assert_int_equal(image_decode(path, c, r, DECODER_DEFAULT, &small), 0);
        assert_int_equal(small.h, H / r);
        assert_int_equal(small.w, W / r);
        assert_int_equal(small.reduction, r);
        uint8_t *means = malloc((size_t)small.h * small.w * c);
        for (int y = 0; y < small.h; y++)
          for (int x = 0; x < small.w; x++)
            for (int ch = 0; ch < c; ch++) {
              int sum = 0;
              for (int dy = 0; dy < r; dy++)
                for (int dx = 0; dx < r; dx++)
                  sum += turbo.pixels[(((size_t)y * r + dy) * W + x * r + dx) * c + ch];
              means[((size_t)y * small.w + x) * c + ch] = (uint8_t)((sum + r * r / 2) / (r * r));
            }
        const double d = mean_abs_diff(small.pixels, means, (size_t)small.h * small.w * c, &max);
        print_message("channels %d, 1/%d decode vs block means: mean |d| %.3f, max %d\n", c, r, d,
                      max);
        assert_true(d < 1.0);
        free(means);
        image_free(&small);
      }
      image_free(&turbo);
      image_free(&stb);
    }
  }
}

// A JPEG of h x w samples of `components` each, stored in colour space `space` (libjpeg converts
// CMYK input to YCCK itself), at quality 100 without chroma subsampling. CMYK and YCCK files get
// Photoshop's Adobe marker, and their samples are stored as given (Adobe's inverted inks).
static void write_jpeg_components(const char *path, int h, int w, int components,
                                  const uint8_t *samples, J_COLOR_SPACE in, J_COLOR_SPACE space) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = components;
  c.in_color_space = in;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, space);
  jpeg_set_quality(&c, 100, TRUE);
  for (int i = 0; i < c.num_components; i++)
    c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(samples + (size_t)c.next_scanline * w * components);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  fclose(f);
}

// CMYK and YCCK JPEGs (Photoshop's, about twenty of ImageNet's training images) decode to the
// RGB PIL gives: inks stored inverted (Adobe), each colour (255 - C)(255 - K) / 255. Four flat
// quadrants, so quality 100 leaves each within a few levels of its colour; stb_image agrees.
static void test_jpeg_cmyk_and_ycck(void **state) {
  const TempDir *t = *state;
  enum { H = 32, W = 32 };
  // Stored (inverted) C, M, Y, K of each quadrant: red, a dark green, light blue, mid grey.
  static const uint8_t quadrant[4][4] = {
      {255, 0, 0, 255}, {0, 200, 0, 160}, {120, 200, 255, 255}, {255, 255, 255, 128}};
  uint8_t *cmyk = malloc((size_t)H * W * 4), *want = malloc((size_t)H * W * 3);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      const uint8_t *q = quadrant[(y >= H / 2) * 2 + (x >= W / 2)];
      memcpy(cmyk + ((size_t)y * W + x) * 4, q, 4);
      for (int ch = 0; ch < 3; ch++)
        want[((size_t)y * W + x) * 3 + ch] = (uint8_t)lround(q[ch] * q[3] / 255.0);
    }
  const J_COLOR_SPACE spaces[2] = {JCS_CMYK, JCS_YCCK};
  for (int k = 0; k < 2; k++) {
    const char *path = temp_path(t, k ? "ycck.jpg" : "cmyk.jpg");
    write_jpeg_components(path, H, W, 4, cmyk, JCS_CMYK, spaces[k]);
    ImageHeader hdr;
    if (image_read_header(path, &hdr) != 0) fail_msg("%s", tl_last_error());
    assert_true(hdr.jpeg && hdr.h == H && hdr.w == W);
    Image turbo, stb, gray, half;
    if (image_decode(path, 3, 1, DECODER_DEFAULT, &turbo) != 0) fail_msg("%s", tl_last_error());
    assert_int_equal(image_decode(path, 3, 1, DECODER_STB, &stb), 0);
    int max;
    const double mad = mean_abs_diff(turbo.pixels, want, (size_t)H * W * 3, &max);
    print_message("%s: against the stored colours mean |d| %.3f, max %d\n", path, mad, max);
    assert_true(mad < 1.0 && max <= 6);
    assert_true(mean_abs_diff(turbo.pixels, stb.pixels, (size_t)H * W * 3, &max) < 1.0);
    // Luminance of the same RGB (ITU-R 601), and the reduced decode a streamed view uses.
    assert_int_equal(image_decode(path, 1, 1, DECODER_DEFAULT, &gray), 0);
    for (size_t i = 0; i < (size_t)H * W; i++) {
      const uint8_t *rgb = turbo.pixels + 3 * i;
      const double l = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
      assert_true(fabs(gray.pixels[i] - l) <= 1.0);
    }
    assert_int_equal(image_decode(path, 3, 4, DECODER_DEFAULT, &half), 0);
    assert_true(half.h == H / 4 && half.w == W / 4);
    assert_true(abs(half.pixels[0] - want[0]) <= 6);  // top left: red
    image_free(&turbo);
    image_free(&stb);
    image_free(&gray);
    image_free(&half);
  }
  // What stays undecodable is refused with the header (when a folder is listed), not when a
  // batch needs it: a JPEG of two components.
  write_jpeg_components(temp_path(t, "two.jpg"), H, W, 2, cmyk, JCS_UNKNOWN, JCS_UNKNOWN);
  ImageHeader hdr;
  assert_int_equal(image_read_header(temp_path(t, "two.jpg"), &hdr), -1);
  assert_contains(tl_last_error(), "two.jpg: a JPEG of 2 colour components");
  free(cmyk);
  free(want);
}

// A BMP stored top-down (a negative height in its header, as Windows' own tools may write)
// decodes as the same picture as its bottom-up twin.
static void test_bmp_top_down(void **state) {
  const TempDir *t = *state;
  enum { H = 2, W = 3, ROW = 12 };  // 24-bit rows of 9 bytes, padded to 4
  // Rows top to bottom: red then blue (BMP stores blue, green, red).
  static const uint8_t red[3] = {0, 0, 255}, blue[3] = {255, 0, 0};
  for (int top_down = 0; top_down < 2; top_down++) {
    uint8_t file[54 + H * ROW] = {'B', 'M'};
    const uint32_t fields[] = {sizeof file, 0, 54, 40, W, (uint32_t)(top_down ? -H : H)};
    for (int i = 0; i < 6; i++)
      for (int b = 0; b < 4; b++) file[2 + 4 * i + b] = (uint8_t)(fields[i] >> (8 * b));
    file[26] = 1;   // planes
    file[28] = 24;  // bits per pixel
    for (int stored = 0; stored < H; stored++) {
      const int y = top_down ? stored : H - 1 - stored;  // the picture's row this stored row is
      for (int x = 0; x < W; x++) memcpy(file + 54 + stored * ROW + 3 * x, y ? blue : red, 3);
    }
    const char *path = temp_path(t, top_down ? "top-down.bmp" : "bottom-up.bmp");
    write_bytes(path, file, sizeof file, 0);
    ImageHeader hdr;
    if (image_read_header(path, &hdr) != 0) fail_msg("%s", tl_last_error());
    assert_true(hdr.h == H && hdr.w == W && !hdr.jpeg);
    Image img;
    if (image_decode(path, 3, 1, DECODER_DEFAULT, &img) != 0) fail_msg("%s", tl_last_error());
    assert_true(img.h == H && img.w == W);
    for (int x = 0; x < W; x++) {
      assert_memory_equal(img.pixels + 3 * x, ((const uint8_t[3]){255, 0, 0}), 3);
      assert_memory_equal(img.pixels + 3 * (W + x), ((const uint8_t[3]){0, 0, 255}), 3);
    }
    image_free(&img);
  }
}

// Views of a streamed JPEG decoded at 1/2, 1/4 or 1/8 (as each view's box allows) stay close to
// the same views cut from its full decode.
static void test_stream_jpeg_reduced_views(void **state) {
  const TempDir *t = *state;
  enum { H = 384, W = 512, S = 24 };
  write_smooth(temp_path(t, "x.jpg"), H, W, 90);
  Dataset ds;
  if (dataset_load_imagefolder(&ds, t->dir, S, 3, 0, 1) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(dataset_max_reduction(&ds, 0), 8);
  Image full;
  assert_int_equal(image_decode(ds.files[0], 3, 1, DECODER_DEFAULT, &full), 0);
  AugmentParams p = ssl_params(S);
  int reduced = 0;
  for (int trial = 0; trial < 16; trial++) {
    Rng r1 = rng_stream(4, RNG_AUGMENT, (uint64_t)trial, 0), r2 = r1;
    float got[S * S * 3], want[S * S * 3];
    assert_int_equal(augment_view(&ds, 0, &p, &r1, got), 0);
    const CropBox box = augment_crop_box(H, W, &p, &r2);
    reduced += augment_reduction(&ds, 0, &box, 1, S) > 1;
    augment_render(&full, box, &p, &r2, want);
    double d = 0;
    for (int i = 0; i < S * S * 3; i++) d += fabs(got[i] - want[i]);
    assert_true(d / (S * S * 3) < 0.02 * 4);  // normalized by std 0.25: 0.02 of the unit range
  }
  assert_true(reduced >= 8);
  image_free(&full);
  dataset_free(&ds);
}

// A file that changes under a streamed run is an error naming it when a batch needs it: cut
// short (a corrupt-data warning from libjpeg is an error, not a grey bottom), replaced by
// another size or by another image of the same size, rewritten, or gone. Header faults are refused
// at the start, as in memory.
static void test_stream_file_faults(void **state) {
  const TempDir *t = *state;
  make_dir(temp_path(t, "c"));
  for (int i = 0; i < 4; i++) {
    char name[32];
    snprintf(name, sizeof name, "c/%d.jpg", i);
    write_smooth(temp_path(t, name), 32, 48, 90);
  }
  Dataset ds;
  if (dataset_load_imagefolder(&ds, t->dir, 8, 3, 0, 1) != 0) fail_msg("%s", tl_last_error());
  AugmentParams p = ssl_params(8);
  const char *victim = temp_path(t, "c/2.jpg");
  size_t n;
  uint8_t *bytes = read_whole(victim, &n);
  Image img;
  float view[8 * 8 * 3];
  Rng r = rng_stream(1, RNG_AUGMENT, 0, 0);
  // Cut short: libjpeg would fill the rest with grey and warn.
  write_bytes(victim, bytes, n * 2 / 3, 0);
  assert_int_equal(dataset_image(&ds, 2, 1, &img), -1);
  assert_contains(tl_last_error(), "c/2.jpg: corrupt JPEG data");
  Loader l;
  assert_int_equal(loader_init(&l, &ds, one_group(&p, 2), 4, 1, 0, 4, 0), 0);
  alarm(30);
  assert_null(loader_next(&l, NULL));
  alarm(0);
  assert_contains(tl_last_error(), "step 0: ");
  assert_contains(tl_last_error(), "c/2.jpg");
  loader_destroy(&l);
  // Another size.
  write_smooth(victim, 40, 48, 90);
  assert_int_equal(augment_view(&ds, 2, &p, &r, view), -1);
  assert_contains(tl_last_error(), "changed during the run");
  // Another image of the same size (the pixels' size is all a decode can check), and the same
  // bytes written again: neither is the file that was listed.
  write_smooth(victim, 32, 48, 60);
  assert_int_equal(augment_view(&ds, 2, &p, &r, view), -1);
  assert_contains(tl_last_error(), "c/2.jpg: changed during the run");
  write_bytes(victim, bytes, n, 0);
  assert_int_equal(eval_view(&ds, 2, &p, view), -1);
  assert_contains(tl_last_error(), "c/2.jpg: changed during the run");
  // Gone.
  remove(victim);
  assert_int_equal(eval_view(&ds, 2, &p, view), -1);
  assert_contains(tl_last_error(), "c/2.jpg");
  dataset_free(&ds);
  // Listed again, it is the file the dataset holds.
  write_bytes(victim, bytes, n, 0);
  if (dataset_load_imagefolder(&ds, t->dir, 8, 3, 0, 1) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(eval_view(&ds, 2, &p, view), 0);
  dataset_free(&ds);
  // At the start: a file that is not what its name says, or whose header claims too much.
  write_bytes(temp_path(t, "c/9.jpg"), "not a jpeg", 10, 0);
  assert_int_equal(dataset_load_imagefolder(&ds, t->dir, 8, 3, 0, 1), -1);
  assert_contains(tl_last_error(), "c/9.jpg: its content is not the image format");
  remove(temp_path(t, "c/9.jpg"));
  write_png_header(temp_path(t, "c/9.png"), 9000, 9000);
  assert_int_equal(dataset_load_imagefolder(&ds, t->dir, 8, 3, 0, 1), -1);
  assert_contains(tl_last_error(), "9000x9000 pixels");
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_idx_roundtrip, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_missing_file, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_bad_magic, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_absurd_header, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_truncated, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_corrupt_gzip, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_label_mismatch, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_lying_header, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_not_regular, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_idx_highly_compressed_loads, temp_dir_make,
                                      temp_dir_remove),
      cmocka_unit_test(test_fashion_mnist),
      cmocka_unit_test(test_resample),
      cmocka_unit_test(test_channel_stats),
      cmocka_unit_test(test_augment_determinism),
      cmocka_unit_test(test_augment_flip_exact),
      cmocka_unit_test(test_eval_view_resize),
      cmocka_unit_test(test_augment_crop_statistics),
      cmocka_unit_test(test_augment_brightness_range),
      cmocka_unit_test(test_augment_grayscale),
      cmocka_unit_test(test_augment_solarize),
      cmocka_unit_test(test_augment_blur_applied),
      cmocka_unit_test(test_gaussian_blur),
      cmocka_unit_test_setup_teardown(test_imagefolder, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_imagefolder_errors, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_imagefolder_bilevel_png, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_imagefolder_large_images, temp_dir_make,
                                      temp_dir_remove),
      cmocka_unit_test(test_loader_shards_concatenate),
      cmocka_unit_test(test_loader_epochs),
      cmocka_unit_test(test_loader_threads_and_resume),
      cmocka_unit_test(test_loader_destroy_and_errors),
      cmocka_unit_test(test_loader_view_groups),
      cmocka_unit_test_setup_teardown(test_stream_matches_memory, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_stream_crops_from_source, temp_dir_make,
                                      temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_jpeg_decoders_agree, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_jpeg_cmyk_and_ycck, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_bmp_top_down, temp_dir_make, temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_stream_jpeg_reduced_views, temp_dir_make,
                                      temp_dir_remove),
      cmocka_unit_test_setup_teardown(test_stream_file_faults, temp_dir_make, temp_dir_remove),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
