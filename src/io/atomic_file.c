#include "io/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/dir_lock.h"

// The folder part of `path` as it was written ("." when it has none).
static void parent_of(const char *path, char *dir, size_t cap) {
  snprintf(dir, cap, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, cap, ".");
  else if (slash == dir)
    dir[1] = 0;
  else
    *slash = 0;
}

int fsync_parent_dir(const char *path) {
  char dir[4096];
  parent_of(path, dir, sizeof dir);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

int atomic_open(AtomicFile *a, const char *path) {
  // Unique per process and per call: two writers (threads, or a second run that got past the
  // folder lock by mistake) never share a temporary file.
  static atomic_uint counter;
  memset(a, 0, sizeof *a);
  // The rename would replace the node itself: a device such as /dev/null, or a FIFO, would become
  // this file.
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return tl_fail("%s: not a regular file; write to a new path or a regular file", path);
  snprintf(a->path, sizeof a->path, "%s", path);
  snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
           atomic_fetch_add(&counter, 1));
  a->f = fopen(a->tmp, "wbx");
  if (!a->f) return tl_fail("%s: cannot write: %s", path, strerror(errno));
  return 0;
}

int atomic_commit(AtomicFile *a) {
  int ok = fflush(a->f) == 0 && !ferror(a->f);
  int err = errno;
  if (ok && fsync(fileno(a->f)) != 0) ok = 0, err = errno;
  if (fclose(a->f) != 0 && ok) ok = 0, err = errno;
  a->f = NULL;
  // A folder this process locked that was moved or replaced since belongs to no one, or to
  // another process: its files are not replaced.
  char dir[4096];
  parent_of(a->path, dir, sizeof dir);
  if (ok && dir_lock_check(dir) != 0) {
    unlink(a->tmp);
    return -1;
  }
  if (ok && rename(a->tmp, a->path) != 0) ok = 0, err = errno;
  if (!ok) {
    unlink(a->tmp);
    return tl_fail("%s: not written (%s); any previous file is kept", a->path,
                   strerror(err ? err : EIO));
  }
  fsync_parent_dir(a->path);
  return 0;
}

void atomic_abort(AtomicFile *a) {
  if (a->f) fclose(a->f);
  a->f = NULL;
  unlink(a->tmp);
}

void atomic_remove_stale(const char *dir, const char *const *names) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));)
    for (int i = 0; names[i]; i++) {
      size_t n = strlen(names[i]);
      if (strncmp(e->d_name, names[i], n) == 0 && strncmp(e->d_name + n, ".tmp.", 5) == 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
      }
    }
  closedir(d);
}
