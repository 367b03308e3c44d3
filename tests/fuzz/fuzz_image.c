// libFuzzer harness: one image file in an ImageFolder tree (dataset_imagefolder_count,
// dataset_load_imagefolder), decoded (libjpeg-turbo for JPEG, stb_image for the rest) and resized
// into memory, then streamed: its header read at load, an augmented view (at a reduced JPEG
// decode when the crop allows) and the evaluation view decoded from the file, as `tally train`
// reads a folder.
// Input: one options byte, then the image file's bytes.
//   options bit 0: load as 3 channels, bit 1: unlabeled (ROOT/x.EXT, else ROOT/cls/x.EXT),
//   bits 2-3: EXT png, jpg, jpeg or bmp, bits 4-7: image size 1 + 3 * value (1..46).
//
// stb_image is compiled in here from the same header Debian's libstb is built from, so the
// decoder runs instrumented (coverage, AddressSanitizer) instead of as the uninstrumented shared
// library; the executable's definitions take precedence over libstb's.
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "fuzz_util.h"

static const char *const extensions[] = {"png", "jpg", "jpeg", "bmp"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options = data[0];
  const int channels = options & 1 ? 3 : 1, unlabeled = options & 2;
  const int image_size = 1 + 3 * (options >> 4);
  const char *root_rel = unlabeled ? "unlabeled" : "labeled";
  char root[600], dir_rel[64], path[600], rel[80];
  fuzz_path(root, sizeof root, root_rel);
  snprintf(dir_rel, sizeof dir_rel, "%s%s", root_rel, unlabeled ? "" : "/cls");
  // One image in the tree: the one this input names.
  for (int k = 0; k < 4; k++) {
    snprintf(rel, sizeof rel, "%s/x.%s", dir_rel, extensions[k]);
    fuzz_path(path, sizeof path, rel);
    unlink(path);
  }
  snprintf(rel, sizeof rel, "%s/x.%s", dir_rel, extensions[(options >> 2) & 3]);
  fuzz_path(path, sizeof path, rel);
  fuzz_write(path, data + 1, size - 1);

  int n;
  if (dataset_imagefolder_count(root, 0, 0, &n) != 0 || n != 1) abort();
  Dataset ds;
  if (dataset_load_imagefolder(&ds, root, image_size, channels, 0, 0) == 0) {
    if (ds.n != 1 || ds.h != image_size || ds.c != channels) abort();
    if (ds.n_classes != (unlabeled ? 0 : 1)) abort();
    dataset_free(&ds);
  }
  if (dataset_load_imagefolder(&ds, root, image_size, channels, 0, 1) == 0) {
    if (ds.n != 1 || ds.pixels || ds.source_h[0] < 1 || ds.source_w[0] < 1) abort();
    AugmentParams p = {.out_size = image_size,
                       .crop_scale_min = 0.05f,
                       .crop_scale_max = 1,
                       .crop_ratio_min = 0.75f,
                       .crop_ratio_max = 1.333f,
                       .mean = {0.5f, 0.5f, 0.5f},
                       .std = {0.25f, 0.25f, 0.25f}};
    float *view = malloc(sizeof *view * image_size * image_size * channels);
    Rng rng = rng_stream(size, RNG_AUGMENT, options, 0);
    (void)augment_view(&ds, 0, &p, &rng, view);
    (void)eval_view(&ds, 0, &p, view);
    free(view);
    dataset_free(&ds);
  }
  return 0;
}
