#include "train/checkpoint.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

static const char MAGIC[8] = {'T', 'A', 'L', 'L', 'Y', 'C', 'K', '1'};

int checkpoint_save(const char *path, long step, const float *params, size_t count) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return tl_fail("%s: cannot write checkpoint: %s", tmp, strerror(errno));
  uint64_t header[2] = {(uint64_t)step, (uint64_t)count};
  int ok = fwrite(MAGIC, 1, sizeof MAGIC, f) == sizeof MAGIC &&
           fwrite(header, sizeof header, 1, f) == 1 &&
           fwrite(params, sizeof(float), count, f) == count;
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  int saved_errno = errno;
  if (fclose(f) != 0) ok = 0;
  if (!ok || rename(tmp, path) != 0) {
    if (ok) saved_errno = errno;
    unlink(tmp);
    return tl_fail("%s: checkpoint not written (%s); the previous one is kept", path,
                   strerror(saved_errno));
  }
  return 0;
}

int checkpoint_load(const char *path, long *step, float *params, size_t count) {
  FILE *f = fopen(path, "rb");
  if (!f) return tl_fail("%s: cannot open checkpoint: %s", path, strerror(errno));
  char magic[8];
  uint64_t header[2];
  int ok = fread(magic, 1, sizeof magic, f) == sizeof magic && memcmp(magic, MAGIC, 8) == 0 &&
           fread(header, sizeof header, 1, f) == 1;
  if (!ok) {
    fclose(f);
    return tl_fail("%s: not a Tally checkpoint", path);
  }
  if (header[1] != count) {
    fclose(f);
    return tl_fail("%s: checkpoint holds %llu parameters, the model has %zu", path,
                   (unsigned long long)header[1], count);
  }
  ok = fread(params, sizeof(float), count, f) == count;
  fclose(f);
  if (!ok) return tl_fail("%s: truncated checkpoint", path);
  *step = (long)header[0];
  return 0;
}
