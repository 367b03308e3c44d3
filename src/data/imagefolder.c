// ImageFolder trees: root/<class>/<image>, one class per subfolder; or, for unlabeled data, the
// images directly under root (no subfolders at all), or every image under root at any depth when
// the caller says the subfolders are not classes (DATASET_UNLABELED): one group, n_classes 0.
// Images are either decoded once into memory at the training size (data.stream = 0) or only their
// headers read here, the pixels decoded by the loader when a batch needs them (data/decode.h).
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/decode.h"

static const char *const image_extensions[] = {".png", ".jpg", ".jpeg", ".bmp"};
static const int max_image_size = 4096;

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

// Decodes one image into out (size, size, channels), resized. Safe to call from several threads:
// the error goes to this thread's tl_last_error().
static int load_image(const char *path, int size, int channels, uint8_t *out) {
  Image img;
  if (image_decode_fit(path, channels, size, &img) != 0) return -1;
  // resized: (size, size, channels) on the 0..255 scale
  const size_t n_values = (size_t)size * size * channels;
  float *resized = tl_alloc(sizeof *resized * n_values, MEM_DATA, COMP_OTHER);
  image_resample_bilinear(img.pixels, img.h, img.w, channels, 0, 0, img.h, img.w, resized, size,
                          size);
  for (size_t i = 0; i < n_values; i++) {
    float v = resized[i] + 0.5f;
    out[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
  tl_free(resized);
  image_free(&img);
  return 0;
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

// Deeper than this, a folder tree is taken for a loop of links.
enum { MAX_FOLDER_DEPTH = 32 };

// Every image under dir/rel, at any depth, into out as paths relative to dir: each folder's
// images (sorted) before its subfolders (sorted), hidden entries skipped.
static int list_tree(const char *dir, const char *rel, int depth, NameList *out) {
  char *here = rel[0] ? join_path(dir, rel) : strdup(dir);
  if (!here) TL_DIE("out of memory");
  NameList images = {0}, folders = {0};
  int rc =
      depth > MAX_FOLDER_DEPTH
          ? tl_fail("%s: folders nested deeper than %d (a loop of links?)", here, MAX_FOLDER_DEPTH)
          : list_dir(here, 0, &images);
  if (rc == 0) rc = list_dir(here, 1, &folders);
  for (int i = 0; rc == 0 && i < images.n; i++) {
    if (out->n == out->cap) {
      out->cap = out->cap ? 2 * out->cap : 16;
      out->names = realloc(out->names, sizeof *out->names * out->cap);
      if (!out->names) TL_DIE("out of memory");
    }
    out->names[out->n++] = rel[0] ? join_path(rel, images.names[i]) : strdup(images.names[i]);
    if (!out->names[out->n - 1]) TL_DIE("out of memory");
  }
  for (int i = 0; rc == 0 && i < folders.n; i++) {
    char *sub = rel[0] ? join_path(rel, folders.names[i]) : strdup(folders.names[i]);
    if (!sub) TL_DIE("out of memory");
    rc = list_tree(dir, sub, depth + 1, out);
    free(sub);
  }
  names_free(&images);
  names_free(&folders);
  free(here);
  return rc;
}

// The images of group `name` under root: a class folder's own images, or, for the unlabeled
// group ("."), every image under root at any depth.
static int list_group(const char *root, const char *name, NameList *out) {
  if (strcmp(name, ".") == 0) return list_tree(root, "", 0, out);
  char *dir = join_path(root, name);
  int rc = list_dir(dir, 0, out);
  free(dir);
  return rc;
}

// The class subfolders of root, or, when it has none or `unlabeled` says its subfolders are not
// classes, root itself as one unlabeled group ("."), provided it holds images. *labeled says
// which.
static int list_groups(const char *root, int unlabeled, NameList *groups, int *labeled) {
  if (unlabeled) {
    *labeled = 0;
    NameList all = {0};
    if (list_tree(root, "", 0, &all) < 0) return -1;
    const int any = all.n > 0;
    names_free(&all);
    if (!any)
      return tl_fail("%s: no .png, .jpg, .jpeg or .bmp images in it or its subfolders", root);
    groups->names = malloc(sizeof *groups->names);
    if (!groups->names || !(groups->names[0] = strdup("."))) TL_DIE("out of memory");
    groups->n = groups->cap = 1;
    return 0;
  }
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

int dataset_imagefolder_count(const char *root, int limit, int flags, int *n) {
  NameList classes = {0};
  int labeled;
  if (list_groups(root, flags & DATASET_UNLABELED, &classes, &labeled) < 0) return -1;
  NameList *files = calloc(classes.n, sizeof *files);
  int *keep = calloc(classes.n, sizeof *keep);
  if (!files || !keep) TL_DIE("out of memory");
  int rc = 0;
  for (int k = 0; k < classes.n && rc == 0; k++) rc = list_group(root, classes.names[k], &files[k]);
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

// Lists root's images (class by class under `limit`) into ds->files and ds->labels, and its
// classes into ds->class_names when it has class folders.
static int list_images(Dataset *ds, const char *root, int limit, int unlabeled) {
  NameList classes = {0};
  int labeled;
  if (list_groups(root, unlabeled, &classes, &labeled) < 0) return -1;
  const int n_classes = classes.n;
  int rc = -1;
  NameList *files = calloc(n_classes, sizeof *files);
  int *keep = calloc(n_classes, sizeof *keep);
  if (!files || !keep) TL_DIE("out of memory");
  for (int k = 0; k < n_classes; k++) {
    int listed = list_group(root, classes.names[k], &files[k]);
    if (listed == 0 && files[k].n == 0)
      tl_fail("%s/%s: no .png, .jpg, .jpeg or .bmp images", root, classes.names[k]);
    if (listed < 0 || files[k].n == 0) goto done;
  }
  class_quotas(files, n_classes, limit, keep);
  ds->n = 0;
  for (int k = 0; k < n_classes; k++) ds->n += keep[k];
  ds->labels = tl_alloc(sizeof *ds->labels * ds->n, MEM_DATA, COMP_OTHER);
  if (!(ds->files = calloc(ds->n, sizeof *ds->files))) TL_DIE("out of memory");
  for (int k = 0, i = 0; k < n_classes; k++) {
    // An unlabeled folder's one group is root itself: root/name, not root/./name.
    char *dir = labeled ? join_path(root, classes.names[k]) : strdup(root);
    if (!dir) TL_DIE("out of memory");
    for (int f = 0; f < keep[k]; f++, i++) {
      ds->files[i] = join_path(dir, files[k].names[f]);
      ds->labels[i] = k;
    }
    free(dir);
  }
  if (labeled) {
    ds->n_classes = n_classes;
    ds->class_names = classes.names;
    classes = (NameList){0};
  }
  rc = 0;
done:
  for (int k = 0; k < n_classes; k++) names_free(&files[k]);
  free(files);
  free(keep);
  names_free(&classes);
  return rc;
}

// Runs `each` over every image in parallel; the error reported is the first failing image in
// dataset order, whatever the thread timing.
static int for_each_image(Dataset *ds, int (*each)(Dataset *, int, void *), void *arg) {
  int first_failed = INT_MAX;
  char *first_error = NULL;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < ds->n; i++) {
    if (each(ds, i, arg) < 0) {
#pragma omp critical(imagefolder_first_error)
      if (i < first_failed) {
        first_failed = i;
        free(first_error);
        if (!(first_error = strdup(tl_last_error()))) TL_DIE("out of memory");
      }
    }
  }
  if (first_failed == INT_MAX) return 0;
  tl_fail("%s", first_error);
  free(first_error);
  return -1;
}

static int load_one(Dataset *ds, int i, void *arg) {
  (void)arg;
  return load_image(ds->files[i], ds->h, ds->c, ds->pixels + (size_t)ds->h * ds->w * ds->c * i);
}

static int scan_one(Dataset *ds, int i, void *arg) {
  (void)arg;
  ImageHeader hdr;
  if (image_read_header(ds->files[i], &hdr) != 0) return -1;
  ds->source_h[i] = (uint16_t)hdr.h;
  ds->source_w[i] = (uint16_t)hdr.w;
  ds->source_id[i] = hdr.id;
  return 0;
}

int dataset_load_imagefolder(Dataset *ds, const char *root, int image_size, int channels, int limit,
                             int flags) {
  const int streaming = flags & DATASET_STREAM;
  memset(ds, 0, sizeof *ds);
  if (channels != 1 && channels != 3)
    return tl_fail("%s: channels must be 1 or 3, got %d", root, channels);
  if (image_size < 1 || image_size > max_image_size)
    return tl_fail("%s: image size %d is outside 1..%d", root, image_size, max_image_size);
  if (list_images(ds, root, limit, flags & DATASET_UNLABELED) != 0) {
    dataset_free(ds);
    return -1;
  }
  ds->h = ds->w = image_size;
  ds->c = channels;
  int rc;
  if (streaming) {
    // source_h, source_w, source_id: (n) each; the pixels stay in the files
    ds->source_h = tl_alloc(sizeof *ds->source_h * ds->n, MEM_DATA, COMP_OTHER);
    ds->source_w = tl_alloc(sizeof *ds->source_w * ds->n, MEM_DATA, COMP_OTHER);
    ds->source_id = tl_alloc(sizeof *ds->source_id * ds->n, MEM_DATA, COMP_OTHER);
    rc = for_each_image(ds, scan_one, NULL);
  } else {
    // pixels: (n, image_size, image_size, channels)
    ds->pixels = tl_alloc((size_t)image_size * image_size * channels * ds->n, MEM_DATA, COMP_OTHER);
    rc = for_each_image(ds, load_one, NULL);
  }
  if (rc != 0) dataset_free(ds);
  return rc;
}
