// IDX files (the MNIST family's format): a big-endian header, magic then one uint32 per dimension,
// then the unsigned bytes. zlib's gz* functions read both gzip and uncompressed files.
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/dataset.h"

enum {
  IDX_MAGIC_IMAGES = 0x00000803,  // unsigned bytes, 3 dimensions (n, rows, cols)
  IDX_MAGIC_LABELS = 0x00000801,  // unsigned bytes, 1 dimension (n)
};

// Sanity bounds, checked before anything is allocated, so a corrupt or hostile header fails with
// a message instead of an out-of-memory abort.
static const uint32_t max_images = 10000000;
static const uint32_t max_side_pixels = 4096;
static const uint64_t max_pixel_bytes = 8ull << 30;

static const char missing_hint[] =
    "Fashion-MNIST: apt-get install dataset-fashion-mnist, or run scripts/setup.sh";
static const char images_tag[] = "-images-idx3-";
static const char labels_tag[] = "-labels-idx1-";

static gzFile open_idx(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT)
      tl_fail("%s: no such file (%s)", path, missing_hint);
    else
      tl_fail("%s: %s", path, strerror(errno));
    return NULL;
  }
  gzFile gz = gzopen(path, "rb");
  if (!gz) {
    tl_fail("%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  gzbuffer(gz, 1u << 17);
  return gz;
}

// zlib's reason for the last error, without the "path: " it prefixes (the caller names the path),
// or NULL when there was none.
static const char *gz_reason(gzFile gz, const char *path) {
  int zerr;
  const char *msg = gzerror(gz, &zerr);
  if (zerr == Z_OK) return NULL;
  size_t n = strlen(path);
  return strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ' ? msg + n + 2 : msg;
}

// Reads exactly `bytes` or says why not. gzread counts in unsigned int, hence the chunks.
static int read_exact(gzFile gz, const char *path, void *buf, size_t bytes, const char *what) {
  const size_t max_chunk_bytes = 1u << 30;
  size_t got = 0;
  while (got < bytes) {
    size_t want = bytes - got < max_chunk_bytes ? bytes - got : max_chunk_bytes;
    int n = gzread(gz, (char *)buf + got, (unsigned)want);
    if (n < 0) return tl_fail("%s: corrupt data: %s", path, gz_reason(gz, path));
    if (n == 0) break;
    got += (size_t)n;
  }
  if (got < bytes) {
    const char *why = gz_reason(gz, path);
    return tl_fail("%s: truncated: expected %zu bytes of %s, got %zu%s%s%s", path, bytes, what, got,
                   why ? " (" : "", why ? why : "", why ? ")" : "");
  }
  return 0;
}

// After the last declared byte the stream must end; reading on also makes zlib check the gzip
// CRC, which catches corruption that still inflates.
static int expect_end(gzFile gz, const char *path) {
  char extra;
  int n = gzread(gz, &extra, 1);
  if (n < 0) return tl_fail("%s: corrupt data: %s", path, gz_reason(gz, path));
  if (n > 0) return tl_fail("%s: more data than the header declares", path);
  return 0;
}

static uint32_t big_endian_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// The magic is checked before the dimensions are read, so a file of the wrong kind says so
// rather than looking truncated.
static int read_header(gzFile gz, const char *path, uint32_t magic, int n_dims, uint32_t *dims) {
  uint8_t raw[4 * 3];
  if (read_exact(gz, path, raw, 4, "magic") < 0) return -1;
  uint32_t found = big_endian_u32(raw);
  if (found != magic)
    return tl_fail("%s: bad magic 0x%08x, expected 0x%08x (IDX unsigned bytes, %d dimension%s)",
                   path, found, magic, n_dims, n_dims > 1 ? "s" : "");
  if (read_exact(gz, path, raw, (size_t)4 * n_dims, "dimensions") < 0) return -1;
  for (int k = 0; k < n_dims; k++) dims[k] = big_endian_u32(raw + 4 * k);
  return 0;
}

// The labels file sits beside the images with the standard name; NULL (error set) if the name
// does not follow it.
static char *labels_path_for(const char *images_path) {
  const char *slash = strrchr(images_path, '/');
  const char *file_name = slash ? slash + 1 : images_path;
  const char *tag = strstr(file_name, images_tag);
  if (!tag) {
    tl_fail("%s: cannot name the labels file: the file name has no \"%s\" to replace with \"%s\"",
            images_path, images_tag, labels_tag);
    return NULL;
  }
  _Static_assert(sizeof images_tag == sizeof labels_tag, "tags are swapped in place");
  char *path = strdup(images_path);
  if (!path) TL_DIE("out of memory");
  memcpy(path + (tag - images_path), labels_tag, sizeof labels_tag - 1);
  return path;
}

static int check_image_header(const char *path, const uint32_t *dims, int channels) {
  if (dims[0] == 0 || dims[0] > max_images)
    return tl_fail("%s: header claims %u images (accepted: 1 to %u)", path, dims[0], max_images);
  if (dims[1] == 0 || dims[1] > max_side_pixels || dims[2] == 0 || dims[2] > max_side_pixels)
    return tl_fail("%s: header claims %ux%u pixel images (accepted: 1 to %u per side)", path,
                   dims[1], dims[2], max_side_pixels);
  uint64_t bytes = (uint64_t)dims[0] * dims[1] * dims[2] * (uint64_t)channels;
  if (bytes > max_pixel_bytes)
    return tl_fail("%s: header claims %llu bytes of pixels (at most %llu are accepted)", path,
                   (unsigned long long)bytes, (unsigned long long)max_pixel_bytes);
  return 0;
}

int dataset_idx_peek(const char *images_path, int *n, int *h, int *w) {
  gzFile gz = open_idx(images_path);
  if (!gz) return -1;
  uint32_t dims[3];
  // Channels do not matter to the header's own bounds; 1 keeps the pixel-bytes check unscaled.
  int rc = read_header(gz, images_path, IDX_MAGIC_IMAGES, 3, dims) < 0 ||
                   check_image_header(images_path, dims, 1) < 0
               ? -1
               : 0;
  gzclose(gz);
  if (rc == 0) {
    *n = (int)dims[0];
    *h = (int)dims[1];
    *w = (int)dims[2];
  }
  return rc;
}

int dataset_load_idx(Dataset *ds, const char *images_path, int channels, int limit) {
  memset(ds, 0, sizeof *ds);
  if (channels != 1 && channels != 3)
    return tl_fail("%s: channels must be 1 or 3, got %d", images_path, channels);
  char *labels_path = labels_path_for(images_path);
  if (!labels_path) return -1;

  int rc = -1;
  gzFile images = NULL, labels = NULL;
  uint32_t dims[3], n_labels;
  if (!(images = open_idx(images_path)) ||
      read_header(images, images_path, IDX_MAGIC_IMAGES, 3, dims) < 0 ||
      check_image_header(images_path, dims, channels) < 0 || !(labels = open_idx(labels_path)) ||
      read_header(labels, labels_path, IDX_MAGIC_LABELS, 1, &n_labels) < 0)
    goto done;
  if (n_labels != dims[0]) {
    tl_fail("%s: %u labels for the %u images of %s", labels_path, n_labels, dims[0], images_path);
    goto done;
  }

  const int n_all = (int)dims[0];
  ds->n = limit > 0 && limit < n_all ? limit : n_all;
  ds->h = (int)dims[1];
  ds->w = (int)dims[2];
  ds->c = channels;
  const size_t gray_bytes = (size_t)ds->n * ds->h * ds->w;
  // pixels: (n, h, w, c); labels: (n)
  ds->pixels = tl_alloc(gray_bytes * channels, MEM_DATA, COMP_OTHER);
  ds->labels = tl_alloc(sizeof *ds->labels * ds->n, MEM_DATA, COMP_OTHER);
  uint8_t *label_bytes = (uint8_t *)ds->labels;
  if (read_exact(images, images_path, ds->pixels, gray_bytes, "pixels") < 0 ||
      (ds->n == n_all && expect_end(images, images_path) < 0) ||
      read_exact(labels, labels_path, label_bytes, (size_t)ds->n, "labels") < 0 ||
      (ds->n == n_all && expect_end(labels, labels_path) < 0)) {
    dataset_free(ds);
    goto done;
  }

  // Both widenings run in place from the back: element i moves to a position >= i, so every
  // source byte is read before anything overwrites it.
  if (channels == 3)
    for (size_t i = gray_bytes; i-- > 0;) {
      uint8_t v = ds->pixels[i];
      ds->pixels[3 * i] = ds->pixels[3 * i + 1] = ds->pixels[3 * i + 2] = v;
    }
  for (int i = ds->n; i-- > 0;) ds->labels[i] = label_bytes[i];
  for (int i = 0; i < ds->n; i++)
    if (ds->labels[i] >= ds->n_classes) ds->n_classes = ds->labels[i] + 1;
  rc = 0;

done:
  if (images) gzclose(images);
  if (labels) gzclose(labels);
  free(labels_path);
  return rc;
}
