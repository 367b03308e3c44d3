// JPEG through libjpeg's API (Debian's libjpeg62-turbo), the rest through stb_image (the system
// libstb exports it, so no implementation is compiled here).
#include "data/decode.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stb_image.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
// jpeglib.h needs stdio.h's FILE and size_t first.
#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"
#include "io/regular_file.h"

// stb_image decodes above 4 Mi pixels (2048x2048, 16 MiB at 4 channels) one at a time, so the
// memory of concurrent decodes stays within one large image plus a small one per other thread.
static const long long max_parallel_decode_pixels = 4ll << 20;
// Bytes of an image's stored (uncompressed) pixel data one byte of its file can stand for:
// deflate's limit is 1032:1; JPEG's is below 300 (an 8x8 block costs at least two bits).
static const double max_bytes_per_file_byte = 1100;

typedef enum { FORMAT_NONE, FORMAT_PNG, FORMAT_JPEG, FORMAT_BMP } Format;

static Format format_of_name(const char *path) {
  const char *dot = strrchr(path, '.');
  if (!dot) return FORMAT_NONE;
  if (!strcasecmp(dot, ".png")) return FORMAT_PNG;
  if (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg")) return FORMAT_JPEG;
  if (!strcasecmp(dot, ".bmp")) return FORMAT_BMP;
  return FORMAT_NONE;
}

// stb_image decodes whatever format it recognizes whatever the name says (a 19-byte TGA named
// .png decodes as 6167x5142): a file must start as its extension says.
static int magic_matches(Format format, int fd) {
  unsigned char head[8] = {0};
  ssize_t n = pread(fd, head, sizeof head, 0);
  if (n < 2) return 0;
  switch (format) {
    case FORMAT_PNG:
      return n == 8 && !memcmp(head, "\x89PNG\r\n\x1a\n", 8);
    case FORMAT_JPEG:
      return n >= 3 && head[0] == 0xff && head[1] == 0xd8 && head[2] == 0xff;
    case FORMAT_BMP:
      return head[0] == 'B' && head[1] == 'M';
    default:
      return 0;
  }
}

// A JPEG Huffman table (DHT) codes at most 256 symbols; Debian's stb_image (before 2.28) writes
// past its table when one declares more. Every table in the file (before and between scans) is
// checked before stb_image sees a JPEG (libjpeg checks its own).
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
static double stored_bytes(Format format, int fd, int w, int h) {
  unsigned char ihdr[2];
  if (format != FORMAT_PNG || pread(fd, ihdr, 2, 24) != 2) return (double)w * h;
  // IHDR's bit depth and colour type (grey, -, RGB, palette, grey+alpha, -, RGBA)
  static const int samples[7] = {1, 0, 3, 1, 2, 0, 4};
  const int bits = ihdr[0] * (ihdr[1] < 7 ? samples[ihdr[1]] : 0);
  if (bits < 1) return (double)w * h;  // stb_image refuses it with its own reason
  return (double)h * (1 + ceil((double)w * bits / 8));
}

static int check_size(const char *path, int fd, Format format, int w, int h, int64_t file_bytes) {
  if (w < 1 || h < 1) return tl_fail("%s: an image of %dx%d pixels", path, w, h);
  // No PNG, JPEG or BMP compresses better than about 1000:1 (deflate's limit is 1032:1): a
  // header claiming more pixels than its file can hold would decode mostly made-up data.
  if (stored_bytes(format, fd, w, h) > max_bytes_per_file_byte * (double)file_bytes)
    return tl_fail("%s: claims %dx%d pixels in %lld bytes (truncated or corrupt)", path, w, h,
                   (long long)file_bytes);
  if (w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE || (long long)w * h > IMAGE_MAX_PIXELS)
    return tl_fail("%s: %dx%d pixels, more than %d per side or %lld (8192x8192) in all", path, w, h,
                   IMAGE_MAX_SIDE, IMAGE_MAX_PIXELS);
  return 0;
}

// ---- libjpeg ----

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];  // the first error or corrupt-data warning
  int corrupt;                    // a warning that means pixels are missing or made up
} JpegError;

static void jpeg_on_error(j_common_ptr c) {
  JpegError *e = (JpegError *)c->err;
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}

// libjpeg goes on past corrupt data, filling what it could not decode with grey. Only warnings
// that lose no pixel are let through: bytes between markers, an unknown JFIF revision, a bad ICC
// profile or Adobe transform code (the colours libjpeg assumes are the usual ones).
static void jpeg_on_message(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  JpegError *e = (JpegError *)c->err;
  const int code = c->err->msg_code;
  if (code == JWRN_EXTRANEOUS_DATA || code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC ||
      code == JWRN_ADOBE_XFORM)
    return;
  if (!e->corrupt) (*c->err->format_message)(c, e->message);
  e->corrupt = 1;
}

typedef struct {
  struct jpeg_decompress_struct d;
  JpegError err;
  FILE *f;
} Jpeg;

// A decompressor reading f whose errors and corrupt-data warnings come back to this file.
static Jpeg *jpeg_new(FILE *f) {
  Jpeg *j = calloc(1, sizeof *j);
  if (!j) TL_DIE("out of memory");
  j->f = f;
  j->d.err = jpeg_std_error(&j->err.pub);
  j->err.pub.error_exit = jpeg_on_error;
  j->err.pub.emit_message = jpeg_on_message;
  return j;
}

// Header of an open JPEG (inside the caller's setjmp).
static void jpeg_open(Jpeg *j) {
  jpeg_create_decompress(&j->d);
  jpeg_stdio_src(&j->d, j->f);
  jpeg_read_header(&j->d, TRUE);
}

// What to do with a JPEG once its header is read and checked: only that (header_only), or decode
// it at `channels`, at 1/reduction, or (fit_side > 0) at the largest reduction that keeps both
// sides at least fit_side.
typedef struct {
  int header_only, channels, reduction, fit_side;
} JpegJob;

// The colour spaces a JPEG's header may declare that decode here: grey, YCbCr or RGB through
// libjpeg's own conversion, CMYK and YCCK (Photoshop's, some scanners') as CMYK converted below.
// Anything else (2 components, 5 or more) is refused with the header, before a run starts.
static int jpeg_color_supported(const struct jpeg_decompress_struct *d) {
  switch (d->jpeg_color_space) {
    case JCS_GRAYSCALE:
      return d->num_components == 1;
    case JCS_YCbCr:
    case JCS_RGB:
      return d->num_components == 3;
    case JCS_CMYK:
    case JCS_YCCK:
      return d->num_components == 4;
    default:
      return 0;
  }
}

// A row of CMYK samples as libjpeg gives them to `channels` (3: RGB, 1: luminance). Adobe's
// CMYK JPEGs store every ink inverted (255 is no ink), and PIL reads every 4-component JPEG so
// ("CMYK;I") and converts each colour as (255 - K) - C (255 - K) / 255 with its own rounding,
// then luminance as ITU-R 601 in 16-bit fixed point: the same here, so a photo decodes to PIL's
// pixels (stb_image treats these files alike).
static void cmyk_row_to(const uint8_t *cmyk, int w, int channels, uint8_t *out) {
  for (int x = 0; x < w; x++, cmyk += 4) {
    const unsigned nk = cmyk[3];  // 255 - K
    uint8_t rgb[3];
    for (int i = 0; i < 3; i++) {
      const unsigned t = (255u - cmyk[i]) * nk + 128;  // C (255 - K), rounded as PIL's MULDIV255
      rgb[i] = (uint8_t)(nk - (((t >> 8) + t) >> 8));
    }
    if (channels == 3)
      memcpy(out + 3 * x, rgb, 3);
    else
      out[x] = (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
  }
}

// One pass over an open JPEG: the header read once, checked, then the pixels when asked for.
static int jpeg_read(const char *path, FILE *f, int64_t file_bytes, const JpegJob *job, int *w,
                     int *h, Image *img) {
  Jpeg *j = jpeg_new(f);
  // volatile: read after a longjmp back into this frame
  uint8_t *volatile pixels = NULL, *volatile cmyk_row = NULL;
  volatile int header_read = 0;
  int rc = -1;
  if (setjmp(j->err.jump) == 0) {
    jpeg_open(j);
    header_read = 1;
    *w = (int)j->d.image_width;
    *h = (int)j->d.image_height;
    if (!jpeg_color_supported(&j->d)) {
      tl_fail(
          "%s: a JPEG of %d colour components (libjpeg colour space %d), which cannot be "
          "decoded",
          path, j->d.num_components, (int)j->d.jpeg_color_space);
    } else if (check_size(path, fileno(f), FORMAT_JPEG, *w, *h, file_bytes) != 0) {
      // refused before a pixel is decoded
    } else if (job->header_only) {
      rc = 0;
    } else {
      const int reduction = job->fit_side > 0
                                ? image_reduction_for(*h, *w, job->fit_side, job->fit_side)
                                : job->reduction;
      // libjpeg converts neither CMYK nor YCCK to RGB ("Unsupported color conversion request"):
      // it gives CMYK, converted row by row.
      const int cmyk = j->d.num_components == 4;
      j->d.out_color_space = cmyk ? JCS_CMYK : job->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
      j->d.scale_num = 1;
      j->d.scale_denom = (unsigned)reduction;
      // ISLOW: libjpeg's accurate integer DCT (the default); its fancy upsampling of chroma, as
      // PIL and torchvision's decode_jpeg use.
      j->d.dct_method = JDCT_ISLOW;
      jpeg_start_decompress(&j->d);
      const int ow = (int)j->d.output_width, oh = (int)j->d.output_height;
      TL_ASSERT(j->d.output_components == (cmyk ? 4 : job->channels));
      const size_t row = (size_t)ow * job->channels;
      pixels = malloc(row * oh);
      // cmyk_row: (ow, 4), one row of CMYK before conversion
      cmyk_row = cmyk ? malloc((size_t)ow * 4) : NULL;
      if (!pixels || (cmyk && !cmyk_row)) TL_DIE("out of memory");
      while (j->d.output_scanline < j->d.output_height) {
        uint8_t *out = pixels + row * j->d.output_scanline;
        JSAMPROW rows[1] = {cmyk ? cmyk_row : out};
        jpeg_read_scanlines(&j->d, rows, 1);
        if (cmyk) cmyk_row_to(cmyk_row, ow, job->channels, out);
      }
      jpeg_finish_decompress(&j->d);
      if (j->err.corrupt) {
        tl_fail("%s: corrupt JPEG data: %s", path, j->err.message);
      } else {
        *img = (Image){pixels, oh, ow, job->channels, 1, reduction, {0}};
        pixels = NULL;
        rc = 0;
      }
    }
  } else {
    tl_fail(header_read ? "%s: cannot decode: %s" : "%s: not a readable JPEG: %s", path,
            j->err.message);
  }
  free(pixels);
  free(cmyk_row);
  jpeg_destroy_decompress(&j->d);
  free(j);
  return rc;
}

// ---- stb_image ----

static uint8_t *stb_decode(FILE *f, long long pixels, int channels, int *w, int *h) {
  int file_channels;
  if (pixels <= max_parallel_decode_pixels)
    return stbi_load_from_file(f, w, h, &file_channels, channels);
  uint8_t *decoded;
#pragma omp critical(image_large_decode)
  decoded = stbi_load_from_file(f, w, h, &file_channels, channels);
  return decoded;
}

// ---- both ----

// Opens `path` as a regular file whose content is the format its name says: *f at the start,
// *format, *file_bytes. The file is opened once and checked there, so what is decoded is what
// was checked.
static int open_file(const char *path, ImageDecoder decoder, FILE **f, Format *format,
                     int64_t *file_bytes, FileIdentity *id) {
  *format = format_of_name(path);
  if (*format == FORMAT_NONE) return tl_fail("%s: not a .png, .jpg, .jpeg or .bmp file", path);
  int fd = regular_open(path, 0, file_bytes);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return tl_fail("%s: cannot read: %s", path, strerror(errno));
  }
  *id = (FileIdentity){(uint64_t)st.st_dev, (uint64_t)st.st_ino, (int64_t)st.st_size,
                       (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec};
  if (!magic_matches(*format, fd)) {
    close(fd);
    return tl_fail("%s: its content is not the image format its name says", path);
  }
  if (*format == FORMAT_JPEG && decoder == DECODER_STB && !jpeg_tables_valid(fd, *file_bytes)) {
    close(fd);
    return tl_fail(
        "%s: corrupt JPEG header (a cut-off segment, or a Huffman table of more than 256 codes)",
        path);
  }
  if (!(*f = fdopen(fd, "rb"))) {
    close(fd);
    return tl_fail("%s: cannot open: %s", path, strerror(errno));
  }
  return 0;
}

// stb_image's header of the open file, checked; f back at the start.
static int stb_header(const char *path, FILE *f, Format format, int64_t file_bytes, int *w,
                      int *h) {
  int file_channels;
  if (!stbi_info_from_file(f, w, h, &file_channels))
    return tl_fail("%s: not a readable image: %s", path, stbi_failure_reason());
  // A BMP stored top-down gives a negative height (stb_image's header reader passes it on as
  // read; its decoder takes it as a flip).
  if (format == FORMAT_BMP && *h < 0 && *h != INT_MIN) *h = -*h;
  if (check_size(path, fileno(f), format, *w, *h, file_bytes) != 0) return -1;
  if (fseek(f, 0, SEEK_SET) != 0) return tl_fail("%s: cannot read: %s", path, strerror(errno));
  return 0;
}

int image_read_header(const char *path, ImageHeader *hdr) {
  FILE *f;
  Format format;
  int64_t file_bytes;
  FileIdentity id;
  int w, h, rc;
  if (open_file(path, DECODER_DEFAULT, &f, &format, &file_bytes, &id) != 0) return -1;
  if (format == FORMAT_JPEG)
    rc = jpeg_read(path, f, file_bytes, &(JpegJob){.header_only = 1}, &w, &h, NULL);
  else
    rc = stb_header(path, f, format, file_bytes, &w, &h);
  fclose(f);
  if (rc == 0) *hdr = (ImageHeader){h, w, format == FORMAT_JPEG, id};
  return rc;
}

static int decode_file(const char *path, const JpegJob *job, ImageDecoder decoder, Image *img) {
  memset(img, 0, sizeof *img);
  TL_ASSERT(job->channels == 1 || job->channels == 3);
  FILE *f;
  Format format;
  int64_t file_bytes;
  FileIdentity id;
  int w, h, rc;
  if (open_file(path, decoder, &f, &format, &file_bytes, &id) != 0) return -1;
  if (format == FORMAT_JPEG && decoder != DECODER_STB) {
    rc = jpeg_read(path, f, file_bytes, job, &w, &h, img);
  } else if ((rc = stb_header(path, f, format, file_bytes, &w, &h)) == 0) {
    uint8_t *px = stb_decode(f, (long long)w * h, job->channels, &w, &h);
    if (px) *img = (Image){px, h, w, job->channels, 1, 1, {0}};
    rc = px ? 0 : tl_fail("%s: cannot decode: %s", path, stbi_failure_reason());
  }
  fclose(f);
  if (rc == 0) img->id = id;
  return rc;
}

int image_decode(const char *path, int channels, int reduction, ImageDecoder decoder, Image *img) {
  TL_ASSERT(reduction == 1 || reduction == 2 || reduction == 4 || reduction == 8);
  return decode_file(path, &(JpegJob){.channels = channels, .reduction = reduction}, decoder, img);
}

int image_decode_fit(const char *path, int channels, int side, Image *img) {
  TL_ASSERT(side >= 1);
  return decode_file(path, &(JpegJob){.channels = channels, .fit_side = side}, DECODER_DEFAULT,
                     img);
}

int image_reduction_for(int h, int w, int need_h, int need_w) {
  int r = 1;
  while (r < 8 && image_reduced_side(h, 2 * r) >= need_h && image_reduced_side(w, 2 * r) >= need_w)
    r *= 2;
  return r;
}

void image_free(Image *img) {
  // stb_image's buffers are malloc'd (STBI_MALLOC's default), like libjpeg's path's.
  if (img->owned) free(img->pixels);
  memset(img, 0, sizeof *img);
}
