#include "io/regular_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

const char *const RUN_STATE_FILES[] = {
    ".lock",        "config.ini",        "checkpoint.safetensors",
    "ledger.jsonl", "ledger.csv",        "eval.jsonl",
    "summary.json", "compare-eval.json", NULL};

const char *const COMPARE_STATE_FILES[] = {".compare.lock", "compare.settings", "compare.json",
                                           "compare.html", NULL};

static int listed(const char *name, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (strcmp(name, names[i]) == 0) return 1;
  return 0;
}

// 1 when `path` names one of a run folder's or a compare folder's own files.
static int is_run_state_name(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  return listed(name, RUN_STATE_FILES) || listed(name, COMPARE_STATE_FILES);
}

int regular_open(const char *path, int append, int64_t *bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, and for writing
  // for a reader, before fstat could say what it is.
  int flags = append ? O_WRONLY | O_APPEND | O_CREAT : O_RDONLY;
  // A run writes its own files and never as links: a link there was put by someone else, and
  // following it would read (or, with O_CREAT, create) a file outside the folder.
  const int run_file = is_run_state_name(path);
  if (run_file) flags |= O_NOFOLLOW;
  int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      tl_fail("%s: no such file", path);
    else if (err == ELOOP && run_file)
      tl_fail(
          "%s: is a symbolic link; a run folder's or a compare folder's own files are never "
          "followed",
          path);
    else
      tl_fail("%s: cannot open: %s", path, strerror(err));
    errno = err;
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    tl_fail("%s: not a regular file", path);
    errno = EINVAL;
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (bytes) *bytes = st.st_size;
  return fd;
}

FILE *regular_fopen(const char *path, const char *mode) {
  int append = mode[0] == 'a';
  int fd = regular_open(path, append, NULL);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, append ? "a" : "r");
  if (!f) {
    int err = errno;
    close(fd);
    tl_fail("%s: cannot open: %s", path, strerror(err));
    errno = err;
  }
  return f;
}

int regular_read_text(const char *path, char **text, size_t *len_out) {
  *text = NULL;
  int64_t bytes;
  int fd = regular_open(path, 0, &bytes);
  if (fd < 0) return errno == ENOENT ? 1 : -1;
  size_t len = 0, size = (size_t)bytes;
  char *buf = malloc(size + 1);
  if (!buf) TL_DIE("out of memory reading %s (%zu bytes)", path, size);
  ssize_t got = 1;
  while (len < size && (got = read(fd, buf + len, size - len)) > 0) len += (size_t)got;
  int read_errno = errno;
  close(fd);
  if (got < 0) {
    free(buf);
    return tl_fail("%s: cannot read: %s", path, strerror(read_errno));
  }
  buf[len] = 0;
  *text = buf;
  if (len_out) *len_out = len;
  return 0;
}

// 1 when `dir` holds a run (its lock or its checkpoint) or, with `compare`, a compare (its lock
// or its settings).
static int holds(const char *dir, int compare) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, compare ? ".compare.lock" : ".lock");
  if (access(path, F_OK) == 0) return 1;
  snprintf(path, sizeof path, "%s/%s", dir,
           compare ? "compare.settings" : "checkpoint.safetensors");
  return access(path, F_OK) == 0;
}

int output_path_check(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT) return 0;  // a new file (a missing folder is reported when writing)
    return tl_fail("%s: cannot write there: %s", path, strerror(errno));
  }
  // The rename that puts the output in place would replace the node itself: a device such as
  // /dev/null would become a regular file.
  if (!S_ISREG(st.st_mode))
    return tl_fail("%s: not a regular file; write the output to a new path or a regular file",
                   path);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  const char *name = slash ? slash + 1 : path;
  if (slash)
    slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
  else
    snprintf(dir, sizeof dir, ".");
  if (listed(name, RUN_STATE_FILES) && holds(dir, 0))
    return tl_fail("%s: is the run's own %s; write the output elsewhere", path, name);
  if (listed(name, COMPARE_STATE_FILES) && holds(dir, 1))
    return tl_fail("%s: is the compare's own %s; write the output elsewhere", path, name);
  return 0;
}
