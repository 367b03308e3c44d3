// safetensors: the file format of Tally's checkpoints and exports, the one PyTorch's ecosystem
// reads. Layout: an 8-byte little-endian header length, a JSON header
//   {"__metadata__": {"key": "text", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// and the tensors' bytes, row-major, back to back. Tally adds the CRC-32 of the data section to
// the metadata ("crc32"), so a corrupt file is refused, not loaded.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32, ST_I64, ST_I32 } StDtype;

enum { ST_MAX_DIMS = 4, ST_NAME_MAX = 128 };

typedef struct {
  char name[ST_NAME_MAX];
  StDtype dtype;
  int ndim;  // 0 for a scalar
  int64_t shape[ST_MAX_DIMS];
  const void *data;  // writer: the caller's; reader: inside the file's buffer
                     // (not aligned: copy out with memcpy)
  size_t bytes;
} StTensor;

typedef struct {
  char *key, *value;
} StMeta;

// A list of tensors and metadata, to write (pointers to the caller's data, which must stay
// valid until st_write) or as read from a file.
typedef struct {
  StTensor *tensors;
  int n_tensors, cap_tensors;
  StMeta *meta;
  int n_meta, cap_meta;
  char *buffer;  // reader: the whole file
  size_t buffer_bytes;
} StFile;

size_t st_dtype_size(StDtype d);
const char *st_dtype_name(StDtype d);

// Adds a tensor (dims: ndim sizes). Dies on a sizing bug (more than ST_MAX_DIMS, long name).
void st_add(StFile *s, const char *name, StDtype dtype, int ndim, const int64_t *dims,
            const void *data);
// Adds or replaces a metadata entry (any text; it is escaped in the header).
void st_set_meta(StFile *s, const char *key, const char *value);
// NULL when absent.
const char *st_get_meta(const StFile *s, const char *key);
const StTensor *st_find(const StFile *s, const char *name);

// Writes the file atomically (io/atomic_file.h). -1 with tl_last_error() on any failure.
int st_write(const StFile *s, const char *path);

// Reads and checks a whole file: a regular file, header length and JSON well formed, every
// tensor's dtype known, shape consistent with its byte range, ranges inside the data section and
// covering it exactly, and the CRC-32 when the file carries one. -1 with a one-line
// tl_last_error() naming the file otherwise. `max_bytes` bounds what is read (0: no bound).
int st_read(StFile *s, const char *path, size_t max_bytes);
// Parses a file already in memory (takes ownership of buf, which must come from malloc).
int st_parse(StFile *s, char *buf, size_t bytes, const char *what);

void st_free(StFile *s);
