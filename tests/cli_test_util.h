// For the tests that run the tally binary as a user does: where it is (TALLY_BIN, set by ctest),
// a scratch folder for the runs, and a shell command's exit code.
#pragma once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "io/safetensors.h"
#include "train/checkpoint.h"

static char tmpdir[256];
static const char *bin;

// Finds the binary and makes /tmp/tally-NAME-XXXXXX. Returns 0, or -1 if no folder was made.
static inline int cli_test_init(const char *name) {
  bin = getenv("TALLY_BIN");
  if (!bin) bin = "build/tally";
  snprintf(tmpdir, sizeof tmpdir, "/tmp/tally-%s-XXXXXX", name);
  return mkdtemp(tmpdir) ? 0 : -1;
}

// Runs a shell command (printf-style) and returns its exit code (-1 if it did not exit).
static inline int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int sh(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int status = system(cmd);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The text of a small file (a summary, a log) into buf, NUL-terminated, cut at cap - 1 bytes.
static inline void read_file_text(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("%s: cannot open", path);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
}

// The online parameters a checkpoint holds (its params.* tensors, in order) as one malloc'ed
// block; *steps receives the steps it holds. NULL when the file cannot be read.
static inline float *checkpoint_params(const char *path, size_t *count, long *steps) {
  StFile f;
  if (checkpoint_read(&f, path) != 0) return NULL;
  size_t bytes = 0;
  for (int i = 0; i < f.n_tensors; i++)
    if (!strncmp(f.tensors[i].name, "params.", 7)) bytes += f.tensors[i].bytes;
  float *p = malloc(bytes ? bytes : 1);
  size_t at = 0;
  for (int i = 0; p && i < f.n_tensors; i++)
    if (!strncmp(f.tensors[i].name, "params.", 7)) {
      memcpy((char *)p + at, f.tensors[i].data, f.tensors[i].bytes);
      at += f.tensors[i].bytes;
    }
  *count = bytes / sizeof(float);
  *steps = checkpoint_step(&f);
  st_free(&f);
  return p;
}
