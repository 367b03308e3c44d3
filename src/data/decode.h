// One image file to 8-bit pixels: JPEG through libjpeg-turbo (SIMD, and DCT-domain downscaling:
// decoded at 1/2, 1/4 or 1/8 of each side when that is all a crop needs), PNG and BMP through
// stb_image. Every file is opened as a regular file, its content checked against its name, its
// header against size limits, before a pixel is decoded. Safe from several threads at once:
// errors go to the calling thread's tl_last_error(), naming the file.
#pragma once
#include <stdint.h>

// 64 Mi pixels (8192x8192) is more than any camera's photo (a 61 MP sensor's is 9504x6336 =
// 60.2 Mi); decoded at 8 bits in 4 channels that is 256 MiB. Long sides stay bounded on their own.
enum { IMAGE_MAX_SIDE = 16384 };
#define IMAGE_MAX_PIXELS (64ll << 20)

// A file as it was when opened: another image written over it (even of the same size in
// pixels) changes its size or modification time, one renamed over it its inode.
typedef struct {
  uint64_t dev, ino;
  int64_t bytes, mtime_ns;
} FileIdentity;

static inline int file_identity_equal(const FileIdentity *a, const FileIdentity *b) {
  return a->dev == b->dev && a->ino == b->ino && a->bytes == b->bytes && a->mtime_ns == b->mtime_ns;
}

typedef struct {
  int h, w;         // the file's own size in pixels
  int jpeg;         // 1: a JPEG, decodable at 1/2, 1/4 and 1/8 of each side
  FileIdentity id;  // the file whose header this is
} ImageHeader;

// Reads and checks a file's header without decoding its pixels: a regular file whose content is
// the format its name says (.png, .jpg/.jpeg, .bmp), at most IMAGE_MAX_SIDE a side and
// IMAGE_MAX_PIXELS in all, and no more pixels than its bytes can hold. -1 with tl_last_error().
int image_read_header(const char *path, ImageHeader *hdr);

typedef struct {
  uint8_t *pixels;  // (h, w, c)
  int h, w, c;
  int owned;        // 1: pixels were allocated by image_decode (image_free releases them)
  int reduction;    // decoded at 1/reduction of each side of the file
  FileIdentity id;  // decoded: the file the pixels came from
} Image;

typedef enum {
  DECODER_DEFAULT,  // libjpeg-turbo for JPEG, stb_image for the rest
  DECODER_STB,      // stb_image for every format (full size only; tests compare the two)
} ImageDecoder;

// Decodes `path` into img at `channels` (1: luminance, 3: RGB; a gray file is replicated) and,
// for a JPEG, at 1/`reduction` of each side (1, 2, 4 or 8; the size rounds up, as libjpeg's
// scaled decode gives); other formats decode at full size whatever `reduction` says. Everything
// image_read_header checks is checked again (the file may have changed), and a truncated or
// corrupt file is an error, never a partly grey image. -1 with tl_last_error() naming the file.
int image_decode(const char *path, int channels, int reduction, ImageDecoder decoder, Image *img);
// The same at the largest reduction that keeps both sides at least `side` (a JPEG; other formats
// at full size), the header read once.
int image_decode_fit(const char *path, int channels, int side, Image *img);
void image_free(Image *img);

// The largest JPEG reduction (1, 2, 4, 8) that still decodes an h x w image at least
// need_h x need_w.
int image_reduction_for(int h, int w, int need_h, int need_w);

// The side libjpeg's scaled decode gives a side of `side` pixels at 1/reduction.
static inline int image_reduced_side(int side, int reduction) {
  return (side + reduction - 1) / reduction;
}
