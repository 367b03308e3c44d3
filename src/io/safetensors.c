#include "io/safetensors.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_write.h"
#include "io/regular_file.h"

// The header is metadata and names, never data: a bound keeps a hostile length from allocating.
enum { ST_HEADER_MAX = 64 << 20 };

static const char *const DTYPE_NAMES[] = {"F32", "I64", "I32"};
static const size_t DTYPE_SIZES[] = {4, 8, 4};

size_t st_dtype_size(StDtype d) { return DTYPE_SIZES[d]; }
const char *st_dtype_name(StDtype d) { return DTYPE_NAMES[d]; }

static void *grow(void *p, int *cap, int need, size_t item) {
  if (need <= *cap) return p;
  *cap = *cap ? 2 * *cap : 16;
  if (*cap < need) *cap = need;
  p = realloc(p, (size_t)*cap * item);
  if (!p) TL_DIE("out of memory");
  return p;
}

static char *dup_text(const char *s) {
  char *d = strdup(s);
  if (!d) TL_DIE("out of memory");
  return d;
}

void st_add(StFile *s, const char *name, StDtype dtype, int ndim, const int64_t *dims,
            const void *data) {
  TL_ASSERT(ndim >= 0 && ndim <= ST_MAX_DIMS && strlen(name) < ST_NAME_MAX);
  s->tensors = grow(s->tensors, &s->cap_tensors, s->n_tensors + 1, sizeof(StTensor));
  StTensor *t = &s->tensors[s->n_tensors++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->ndim = ndim;
  size_t elems = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = dims[i];
    elems *= (size_t)dims[i];
  }
  t->data = data;
  t->bytes = elems * st_dtype_size(dtype);
}

void st_set_meta(StFile *s, const char *key, const char *value) {
  for (int i = 0; i < s->n_meta; i++)
    if (strcmp(s->meta[i].key, key) == 0) {
      free(s->meta[i].value);
      s->meta[i].value = dup_text(value);
      return;
    }
  s->meta = grow(s->meta, &s->cap_meta, s->n_meta + 1, sizeof(StMeta));
  s->meta[s->n_meta++] = (StMeta){dup_text(key), dup_text(value)};
}

const char *st_get_meta(const StFile *s, const char *key) {
  for (int i = 0; i < s->n_meta; i++)
    if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
  return NULL;
}

const StTensor *st_find(const StFile *s, const char *name) {
  for (int i = 0; i < s->n_tensors; i++)
    if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
  return NULL;
}

void st_free(StFile *s) {
  for (int i = 0; i < s->n_meta; i++) {
    free(s->meta[i].key);
    free(s->meta[i].value);
  }
  free(s->meta);
  free(s->tensors);
  free(s->buffer);
  memset(s, 0, sizeof *s);
}

// ---- writing

static int is_checksum_key(const char *key) {
  return strcmp(key, "crc32") == 0 || strcmp(key, "crc32_metadata") == 0;
}

// The CRC-32 of the header's meaning: the metadata (key and value with their terminating zeros,
// the checksums' own entries left out) and the tensor table (each tensor's name, dtype, shape and
// byte range), in the order they are written and read. An edited value is refused like an edited
// tensor, and so are two tensors' names swapped (the data's own CRC would not see that).
// `data`: where the tensors' bytes begin (a file read), or NULL for one being written, whose
// tensors lie back to back in order.
static uint32_t metadata_crc(const StFile *s, const char *data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int i = 0; i < s->n_meta; i++) {
    if (is_checksum_key(s->meta[i].key)) continue;
    crc = crc32_z(crc, (const Bytef *)s->meta[i].key, strlen(s->meta[i].key) + 1);
    crc = crc32_z(crc, (const Bytef *)s->meta[i].value, strlen(s->meta[i].value) + 1);
  }
  uint64_t offset = 0;
  for (int i = 0; i < s->n_tensors; i++) {
    const StTensor *t = &s->tensors[i];
    const char *dtype = st_dtype_name(t->dtype);
    crc = crc32_z(crc, (const Bytef *)t->name, strlen(t->name) + 1);
    crc = crc32_z(crc, (const Bytef *)dtype, strlen(dtype) + 1);
    if (data) offset = (uint64_t)((const char *)t->data - data);
    // Little-endian whatever the host: the numbers as the file means them.
    uint64_t numbers[ST_MAX_DIMS + 3] = {(uint64_t)t->ndim, offset, t->bytes};
    for (int d = 0; d < t->ndim; d++) numbers[3 + d] = (uint64_t)t->shape[d];
    for (int k = 0; k < 3 + t->ndim; k++) {
      uint8_t le[8];
      for (int b = 0; b < 8; b++) le[b] = (uint8_t)(numbers[k] >> (8 * b));
      crc = crc32_z(crc, le, 8);
    }
    offset += t->bytes;
  }
  return (uint32_t)crc;
}

static char *header_text(const StFile *s, uint32_t crc, size_t *len) {
  char *text = NULL;
  FILE *f = open_memstream(&text, len);
  if (!f) TL_DIE("out of memory");
  fputs("{\"__metadata__\":{", f);
  for (int i = 0; i < s->n_meta; i++) {
    if (is_checksum_key(s->meta[i].key)) continue;
    json_put_string(f, s->meta[i].key);
    fputc(':', f);
    json_put_string(f, s->meta[i].value);
    fputc(',', f);
  }
  fprintf(f, "\"crc32_metadata\":\"%08" PRIx32 "\",", metadata_crc(s, NULL));
  fprintf(f, "\"crc32\":\"%08" PRIx32 "\"}", crc);
  size_t offset = 0;
  for (int i = 0; i < s->n_tensors; i++) {
    const StTensor *t = &s->tensors[i];
    fputc(',', f);
    json_put_string(f, t->name);
    fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%" PRId64, d ? "," : "", t->shape[d]);
    fprintf(f, "],\"data_offsets\":[%zu,%zu]}", offset, offset + t->bytes);
    offset += t->bytes;
  }
  fputc('}', f);
  // Padded with spaces to a multiple of 8 so the data section starts aligned.
  while ((ftell(f) + 8) % 8) fputc(' ', f);
  if (fclose(f) != 0) TL_DIE("out of memory");
  return text;
}

int st_write(const StFile *s, const char *path) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // Empty tensors are skipped: zlib restarts the CRC when handed a NULL buffer.
  for (int i = 0; i < s->n_tensors; i++)
    if (s->tensors[i].bytes) crc = crc32_z(crc, s->tensors[i].data, s->tensors[i].bytes);
  size_t len;
  char *header = header_text(s, (uint32_t)crc, &len);
  AtomicFile a;
  if (atomic_open(&a, path) != 0) {
    free(header);
    return -1;
  }
  uint8_t len_le[8];
  for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)len >> (8 * i));
  fwrite(len_le, 1, 8, a.f);
  fwrite(header, 1, len, a.f);
  for (int i = 0; i < s->n_tensors; i++) fwrite(s->tensors[i].data, 1, s->tensors[i].bytes, a.f);
  free(header);
  return atomic_commit(&a);
}

// ---- reading: a small strict JSON reader for the header's shape of document

typedef struct {
  const char *p, *end, *what;
  int failed;
} Json;

static int json_fail(Json *j, const char *why) {
  if (!j->failed) tl_fail("%s: corrupt safetensors header (%s)", j->what, why);
  j->failed = 1;
  return -1;
}

static void skip_ws(Json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int expect(Json *j, char c) {
  skip_ws(j);
  if (j->p >= j->end || *j->p != c) return json_fail(j, "unexpected character");
  j->p++;
  return 0;
}

static int peek(Json *j, char c) {
  skip_ws(j);
  return j->p < j->end && *j->p == c;
}

// Reads a string into a malloc'ed buffer (\uXXXX kept to one byte when below 0x80, else as
// UTF-8).
static char *json_string(Json *j) {
  if (expect(j, '"')) return NULL;
  size_t cap = 64, n = 0;
  char *out = malloc(cap);
  if (!out) TL_DIE("out of memory");
  while (j->p < j->end && *j->p != '"') {
    if (n + 4 >= cap && !(out = realloc(out, cap *= 2))) TL_DIE("out of memory");
    char c = *j->p++;
    if (c != '\\') {
      out[n++] = c;
      continue;
    }
    if (j->p >= j->end) break;
    char e = *j->p++;
    const char *plain = strchr("\"\\/bfnrt", e);
    if (plain) {
      out[n++] = "\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
    } else if (e == 'u' && j->end - j->p >= 4) {
      unsigned v = 0;
      for (int i = 0; i < 4; i++) {
        char h = *j->p++;
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) {
          free(out);
          json_fail(j, "bad \\u escape");
          return NULL;
        }
        v = v * 16 + (unsigned)d;
      }
      if (v < 0x80) {
        out[n++] = (char)v;
      } else if (v < 0x800) {
        out[n++] = (char)(0xc0 | (v >> 6));
        out[n++] = (char)(0x80 | (v & 0x3f));
      } else {
        out[n++] = (char)(0xe0 | (v >> 12));
        out[n++] = (char)(0x80 | ((v >> 6) & 0x3f));
        out[n++] = (char)(0x80 | (v & 0x3f));
      }
    } else {
      free(out);
      json_fail(j, "bad escape");
      return NULL;
    }
  }
  if (j->p >= j->end) {
    free(out);
    json_fail(j, "unterminated string");
    return NULL;
  }
  j->p++;
  out[n] = 0;
  return out;
}

static int json_uint(Json *j, uint64_t *v) {
  skip_ws(j);
  const char *start = j->p;
  uint64_t x = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    if (x > (UINT64_MAX - 9) / 10) return json_fail(j, "number too large");
    x = x * 10 + (uint64_t)(*j->p++ - '0');
  }
  if (j->p == start) return json_fail(j, "expected a number");
  *v = x;
  return 0;
}

// [a, b, ...] of unsigned integers, at most `max` of them.
static int json_uint_array(Json *j, uint64_t *vals, int max, int *n) {
  *n = 0;
  if (expect(j, '[')) return -1;
  if (peek(j, ']')) return expect(j, ']');
  do {
    if (*n == max) return json_fail(j, "too many dimensions");
    if (json_uint(j, &vals[(*n)++])) return -1;
  } while (peek(j, ',') && !expect(j, ','));
  return expect(j, ']');
}

static int parse_metadata(Json *j, StFile *s) {
  if (expect(j, '{')) return -1;
  if (peek(j, '}')) return expect(j, '}');
  do {
    char *k = json_string(j);
    char *v = k && !expect(j, ':') ? json_string(j) : NULL;
    if (k && v) st_set_meta(s, k, v);
    free(k);
    free(v);
    if (!v) return json_fail(j, "metadata values must be strings");
  } while (peek(j, ',') && !expect(j, ','));
  return expect(j, '}');
}

static int parse_tensor(Json *j, StTensor *t, uint64_t offsets[2]) {
  int have_dtype = 0, have_shape = 0, have_offsets = 0;
  if (expect(j, '{')) return -1;
  do {
    char *k = json_string(j);
    if (!k || expect(j, ':')) {
      free(k);
      return -1;
    }
    if (strcmp(k, "dtype") == 0) {
      char *d = json_string(j);
      have_dtype = -1;
      for (int i = 0; d && i < 3; i++)
        if (strcmp(d, DTYPE_NAMES[i]) == 0) t->dtype = (StDtype)i, have_dtype = 1;
      if (have_dtype < 0 && d)
        tl_fail("%s: tensor %s has dtype %s (Tally reads F32, I64, I32)", j->what, t->name, d),
            j->failed = 1;
      free(d);
    } else if (strcmp(k, "shape") == 0) {
      uint64_t dims[ST_MAX_DIMS];
      have_shape = json_uint_array(j, dims, ST_MAX_DIMS, &t->ndim) == 0;
      for (int i = 0; i < t->ndim; i++) t->shape[i] = (int64_t)dims[i];
    } else if (strcmp(k, "data_offsets") == 0) {
      int n;
      have_offsets = json_uint_array(j, offsets, 2, &n) == 0 && n == 2;
    } else {
      free(k);
      return json_fail(j, "unknown tensor field");
    }
    free(k);
    if (j->failed) return -1;
  } while (peek(j, ',') && !expect(j, ','));
  if (expect(j, '}')) return -1;
  if (have_dtype != 1 || !have_shape || !have_offsets)
    return json_fail(j, "a tensor lacks dtype, shape or data_offsets");
  return 0;
}

// Checks a tensor's byte range against its shape and the data section.
static int check_extent(const char *what, StTensor *t, const uint64_t off[2], size_t data_bytes) {
  uint64_t elems = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0 || (t->shape[i] > 0 && elems > UINT64_MAX / 16 / (uint64_t)t->shape[i]))
      return tl_fail("%s: tensor %s: absurd shape", what, t->name);
    elems *= (uint64_t)t->shape[i];
  }
  uint64_t bytes = elems * st_dtype_size(t->dtype);
  if (off[0] > off[1] || off[1] > data_bytes || off[1] - off[0] != bytes)
    return tl_fail("%s: tensor %s: bytes [%" PRIu64 ", %" PRIu64
                   ") do not fit its shape or the "
                   "file (truncated?)",
                   what, t->name, off[0], off[1]);
  t->bytes = (size_t)bytes;
  return 0;
}

// Tensors in the order of their bytes (an empty one before a full one at the same offset).
static int by_offset(const void *a, const void *b) {
  const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
  if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
  return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

// Ranges inside the data section that add up to it cover it exactly unless two overlap.
static int check_no_overlap(const StFile *s, const char *what) {
  const StTensor **order = malloc(sizeof *order * (size_t)(s->n_tensors + 1));
  if (!order) TL_DIE("out of memory");
  for (int i = 0; i < s->n_tensors; i++) order[i] = &s->tensors[i];
  qsort(order, (size_t)s->n_tensors, sizeof *order, by_offset);
  int rc = 0;
  for (int i = 1; i < s->n_tensors && rc == 0; i++)
    if ((const char *)order[i]->data < (const char *)order[i - 1]->data + order[i - 1]->bytes)
      rc = tl_fail("%s: tensors %s and %s overlap (corrupt)", what, order[i - 1]->name,
                   order[i]->name);
  free(order);
  return rc;
}

static int parse_header(StFile *s, Json *j, size_t data_bytes, const char *data) {
  uint64_t covered = 0;
  if (expect(j, '{')) return -1;
  // An empty header still goes through the checks below (text after it, data nobody holds).
  if (!peek(j, '}')) do {
      char *name = json_string(j);
      if (!name || expect(j, ':')) {
        free(name);
        return -1;
      }
      if (strcmp(name, "__metadata__") == 0) {
        free(name);
        if (parse_metadata(j, s)) return -1;
        continue;
      }
      if (strlen(name) >= ST_NAME_MAX || st_find(s, name)) {
        free(name);
        return json_fail(j, "tensor name too long or repeated");
      }
      s->tensors = grow(s->tensors, &s->cap_tensors, s->n_tensors + 1, sizeof(StTensor));
      StTensor *t = &s->tensors[s->n_tensors++];
      memset(t, 0, sizeof *t);
      snprintf(t->name, sizeof t->name, "%s", name);
      free(name);
      uint64_t off[2];
      if (parse_tensor(j, t, off) || check_extent(j->what, t, off, data_bytes)) return -1;
      t->data = data ? data + off[0] : NULL;  // NULL: a header checked before its data is read
      covered += t->bytes;
    } while (peek(j, ',') && !expect(j, ','));
  if (expect(j, '}')) return -1;
  skip_ws(j);
  if (j->p != j->end) return json_fail(j, "text after the header");
  // Ranges may not overlap and must cover the data exactly: anything else is a torn or
  // tampered file.
  if (covered != data_bytes)
    return tl_fail("%s: the tensors cover %" PRIu64 " of %zu data bytes (truncated or corrupt)",
                   j->what, covered, data_bytes);
  return data ? check_no_overlap(s, j->what) : 0;  // (by where the data lies, once it is read)
}

// Every float tensor is finite: a NaN or infinity in weights, optimizer state or statistics
// would train, evaluate or export a dead network without a word (BatchNorm and ReLU turn NaNs
// into constant outputs, and the loss stays finite).
static int check_finite(StFile *s, const char *what) {
  for (int i = 0; i < s->n_tensors; i++) {
    const StTensor *t = &s->tensors[i];
    if (t->dtype != ST_F32) continue;
    const size_t n = t->bytes / sizeof(float);
    for (size_t k = 0; k < n; k++) {
      float v;
      memcpy(&v, (const char *)t->data + k * sizeof v, sizeof v);
      if (isfinite(v)) continue;
      tl_fail("%s: tensor %s holds %s at index %zu (a poisoned or diverged state): refused", what,
              t->name, isnan(v) ? "NaN" : "an infinity", k);
      st_free(s);
      return -1;
    }
  }
  return 0;
}

int st_parse(StFile *s, char *buf, size_t bytes, const char *what) {
  memset(s, 0, sizeof *s);
  s->buffer = buf;
  s->buffer_bytes = bytes;
  if (bytes < 8) {
    st_free(s);
    return tl_fail("%s: not a safetensors file (%zu bytes)", what, bytes);
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)buf[i];
  if (hlen > ST_HEADER_MAX || hlen > bytes - 8) {
    st_free(s);
    return tl_fail("%s: not a safetensors file, or truncated (header of %" PRIu64
                   " bytes in a file of %zu)",
                   what, hlen, bytes);
  }
  Json j = {buf + 8, buf + 8 + hlen, what, 0};
  const char *data = buf + 8 + hlen;
  size_t data_bytes = bytes - 8 - (size_t)hlen;
  if (parse_header(s, &j, data_bytes, data) != 0) {
    st_free(s);
    return -1;
  }
  const char *crc_text = st_get_meta(s, "crc32");
  if (crc_text) {
    uLong crc = crc32_z(crc32(0L, Z_NULL, 0), (const Bytef *)data, data_bytes);
    char have[16];
    snprintf(have, sizeof have, "%08lx", (unsigned long)crc);
    if (strcmp(have, crc_text) != 0) {
      st_free(s);
      return tl_fail("%s: checksum mismatch (the file is corrupt)", what);
    }
  }
  const char *meta_crc_text = st_get_meta(s, "crc32_metadata");
  if (meta_crc_text) {
    char have[16];
    snprintf(have, sizeof have, "%08" PRIx32, metadata_crc(s, data));
    if (strcmp(have, meta_crc_text) != 0) {
      st_free(s);
      return tl_fail(
          "%s: metadata checksum mismatch (its configuration, step or tensor table was "
          "edited, or the file is corrupt)",
          what);
    }
  }
  return check_finite(s, what);
}

// The length word and the JSON header alone, checked as st_parse checks them, without the data
// (the tensors' extents against the file's size). Files too short for a header are left to
// st_parse, which says so.
static int check_header_first(int fd, size_t size, const char *path) {
  uint8_t head[8];
  if (size < 8 || pread(fd, head, 8, 0) != 8) return 0;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | head[i];
  if (hlen > ST_HEADER_MAX || hlen > size - 8)
    return tl_fail("%s: not a safetensors file, or truncated (header of %" PRIu64
                   " bytes in a file of %zu)",
                   path, hlen, size);
  char *header = malloc(hlen ? hlen : 1);
  if (!header) TL_DIE("out of memory for a header of %" PRIu64 " bytes", hlen);
  int rc = pread(fd, header, hlen, 8) == (ssize_t)hlen ? 0 : tl_fail("%s: cannot read", path);
  if (rc == 0) {
    StFile tmp;
    memset(&tmp, 0, sizeof tmp);
    Json j = {header, header + hlen, path, 0};
    rc = parse_header(&tmp, &j, size - 8 - (size_t)hlen, NULL);
    st_free(&tmp);
  }
  free(header);
  return rc;
}

int st_read(StFile *s, const char *path, size_t max_bytes) {
  memset(s, 0, sizeof *s);
  int64_t bytes;
  int fd = regular_open(path, 0, &bytes);
  if (fd < 0) return -1;
  size_t size = (size_t)bytes;
  if (max_bytes && size > max_bytes) {
    close(fd);
    return tl_fail("%s: %zu bytes, more than the %zu allowed", path, size, max_bytes);
  }
  // The header first: a file that is not safetensors (a 10 GB disk image named like a
  // checkpoint) is refused before its data is read, not after.
  if (check_header_first(fd, size, path) != 0) {
    close(fd);
    return -1;
  }
  char *buf = malloc(size ? size : 1);
  if (!buf) {
    close(fd);
    return tl_fail("%s: cannot hold its %zu bytes in memory", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != size) {
    free(buf);
    return tl_fail("%s: read %zu of %zu bytes", path, got, size);
  }
  return st_parse(s, buf, size, path);
}
