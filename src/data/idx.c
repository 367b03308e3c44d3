// IDX files (the MNIST family's format): a big-endian header, magic then one uint32 per dimension,
// then the unsigned bytes. zlib's gz* functions read both gzip and uncompressed files.
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/dataset.h"
#include "io/regular_file.h"

enum {
  IDX_MAGIC_IMAGES = 0x00000803,  // unsigned bytes, 3 dimensions (n, rows, cols)
  IDX_MAGIC_LABELS = 0x00000801,  // unsigned bytes, 1 dimension (n)
};

// Sanity bounds, checked before anything is allocated, so a corrupt or hostile header fails with
// a message instead of an out-of-memory abort.
static const uint32_t max_images = 10000000;
static const uint32_t max_side_pixels = 4096;
static const uint64_t max_pixel_bytes = 8ull << 30;
// Deflate turns one byte into at most 1032 (zlib's documented limit), so a gzip file of S bytes
// holds at most 1032 * S: a header claiming more is a lie, found before anything is allocated.
static const uint64_t max_gzip_ratio = 1032;
// Below that bound a claim is believed only as far as is plausible: image data compresses 2 to 5
// times (Fashion-MNIST 1.8, MNIST 4.7), so up to 16 times the file's size (at least 1 MiB) is
// allocated at once, which holds any real file whole, and beyond that the block doubles as data
// arrives. A lying header costs memory only for the data really there.
static const uint64_t plausible_gzip_ratio = 16;
static const uint64_t first_block_bytes = 1u << 20;

static const char missing_hint[] =
    "Fashion-MNIST: apt-get install dataset-fashion-mnist, or run scripts/setup.sh";
static const char images_tag[] = "-images-idx3-";
static const char labels_tag[] = "-labels-idx1-";

// An IDX file being read: its gzip (or plain) stream and what the file system says of it.
typedef struct {
  const char *path;
  gzFile gz;
  int64_t file_bytes;
  int compressed;  // gzip; otherwise zlib reads the bytes as they are
} IdxFile;

// `hint` follows "no such file" when the file is missing.
static int open_idx(IdxFile *f, const char *path, const char *hint) {
  memset(f, 0, sizeof *f);
  f->path = path;
  int fd = regular_open(path, 0, &f->file_bytes);
  if (fd < 0) return errno == ENOENT ? tl_fail("%s: no such file (%s)", path, hint) : -1;
  if (!(f->gz = gzdopen(fd, "rb"))) {
    close(fd);
    return tl_fail("%s: cannot open: %s", path, strerror(errno));
  }
  gzbuffer(f->gz, 1u << 17);
  f->compressed = !gzdirect(f->gz);
  return 0;
}

static void close_idx(IdxFile *f) {
  if (f->gz) gzclose(f->gz);
  f->gz = NULL;
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

// Reads up to `bytes`, stopping early only at the end of the data: the bytes read, or -1 (error
// set) when the stream is corrupt. gzread counts in unsigned int, hence the chunks.
static int64_t read_upto(gzFile gz, const char *path, void *buf, size_t bytes) {
  const size_t max_chunk_bytes = 1u << 30;
  size_t got = 0;
  while (got < bytes) {
    size_t want = bytes - got < max_chunk_bytes ? bytes - got : max_chunk_bytes;
    int n = gzread(gz, (char *)buf + got, (unsigned)want);
    if (n < 0) return tl_fail("%s: corrupt data: %s", path, gz_reason(gz, path));
    if (n == 0) break;
    got += (size_t)n;
  }
  return (int64_t)got;
}

// " (zlib's reason)" when zlib has one, else "".
static void gz_reason_suffix(gzFile gz, const char *path, char *out, size_t cap) {
  const char *why = gz_reason(gz, path);
  snprintf(out, cap, why ? " (%s)" : "%s", why ? why : "");
}

// Reads exactly `bytes` of the header or says why not.
static int read_exact(IdxFile *f, void *buf, size_t bytes, const char *what) {
  int64_t got = read_upto(f->gz, f->path, buf, bytes);
  if (got < 0) return -1;
  if ((size_t)got < bytes) {
    char why[256];
    gz_reason_suffix(f->gz, f->path, why, sizeof why);
    return tl_fail("%s: truncated: expected %zu bytes of %s, got %zu%s", f->path, bytes, what,
                   (size_t)got, why);
  }
  return 0;
}

// After the last declared byte the stream must end; reading on also makes zlib check the gzip
// CRC, which catches corruption that still inflates.
static int expect_end(IdxFile *f) {
  char extra;
  int n = gzread(f->gz, &extra, 1);
  if (n < 0) return tl_fail("%s: corrupt data: %s", f->path, gz_reason(f->gz, f->path));
  if (n > 0) return tl_fail("%s: more data than the header declares", f->path);
  return 0;
}

static uint32_t big_endian_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// The magic is checked before the dimensions are read, so a file of the wrong kind says so
// rather than looking truncated.
static int read_header(IdxFile *f, uint32_t magic, int n_dims, uint32_t *dims) {
  uint8_t raw[4 * 3];
  if (read_exact(f, raw, 4, "magic") < 0) return -1;
  uint32_t found = big_endian_u32(raw);
  if (found != magic)
    return tl_fail("%s: bad magic 0x%08x, expected 0x%08x (IDX unsigned bytes, %d dimension%s)",
                   f->path, found, magic, n_dims, n_dims > 1 ? "s" : "");
  if (read_exact(f, raw, (size_t)4 * n_dims, "dimensions") < 0) return -1;
  for (int k = 0; k < n_dims; k++) dims[k] = big_endian_u32(raw + 4 * k);
  return 0;
}

// What the header declares against what the file can hold, before anything is allocated:
// `count` items ("images" of `shape`, or "labels") of `item_bytes` each after `header_bytes`.
// A plain file must hold exactly that; a gzip file at most 1032 times its size.
static int check_fits(const IdxFile *f, uint32_t count, size_t item_bytes, size_t header_bytes,
                      const char *items, const char *shape) {
  uint64_t declared = (uint64_t)count * item_bytes;
  uint64_t payload =
      f->file_bytes > (int64_t)header_bytes ? (uint64_t)f->file_bytes - header_bytes : 0;
  if (f->compressed) {
    if (declared / max_gzip_ratio <= (uint64_t)f->file_bytes) return 0;
    return tl_fail(
        "%s: truncated: header says %u %s%s (%llu bytes), more than a gzip file of "
        "%lld bytes can hold (at most %llu times its size)",
        f->path, count, items, shape, (unsigned long long)declared, (long long)f->file_bytes,
        (unsigned long long)max_gzip_ratio);
  }
  if (payload < declared)
    return tl_fail("%s: truncated: header says %u %s%s, the file holds %llu", f->path, count, items,
                   shape, (unsigned long long)(payload / item_bytes));
  if (payload > declared)
    return tl_fail(
        "%s: more data than the header declares: header says %u %s%s (%llu bytes), "
        "the file holds %llu bytes",
        f->path, count, items, shape, (unsigned long long)declared, (unsigned long long)payload);
  return 0;
}

// Reads `wanted` items of `item_bytes` (of the `declared` the header gives) into a MEM_DATA
// block with room for `wanted` items of `out_item_bytes` each (the caller widens in place), at
// *out. A plain file's size was checked, so its block is allocated whole; a gzip file's as far
// as is plausible, then growing as data arrives (doubling, each step copied).
static int read_items(IdxFile *f, uint32_t wanted, uint32_t declared, size_t item_bytes,
                      size_t out_item_bytes, const char *items, const char *shape, void **out) {
  size_t cap = wanted;
  if (f->compressed) {
    uint64_t plausible = (uint64_t)f->file_bytes * plausible_gzip_ratio;
    uint64_t first = (plausible > first_block_bytes ? plausible : first_block_bytes) / item_bytes;
    if (first < cap) cap = first ? (size_t)first : 1;
  }
  uint8_t *buf = tl_alloc(cap * out_item_bytes, MEM_DATA, COMP_OTHER);
  size_t have = 0;  // whole items read
  for (;;) {
    size_t want_bytes = (cap - have) * item_bytes;
    int64_t got = read_upto(f->gz, f->path, buf + have * item_bytes, want_bytes);
    if (got < 0) break;
    have += (size_t)got / item_bytes;
    if ((size_t)got < want_bytes) {
      char why[256];
      gz_reason_suffix(f->gz, f->path, why, sizeof why);
      tl_fail("%s: truncated: header says %u %s%s, the file holds %zu%s", f->path, declared, items,
              shape, have, why);
      break;
    }
    if (cap == wanted) {
      *out = buf;
      return 0;
    }
    size_t grown = 2 * cap < wanted ? 2 * cap : wanted;
    uint8_t *bigger = tl_alloc(grown * out_item_bytes, MEM_DATA, COMP_OTHER);
    memcpy(bigger, buf, have * item_bytes);
    tl_free(buf);
    buf = bigger, cap = grown;
  }
  tl_free(buf);
  return -1;
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

enum { IMAGES_HEADER_BYTES = 16, LABELS_HEADER_BYTES = 8 };

// Opens an images file and reads and checks its header (dims: n, rows, cols); `shape` receives
// " of RxC" for messages.
static int open_images(IdxFile *f, const char *path, int channels, uint32_t *dims, char *shape,
                       size_t shape_cap) {
  if (open_idx(f, path, missing_hint) < 0) return -1;
  if (read_header(f, IDX_MAGIC_IMAGES, 3, dims) < 0 || check_image_header(path, dims, channels) < 0)
    return -1;
  snprintf(shape, shape_cap, " of %ux%u", dims[1], dims[2]);
  return check_fits(f, dims[0], (size_t)dims[1] * dims[2], IMAGES_HEADER_BYTES, "images", shape);
}

int dataset_idx_peek(const char *images_path, int *n, int *h, int *w) {
  IdxFile f;
  uint32_t dims[3];
  char shape[32];
  // Channels do not matter to the header's own bounds; 1 keeps the pixel-bytes check unscaled.
  int rc = open_images(&f, images_path, 1, dims, shape, sizeof shape);
  close_idx(&f);
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
  int rc = -1;
  IdxFile images = {0}, labels = {0};
  uint32_t dims[3], n_labels;
  char shape[32], labels_hint[4200], *labels_path = NULL;
  void *pixels = NULL, *label_values = NULL;
  // The images first, so a missing images file says so rather than anything about its labels.
  if (open_images(&images, images_path, channels, dims, shape, sizeof shape) < 0) goto done;
  if (!(labels_path = labels_path_for(images_path))) goto done;
  snprintf(labels_hint, sizeof labels_hint, "the labels for %s are looked for there", images_path);
  if (open_idx(&labels, labels_path, labels_hint) < 0 ||
      read_header(&labels, IDX_MAGIC_LABELS, 1, &n_labels) < 0)
    goto done;
  if (n_labels != dims[0]) {
    tl_fail("%s: %u labels for the %u images of %s", labels_path, n_labels, dims[0], images_path);
    goto done;
  }
  if (check_fits(&labels, n_labels, 1, LABELS_HEADER_BYTES, "labels", "") < 0) goto done;

  const uint32_t n_all = dims[0];
  const uint32_t n = limit > 0 && (uint32_t)limit < n_all ? (uint32_t)limit : n_all;
  const size_t gray_bytes = (size_t)n * dims[1] * dims[2];
  // pixels: (n, h, w, c), read as (n, h, w) and widened; labels: (n), read as bytes and widened
  if (read_items(&images, n, n_all, (size_t)dims[1] * dims[2], (size_t)dims[1] * dims[2] * channels,
                 "images", shape, &pixels) < 0)
    goto done;
  ds->pixels = pixels;
  if ((n == n_all && expect_end(&images) < 0) ||
      read_items(&labels, n, n_all, 1, sizeof *ds->labels, "labels", "", &label_values) < 0) {
    dataset_free(ds);
    goto done;
  }
  ds->labels = label_values;
  if (n == n_all && expect_end(&labels) < 0) {
    dataset_free(ds);
    goto done;
  }
  ds->n = (int)n;
  ds->h = (int)dims[1];
  ds->w = (int)dims[2];
  ds->c = channels;

  // Both widenings run in place from the back: element i moves to a position >= i, so every
  // source byte is read before anything overwrites it.
  if (channels == 3)
    for (size_t i = gray_bytes; i-- > 0;) {
      uint8_t v = ds->pixels[i];
      ds->pixels[3 * i] = ds->pixels[3 * i + 1] = ds->pixels[3 * i + 2] = v;
    }
  const uint8_t *label_bytes = (const uint8_t *)ds->labels;
  for (int i = ds->n; i-- > 0;) ds->labels[i] = label_bytes[i];
  for (int i = 0; i < ds->n; i++)
    if (ds->labels[i] >= ds->n_classes) ds->n_classes = ds->labels[i] + 1;
  rc = 0;

done:
  close_idx(&images);
  close_idx(&labels);
  free(labels_path);
  return rc;
}
