// ImageFolder trees: root/<class>/<image>, one class per subfolder; or, for unlabeled data, the
// images directly under root (no subfolders at all): one group, n_classes 0. Decoding is
// stb_image's (the system libstb exports it, so no implementation is compiled here); stbi_load's
// requested channel count does the conversion: luminance for RGB -> gray, replication for gray ->
// RGB.
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <limits.h>
#include <stb_image.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/dataset.h"
#include "io/regular_file.h"

static const char *const image_extensions[] = {".png", ".jpg", ".jpeg", ".bmp"};
// stb_image allocates the whole decoded image, so its size is checked (stbi_info reads only the
// header) before decoding starts. 64 Mi pixels (8192x8192) is more than any camera's photo (a
// 61 MP sensor's is 9504x6336 = 60.2 Mi); decoded at 8 bits in 4 channels that is 256 MiB, and a
// PNG holds its inflated rows beside it while decoding. Long sides stay bounded on their own.
static const int max_source_side_pixels = 16384;
static const long long max_source_pixels = 64ll << 20;
// Images are decoded in parallel; those above 4 Mi pixels (2048x2048, 16 MiB decoded at 4
// channels) one at a time, so the memory of concurrent decodes stays within one large image plus
// a small one per other thread.
static const long long max_parallel_decode_pixels = 4ll << 20;
static const int max_image_size = 4096;
// Bytes of an image's stored (uncompressed) pixel data one byte of its file can stand for:
// deflate's limit is 1032:1; JPEG's is below 300 (an 8x8 block costs at least two bits).
static const double max_bytes_per_file_byte = 1100;

typedef struct {
  char **names;  // malloc'd, sorted by strcmp
  int n, cap;
} NameList;

static void names_free(NameList *l) {
  for (int i = 0; i < l->n; i++) free(l->names[i]);
  free(l->names);
  memset(l, 0, sizeof *l);
}

static char *join_path(const char *dir, const char *name) {
  char *p;
  if (asprintf(&p, "%s/%s", dir, name) < 0) TL_DIE("out of memory");
  return p;
}

static int has_image_extension(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot) return 0;
  for (size_t k = 0; k < sizeof image_extensions / sizeof *image_extensions; k++)
    if (strcasecmp(dot, image_extensions[k]) == 0) return 1;
  return 0;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

// Subdirectories (want_dirs) or image files of `dir`, sorted; hidden entries are skipped. An
// entry named like an image that is not a regular file (a FIFO, a device, a dangling link) is an
// error naming it: reading it could block forever or never end.
static int list_dir(const char *dir, int want_dirs, NameList *out) {
  DIR *d = opendir(dir);
  if (!d) return tl_fail("%s: cannot open directory: %s", dir, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char *full = join_path(dir, e->d_name);
    struct stat st;
    int found = stat(full, &st) == 0, is_dir = found && S_ISDIR(st.st_mode);
    int image = !want_dirs && !is_dir && has_image_extension(e->d_name);
    if (image && !found)
      rc = tl_fail("%s: cannot read: %s", full, strerror(errno));
    else if (image && !S_ISREG(st.st_mode))
      rc = tl_fail("%s: not a regular file", full);
    free(full);
    if (rc != 0 || (want_dirs ? !is_dir : !image)) continue;
    if (out->n == out->cap) {
      out->cap = out->cap ? 2 * out->cap : 16;
      out->names = realloc(out->names, sizeof *out->names * out->cap);
      if (!out->names) TL_DIE("out of memory");
    }
    if (!(out->names[out->n++] = strdup(e->d_name))) TL_DIE("out of memory");
  }
  closedir(d);
  if (rc != 0) {
    names_free(out);
    return -1;
  }
  if (out->n > 1) qsort(out->names, out->n, sizeof *out->names, compare_names);
  return 0;
}

// stb_image decodes whatever format it recognizes whatever the name says (a 19-byte TGA named
// .png decodes as 6167x5142): a file must start as its extension says.
static int magic_matches(const char *path, int fd) {
  unsigned char head[8] = {0};
  ssize_t n = pread(fd, head, sizeof head, 0);
  const char *dot = strrchr(path, '.');
  if (!dot || n < 2) return 0;
  if (!strcasecmp(dot, ".png")) return n == 8 && !memcmp(head, "\x89PNG\r\n\x1a\n", 8);
  if (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"))
    return n >= 3 && head[0] == 0xff && head[1] == 0xd8 && head[2] == 0xff;
  if (!strcasecmp(dot, ".bmp")) return head[0] == 'B' && head[1] == 'M';
  return 0;
}

// A JPEG Huffman table (DHT) codes at most 256 symbols; Debian's stb_image (before 2.28) writes
// past its table when one declares more. Every table in the file (before and between scans) is
// checked first.
static int jpeg_tables_valid(int fd, int64_t bytes) {
  size_t n = bytes < (64 << 20) ? (size_t)bytes : (size_t)64 << 20;
  unsigned char *b = malloc(n ? n : 1);
  if (!b) TL_DIE("out of memory");
  int ok = pread(fd, b, n, 0) == (ssize_t)n;
  for (size_t at = 2; ok && at + 4 <= n;) {
    if (b[at] != 0xff) {  // stb_image skips bytes between markers: so does the check
      at++;
      continue;
    }
    unsigned marker = b[at + 1];
    if (marker == 0xff) {  // fill byte
      at++;
      continue;
    }
    if (marker == 0xd8 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {
      at += 2;
      continue;
    }
    if (marker == 0xd9) break;  // the end
    size_t len = (size_t)b[at + 2] << 8 | b[at + 3], end = at + 2 + len;
    if (len < 2 || end > n) {
      ok = 0;  // a header segment cut off by the end of the file
      break;
    }
    if (marker == 0xda) {
      // A scan: its entropy-coded data runs to the next marker (0xFF not followed by a stuffed
      // 0x00 or a restart marker), where tables for the next scan may follow.
      at = end;
      while (at + 1 < n && !(b[at] == 0xff && b[at + 1] != 0x00 && b[at + 1] != 0xff &&
                             !(b[at + 1] >= 0xd0 && b[at + 1] <= 0xd7)))
        at++;
      continue;
    }
    for (size_t t = at + 4; ok && marker == 0xc4 && t < end;) {
      size_t codes = 0;
      if (t + 17 > end) ok = 0;  // a table's 16 counts cut off
      for (int i = 1; ok && i <= 16; i++) codes += b[t + i];
      if (codes > 256) ok = 0;
      t += 17 + codes;
    }
    at = end;
  }
  free(b);
  return ok;
}

// The bytes of pixel data the image stores before compression: a PNG's filtered rows at its own
// bit depth (a bilevel scan stores 8 pixels a byte, so 1:1100 in pixels would refuse a valid
// one), one byte a pixel for the other formats (their least; JPEG and BMP's RLE are far from the
// ratio anyway).
static double stored_bytes(const char *path, int fd, int w, int h) {
  const char *dot = strrchr(path, '.');
  unsigned char ihdr[2];
  if (strcasecmp(dot, ".png") != 0 || pread(fd, ihdr, 2, 24) != 2) return (double)w * h;
  // IHDR's bit depth and colour type (grey, -, RGB, palette, grey+alpha, -, RGBA)
  static const int samples[7] = {1, 0, 3, 1, 2, 0, 4};
  const int bits = ihdr[0] * (ihdr[1] < 7 ? samples[ihdr[1]] : 0);
  if (bits < 1) return (double)w * h;  // stb_image refuses it with its own reason
  return (double)h * (1 + ceil((double)w * bits / 8));
}

// stb_image's decode of the open file f (at `channels`), one large image at a time.
static uint8_t *decode(FILE *f, long long pixels, int channels, int *w, int *h) {
  int file_channels;
  if (pixels <= max_parallel_decode_pixels)
    return stbi_load_from_file(f, w, h, &file_channels, channels);
  uint8_t *decoded;
#pragma omp critical(imagefolder_large_decode)
  decoded = stbi_load_from_file(f, w, h, &file_channels, channels);
  return decoded;
}

// Decodes one image into out (size, size, channels), resized. Safe to call from several threads:
// the error goes to this thread's tl_last_error(). The file is opened once and checked to be
// regular there, so what is decoded is what was checked.
static int load_image(const char *path, int size, int channels, uint8_t *out) {
  int64_t file_bytes = 0;
  int fd = regular_open(path, 0, &file_bytes);
  if (fd < 0) return -1;
  if (!magic_matches(path, fd)) {
    close(fd);
    return tl_fail("%s: its content is not the image format its name says", path);
  }
  const char *dot = strrchr(path, '.');
  if ((!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg")) &&
      !jpeg_tables_valid(fd, file_bytes)) {
    close(fd);
    return tl_fail(
        "%s: corrupt JPEG header (a cut-off segment, or a Huffman table of more than "
        "256 codes)",
        path);
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return tl_fail("%s: cannot open: %s", path, strerror(errno));
  }
  int w, h, file_channels, rc = -1;
  uint8_t *decoded = NULL;
  if (!stbi_info_from_file(f, &w, &h, &file_channels)) {
    tl_fail("%s: not a readable image: %s", path, stbi_failure_reason());
  } else if (w < 1 || h < 1) {
    tl_fail("%s: an image of %dx%d pixels", path, w, h);
  } else if (stored_bytes(path, fileno(f), w, h) > max_bytes_per_file_byte * (double)file_bytes) {
    // No PNG, JPEG or BMP compresses better than about 1000:1 (deflate's limit is 1032:1): a
    // header claiming more pixels than its file can hold would decode mostly made-up data.
    tl_fail("%s: claims %dx%d pixels in %lld bytes (truncated or corrupt)", path, w, h,
            (long long)file_bytes);
  } else if (w > max_source_side_pixels || h > max_source_side_pixels ||
             (long long)w * h > max_source_pixels) {
    tl_fail("%s: %dx%d pixels, more than %d per side or %lld (8192x8192) in all", path, w, h,
            max_source_side_pixels, max_source_pixels);
  } else if (!(decoded = decode(f, (long long)w * h, channels, &w, &h))) {
    tl_fail("%s: cannot decode: %s", path, stbi_failure_reason());
  } else {
    // resized: (size, size, channels) on the 0..255 scale
    const size_t n_values = (size_t)size * size * channels;
    float *resized = tl_alloc(sizeof *resized * n_values, MEM_DATA, COMP_OTHER);
    image_resample_bilinear(decoded, h, w, channels, 0, 0, h, w, resized, size, size);
    for (size_t i = 0; i < n_values; i++) {
      float v = resized[i] + 0.5f;
      out[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    tl_free(resized);
    stbi_image_free(decoded);
    rc = 0;
  }
  fclose(f);
  return rc;
}

// How many images of each class to keep under `limit`: round-robin over the classes, so a small
// limit still samples every class (each class keeps its first files in name order).
static void class_quotas(const NameList *files, int n_classes, int limit, int *keep) {
  int total = 0;
  for (int k = 0; k < n_classes; k++) total += files[k].n;
  if (limit <= 0 || limit >= total) {
    for (int k = 0; k < n_classes; k++) keep[k] = files[k].n;
    return;
  }
  for (int k = 0; k < n_classes; k++) keep[k] = 0;
  for (int left = limit; left > 0;)
    for (int k = 0; k < n_classes && left > 0; k++)
      if (keep[k] < files[k].n) keep[k]++, left--;
}

// The class subfolders of root, or, when it has none, root itself as one unlabeled group ("."),
// provided it holds images. *labeled says which.
static int list_groups(const char *root, NameList *groups, int *labeled) {
  if (list_dir(root, 1, groups) < 0) return -1;
  *labeled = groups->n > 0;
  NameList images = {0};
  int rc = list_dir(root, 0, &images);
  int any = images.n > 0;
  // Images beside class folders belong to no class: leaving them out unsaid would train on less
  // than the user gave.
  if (rc == 0 && *labeled && any)
    rc = tl_fail(
        "%s: %d image%s beside the class folders (%s%s) belong to no class; move them into one, "
        "or out of the folder",
        root, images.n, images.n == 1 ? "" : "s", images.names[0], images.n > 1 ? ", ..." : "");
  names_free(&images);
  if (rc < 0) {
    names_free(groups);
    return -1;
  }
  if (*labeled) return 0;
  if (!any) return tl_fail("%s: no class subfolders and no .png, .jpg, .jpeg or .bmp images", root);
  groups->names = malloc(sizeof *groups->names);
  if (!groups->names || !(groups->names[0] = strdup("."))) TL_DIE("out of memory");
  groups->n = groups->cap = 1;
  return 0;
}

int dataset_imagefolder_count(const char *root, int limit, int *n) {
  NameList classes = {0};
  int labeled;
  if (list_groups(root, &classes, &labeled) < 0) return -1;
  NameList *files = calloc(classes.n, sizeof *files);
  int *keep = calloc(classes.n, sizeof *keep);
  if (!files || !keep) TL_DIE("out of memory");
  int rc = 0;
  for (int k = 0; k < classes.n && rc == 0; k++) {
    char *dir = join_path(root, classes.names[k]);
    rc = list_dir(dir, 0, &files[k]);
    free(dir);
  }
  if (rc == 0) {
    class_quotas(files, classes.n, limit, keep);
    *n = 0;
    for (int k = 0; k < classes.n; k++) *n += keep[k];
  }
  for (int k = 0; k < classes.n; k++) names_free(&files[k]);
  free(files);
  free(keep);
  names_free(&classes);
  return rc;
}

int dataset_load_imagefolder(Dataset *ds, const char *root, int image_size, int channels,
                             int limit) {
  memset(ds, 0, sizeof *ds);
  if (channels != 1 && channels != 3)
    return tl_fail("%s: channels must be 1 or 3, got %d", root, channels);
  if (image_size < 1 || image_size > max_image_size)
    return tl_fail("%s: image size %d is outside 1..%d", root, image_size, max_image_size);

  NameList classes = {0};
  int labeled;
  if (list_groups(root, &classes, &labeled) < 0) return -1;
  const int n_classes = classes.n;
  int rc = -1;
  NameList *files = calloc(n_classes, sizeof *files);
  int *keep = calloc(n_classes, sizeof *keep);
  char **paths = NULL;  // (n) the images kept, class by class
  if (!files || !keep) TL_DIE("out of memory");
  for (int k = 0; k < n_classes; k++) {
    char *dir = join_path(root, classes.names[k]);
    int listed = list_dir(dir, 0, &files[k]);
    if (listed == 0 && files[k].n == 0) tl_fail("%s: no .png, .jpg, .jpeg or .bmp images", dir);
    free(dir);
    if (listed < 0 || files[k].n == 0) goto done;
  }
  class_quotas(files, n_classes, limit, keep);

  for (int k = 0; k < n_classes; k++) ds->n += keep[k];
  ds->h = ds->w = image_size;
  ds->c = channels;
  const size_t image_bytes = (size_t)image_size * image_size * channels;
  // pixels: (n, image_size, image_size, channels); labels: (n)
  ds->pixels = tl_alloc(image_bytes * ds->n, MEM_DATA, COMP_OTHER);
  ds->labels = tl_alloc(sizeof *ds->labels * ds->n, MEM_DATA, COMP_OTHER);
  if (!(paths = malloc(sizeof *paths * ds->n))) TL_DIE("out of memory");
  for (int k = 0, i = 0; k < n_classes; k++) {
    char *dir = join_path(root, classes.names[k]);
    for (int f = 0; f < keep[k]; f++, i++) {
      paths[i] = join_path(dir, files[k].names[f]);
      ds->labels[i] = k;
    }
    free(dir);
  }

  // The error reported is the first failing image in dataset order, whatever the thread timing.
  int first_failed = INT_MAX;
  char *first_error = NULL;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < ds->n; i++) {
    if (load_image(paths[i], image_size, channels, ds->pixels + image_bytes * i) < 0) {
#pragma omp critical(imagefolder_first_error)
      if (i < first_failed) {
        first_failed = i;
        free(first_error);
        if (!(first_error = strdup(tl_last_error()))) TL_DIE("out of memory");
      }
    }
  }
  if (first_failed != INT_MAX) {
    tl_fail("%s", first_error);
    free(first_error);
    goto done;
  }

  if (labeled) {
    ds->n_classes = n_classes;
    ds->class_names = classes.names;
    classes = (NameList){0};
  }
  ds->files = paths;  // which file each image came from (tally embed lists them)
  paths = NULL;
  rc = 0;

done:
  if (paths)
    for (int i = 0; i < ds->n; i++) free(paths[i]);
  free(paths);
  for (int k = 0; k < n_classes; k++) names_free(&files[k]);
  free(files);
  free(keep);
  names_free(&classes);
  if (rc < 0) dataset_free(ds);
  return rc;
}
