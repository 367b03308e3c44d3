// What the libFuzzer harnesses share: a private scratch folder per process (the readers under
// test take paths, so each input becomes files first), writing one input there, and cutting an
// input into NUL-separated parts. A failure here is the harness's own, so it aborts.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fuzz_scratch[512];

static inline void fuzz_remove_scratch(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_scratch);
  if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_scratch);
}

// $TMPDIR (run.sh points it at a folder it removes), else /dev/shm (the readers' fsyncs are
// free there), else /tmp; created on first use and removed at a normal exit.
static inline const char *fuzz_scratch_dir(void) {
  if (fuzz_scratch[0]) return fuzz_scratch;
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(fuzz_scratch, sizeof fuzz_scratch, "%s/tally-fuzz-XXXXXX", base);
  if (!mkdtemp(fuzz_scratch)) {
    perror("fuzz: mkdtemp");
    abort();
  }
  atexit(fuzz_remove_scratch);
  return fuzz_scratch;
}

// scratch/rel, with every folder on the way created.
static inline void fuzz_path(char *out, size_t cap, const char *rel) {
  snprintf(out, cap, "%s/%s", fuzz_scratch_dir(), rel);
  for (char *slash = strchr(out + strlen(fuzz_scratch) + 1, '/'); slash;
       slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    mkdir(out, 0755);
    *slash = '/';
  }
}

static inline void fuzz_write(const char *path, const void *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

// Up to `max` parts of the input, split at NUL bytes; each part is a malloc'ed NUL-terminated
// copy. Returns how many there are (at least 1); the last part takes the rest, NULs included.
static inline int fuzz_split(const uint8_t *data, size_t size, int max, char **parts,
                             size_t *lens) {
  int n = 0;
  size_t start = 0;
  while (n < max) {
    const uint8_t *nul = n + 1 < max ? memchr(data + start, 0, size - start) : NULL;
    size_t end = nul ? (size_t)(nul - data) : size;
    lens[n] = end - start;
    parts[n] = malloc(lens[n] + 1);
    if (!parts[n]) abort();
    memcpy(parts[n], data + start, lens[n]);
    parts[n][lens[n]] = '\0';
    n++;
    if (!nul) break;
    start = end + 1;
  }
  return n;
}

static inline void fuzz_free_parts(char **parts, int n) {
  for (int i = 0; i < n; i++) free(parts[i]);
}
