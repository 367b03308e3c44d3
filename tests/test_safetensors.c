// The safetensors reader and writer (io/safetensors.h) as a checkpoint's last line of defence:
// what Tally writes comes back byte for byte; a file written by other tools' conventions is read;
// and every way a file can be torn, tampered with or not a file at all is refused with one line
// naming it, without a crash, a leak or a blocked read. Then checkpoint_restore: a tensor the
// model wants that the checkpoint lacks, or holds in another shape, is named, and nothing is
// copied.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_test_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

// tmpdir/name, in a buffer the next call overwrites.
static char *path_in_tmp(const char *name) {
  static char path[600];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

// The whole file, malloc'ed; its size in *n.
static char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *bytes = malloc(*n);
  assert_int_equal(fread(bytes, 1, *n, f), *n);
  fclose(f);
  return bytes;
}

// A file put together by hand: `header_len` as the 8-byte little-endian length field (the true
// length of `header` when it is 0), the header, then `data_bytes` bytes of `data` (or of 0, 1,
// 2, ... when data is NULL).
static void write_handmade(const char *path, uint64_t header_len, const char *header,
                           const void *data, size_t data_bytes) {
  size_t text = strlen(header), n = 8 + text + data_bytes;
  if (!header_len) header_len = text;
  uint8_t *bytes = malloc(n);
  for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(header_len >> (8 * i));
  memcpy(bytes + 8, header, text);
  for (size_t i = 0; i < data_bytes; i++)
    bytes[8 + text + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)i;
  write_bytes(path, bytes, n);
  free(bytes);
}

// st_read must fail with one line that names the file and contains `why`.
static void assert_refused(const char *path, const char *why) {
  StFile s;
  tl_fail("%s", "");  // no stale message from an earlier case
  if (st_read(&s, path, 0) == 0) {
    st_free(&s);
    fail_msg("%s was read, expected a refusal mentioning '%s'", path, why);
  }
  const char *err = tl_last_error();
  if (!strstr(err, path) || !strstr(err, why) || strchr(err, '\n'))
    fail_msg("refusal of %s reads '%s', expected one line naming it and saying '%s'", path, err,
             why);
}

// ---- what Tally writes comes back

// Metadata text with every byte JSON must escape, and UTF-8 that it must not.
static const char awkward_text[] =
    "a \"quoted\" C:\\path\\ with\nnewlines\r\n\ta tab, \x01\x02\x1f control bytes, "
    "and caf\xc3\xa9";

static void test_round_trip_is_exact(void **state) {
  (void)state;
  // (2, 3, 1, 2) floats, a scalar step, a scalar loss, three int32 labels, and an empty (0, 3).
  float image[2][3][1][2];
  for (int i = 0; i < 12; i++) (&image[0][0][0][0])[i] = (float)i * 0.5f - 2.75f;
  int64_t step = (int64_t)1 << 40;
  float loss = 1.0f / 3.0f;
  int32_t labels[3] = {7, -1, 2147483647};
  StFile out = {0};
  st_add(&out, "encoder.conv1.weight", ST_F32, 4, (const int64_t[]){2, 3, 1, 2}, image);
  st_add(&out, "train.step", ST_I64, 0, NULL, &step);
  st_add(&out, "train.loss", ST_F32, 0, NULL, &loss);
  st_add(&out, "data.labels", ST_I32, 1, (const int64_t[]){3}, labels);
  st_add(&out, "queue.empty", ST_F32, 2, (const int64_t[]){0, 3}, NULL);
  st_set_meta(&out, "config", "replaced below");
  st_set_meta(&out, "config", awkward_text);
  st_set_meta(&out, "key \"with\" quotes\\", "v");
  const char *path = path_in_tmp("round_trip.safetensors");
  if (st_write(&out, path) != 0) fail_msg("%s", tl_last_error());

  StFile in;
  if (st_read(&in, path, 0) != 0) fail_msg("%s", tl_last_error());
  assert_int_equal(in.n_tensors, out.n_tensors);
  for (int i = 0; i < out.n_tensors; i++) {
    const StTensor *w = &out.tensors[i], *r = &in.tensors[i];
    assert_string_equal(r->name, w->name);
    assert_int_equal(r->dtype, w->dtype);
    assert_int_equal(r->ndim, w->ndim);
    for (int d = 0; d < w->ndim; d++) assert_int_equal(r->shape[d], w->shape[d]);
    assert_int_equal(r->bytes, w->bytes);
    if (w->bytes) assert_memory_equal(r->data, w->data, w->bytes);
  }
  assert_int_equal(st_find(&in, "train.step")->ndim, 0);
  assert_int_equal(st_find(&in, "queue.empty")->bytes, 0);
  assert_string_equal(st_get_meta(&in, "config"), awkward_text);
  assert_string_equal(st_get_meta(&in, "key \"with\" quotes\\"), "v");
  // The checksum Tally adds travels as metadata.
  assert_non_null(st_get_meta(&in, "crc32"));
  // The data section starts 8-byte aligned (the header is padded), as other readers expect.
  size_t n;
  char *bytes = read_bytes(path, &n);
  uint64_t header_len;
  memcpy(&header_len, bytes, 8);
  assert_int_equal(header_len % 8, 0);
  free(bytes);
  st_free(&in);
  st_free(&out);
}

// The Python safetensors package's conventions, not Tally's: no crc32, a "format" entry, tensor
// fields and tensors in another order, spaces after separators and as padding.
static void test_reads_a_file_written_elsewhere(void **state) {
  (void)state;
  const float weights[2] = {1.5f, -2.0f};
  const int64_t counts[2] = {(int64_t)1 << 40, -3};
  uint8_t data[24];
  memcpy(data, weights, 8);
  memcpy(data + 8, counts, 16);
  const char *header =
      "{\"counts\": {\"data_offsets\": [8, 24], \"shape\": [2], \"dtype\": \"I64\"}, "
      "\"__metadata__\": {\"format\": \"pt\"}, "
      "\"weights\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}      ";
  const char *path = path_in_tmp("python.safetensors");
  write_handmade(path, 0, header, data, sizeof data);

  StFile in;
  assert_int_equal(st_read(&in, path, 0), 0);
  assert_int_equal(in.n_tensors, 2);
  assert_null(st_get_meta(&in, "crc32"));
  assert_string_equal(st_get_meta(&in, "format"), "pt");
  const StTensor *w = st_find(&in, "weights"), *c = st_find(&in, "counts");
  assert_non_null(w);
  assert_non_null(c);
  assert_int_equal(w->dtype, ST_F32);
  assert_int_equal(c->dtype, ST_I64);
  assert_int_equal(c->shape[0], 2);
  assert_memory_equal(w->data, weights, sizeof weights);
  assert_memory_equal(c->data, counts, sizeof counts);
  st_free(&in);
}

// ---- what is refused

// A small valid file, written by Tally, as bytes.
static char *valid_file(size_t *n, uint64_t *header_len) {
  float x[6] = {1, 2, 3, 4, 5, 6};
  int64_t step = 42;
  StFile out = {0};
  st_add(&out, "x", ST_F32, 2, (const int64_t[]){2, 3}, x);
  st_add(&out, "step", ST_I64, 0, NULL, &step);
  const char *path = path_in_tmp("valid.safetensors");
  assert_int_equal(st_write(&out, path), 0);
  st_free(&out);
  char *bytes = read_bytes(path, n);
  memcpy(header_len, bytes, 8);
  return bytes;
}

static void test_refuses_truncated_files(void **state) {
  (void)state;
  size_t n;
  uint64_t header_len;
  char *bytes = valid_file(&n, &header_len);
  const struct {
    size_t keep;
    const char *why;
  } cuts[] = {
      {0, "not a safetensors file"},                // empty
      {5, "not a safetensors file"},                // in the length field
      {8, "truncated"},                             // the length field alone
      {8 + (size_t)header_len / 2, "truncated"},    // in the header
      {8 + (size_t)header_len, "do not fit"},       // no data
      {8 + (size_t)header_len + 20, "do not fit"},  // in the data
      {n - 1, "do not fit"},                        // one byte short
  };
  const char *path = path_in_tmp("cut.safetensors");
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    write_bytes(path, bytes, cuts[i].keep);
    assert_refused(path, cuts[i].why);
  }
  free(bytes);
}

static void test_refuses_header_lengths_beyond_the_file(void **state) {
  (void)state;
  size_t n;
  uint64_t header_len;
  char *bytes = valid_file(&n, &header_len);
  const char *path = path_in_tmp("length.safetensors");
  const uint64_t lies[] = {n - 7, n, (uint64_t)1 << 63, UINT64_MAX};
  for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
    for (int b = 0; b < 8; b++) bytes[b] = (char)(lies[i] >> (8 * b));
    write_bytes(path, bytes, n);
    assert_refused(path, "truncated");
  }
  free(bytes);
}

static void test_refuses_a_flipped_data_byte(void **state) {
  (void)state;
  size_t n;
  uint64_t header_len;
  char *bytes = valid_file(&n, &header_len);
  const char *path = path_in_tmp("flipped.safetensors");
  bytes[8 + header_len + 5] ^= 0x10;
  write_bytes(path, bytes, n);
  assert_refused(path, "checksum mismatch");
  free(bytes);
}

// Headers that are well-formed JSON or nearly, over data they do not describe.
static void test_refuses_inconsistent_headers(void **state) {
  (void)state;
  const struct {
    const char *header;
    size_t data_bytes;
    const char *why;
  } cases[] = {
      {"{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
       "tensor h has dtype F16"},
      // three floats in eight bytes
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "tensor a: bytes"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "do not fit"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "do not fit"},
      // b starts inside a: 16 bytes claimed of 12
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
       12, "cover 16 of 12"},
      // bytes no tensor claims, before, between and after
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "cover 4 of 8"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
       12, "cover 8 of 12"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 of 8"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "repeated"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
       "too many dimensions"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
       "corrupt safetensors header"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "lacks dtype, shape or data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
       "unknown tensor field"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
       "number too large"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
       "\"data_offsets\":[0,4]}}",
       4, "absurd shape"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "corrupt safetensors header"},
      // bad JSON
      {"{\"a\":{\"dtype\":\"F32", 4, "unterminated string"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} {}", 4,
       "text after the header"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
       "unexpected character"},
      {"{\"bad\\q\":{}}", 4, "bad escape"},
      {"{\"bad\\u12g4\":{}}", 4, "bad \\u escape"},
      {"", 4, "unexpected character"},
      {"[]", 4, "unexpected character"},
      // ranges that add up but overlap, and an empty header over data
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       8, "tensors a and b overlap"},
      {"{}", 8, "cover 0 of 8"},
      {"{} {}", 0, "text after the header"},
  };
  const char *path = path_in_tmp("header.safetensors");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_handmade(path, 0, cases[i].header, NULL, cases[i].data_bytes);
    assert_refused(path, cases[i].why);
  }
}

// The reader opens without blocking and reads regular files only: a FIFO with no writer, a
// device that never ends and a folder are refused at once.
static void test_refuses_what_is_not_a_file(void **state) {
  (void)state;
  const char *fifo = path_in_tmp("fifo");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  alarm(10);  // a blocked open or read ends the test instead of hanging it
  assert_refused(fifo, "not a regular file");
  assert_refused("/dev/zero", "not a regular file");
  assert_refused(tmpdir, "not a regular file");
  alarm(0);
  assert_refused(path_in_tmp("absent.safetensors"), "no such file");
  // A size bound refuses before reading.
  size_t n;
  uint64_t header_len;
  free(valid_file(&n, &header_len));
  StFile s;
  assert_int_equal(st_read(&s, path_in_tmp("valid.safetensors"), n - 1), -1);
  assert_non_null(strstr(tl_last_error(), "more than"));
}

// ---- checkpoint_restore

static void test_restore_names_what_does_not_match_and_copies_nothing(void **state) {
  (void)state;
  // The model: "w" (2, 3) and "b" (3), both F32.
  float w[6] = {0}, b[3] = {0};
  StFile want = {0};
  st_add(&want, "w", ST_F32, 2, (const int64_t[]){2, 3}, w);
  st_add(&want, "b", ST_F32, 1, (const int64_t[]){3}, b);
  const float saved_w[6] = {1, 2, 3, 4, 5, 6}, saved_b[4] = {7, 8, 9, 10};
  const int32_t saved_b_int[3] = {7, 8, 9};
  const struct {
    const char *b_name;
    StDtype b_dtype;
    int64_t b_len;
    const void *b_data;
    const char *why;
  } checkpoints[] = {
      {"bias", ST_F32, 3, saved_b, "has no tensor b"},
      {"b", ST_F32, 4, saved_b, "tensor b is F32 [4], the model needs F32 [3]"},
      {"b", ST_I32, 3, saved_b_int, "tensor b is I32 [3], the model needs F32 [3]"},
  };
  for (size_t i = 0; i < sizeof checkpoints / sizeof checkpoints[0]; i++) {
    StFile have = {0};
    st_add(&have, "w", ST_F32, 2, (const int64_t[]){2, 3}, saved_w);
    st_add(&have, checkpoints[i].b_name, checkpoints[i].b_dtype, 1, &checkpoints[i].b_len,
           checkpoints[i].b_data);
    memset(w, 0, sizeof w);
    memset(b, 0, sizeof b);
    assert_int_equal(checkpoint_restore(&want, &have, "ckpt.safetensors"), -1);
    assert_non_null(strstr(tl_last_error(), "ckpt.safetensors: "));
    assert_non_null(strstr(tl_last_error(), checkpoints[i].why));
    // w matched, but is not copied either: a failed restore leaves the model as it was.
    for (int k = 0; k < 6; k++) assert_true(w[k] == 0);
    st_free(&have);
  }
  // And when everything matches, everything is copied.
  StFile have = {0};
  st_add(&have, "b", ST_F32, 1, (const int64_t[]){3}, saved_b);
  st_add(&have, "w", ST_F32, 2, (const int64_t[]){2, 3}, saved_w);
  assert_int_equal(checkpoint_restore(&want, &have, "ckpt.safetensors"), 0);
  assert_memory_equal(w, saved_w, sizeof w);
  assert_memory_equal(b, saved_b, sizeof b);
  st_free(&have);
  st_free(&want);
}

int main(void) {
  if (cli_test_init("safetensors") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_is_exact),
      cmocka_unit_test(test_reads_a_file_written_elsewhere),
      cmocka_unit_test(test_refuses_truncated_files),
      cmocka_unit_test(test_refuses_header_lengths_beyond_the_file),
      cmocka_unit_test(test_refuses_a_flipped_data_byte),
      cmocka_unit_test(test_refuses_inconsistent_headers),
      cmocka_unit_test(test_refuses_what_is_not_a_file),
      cmocka_unit_test(test_restore_names_what_does_not_match_and_copies_nothing),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (sh("rm -rf %s", tmpdir) != 0) return 1;
  return failed;
}
