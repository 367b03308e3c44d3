#include "io/dir_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

// The folders this process holds: a run's, a compare's (and the runs `tally eval` records in).
typedef struct {
  char path[PATH_MAX];  // as the caller named it: the files written there are named from it
  dev_t dev;
  ino_t ino;
} HeldFolder;

enum { MAX_HELD = 8 };
static HeldFolder held[MAX_HELD];
static int n_held;
static pthread_mutex_t held_mutex = PTHREAD_MUTEX_INITIALIZER;

// The visible mark DIR/NAME, opened relative to the locked folder without following a link:
// a dangling link would otherwise create its target wherever it points.
static int make_mark(int dir_fd, const char *dir, const char *name) {
  int fd = openat(dir_fd, name, O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP)
    return tl_fail("%s/%s: is a symbolic link, not the folder's lock file; remove it", dir, name);
  if (fd < 0) return tl_fail("%s/%s: cannot create the lock file: %s", dir, name, strerror(errno));
  struct stat st;
  int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  close(fd);
  if (!regular) return tl_fail("%s/%s: not a regular file; remove it", dir, name);
  return 0;
}

int dir_lock(const char *dir, const char *name, const char *what) {
  if (strlen(dir) >= PATH_MAX) return tl_fail("%.64s...: path too long", dir);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return tl_fail("%s: cannot open the %s's folder: %s", dir, what, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      tl_fail("%s: another %s is using this folder", dir, what);
      errno = EWOULDBLOCK;  // (a caller may wait, or leave the folder to its holder)
      return -1;
    }
    return tl_fail("%s: cannot lock the folder: %s", dir, strerror(err));
  }
  // The path may have been given another folder between open and flock.
  struct stat locked, named;
  if (fstat(fd, &locked) != 0 || stat(dir, &named) != 0 || locked.st_dev != named.st_dev ||
      locked.st_ino != named.st_ino) {
    close(fd);
    return tl_fail("%s: the folder was replaced while it was being locked", dir);
  }
  if (make_mark(fd, dir, name) != 0) {
    close(fd);
    return -1;
  }
  pthread_mutex_lock(&held_mutex);
  if (n_held < MAX_HELD) {
    HeldFolder *h = &held[n_held++];
    snprintf(h->path, sizeof h->path, "%s", dir);
    h->dev = locked.st_dev;
    h->ino = locked.st_ino;
  }
  pthread_mutex_unlock(&held_mutex);
  return 0;  // fd stays open: the lock lasts as long as the process
}

int dir_lock_check(const char *dir) {
  int rc = 0;
  pthread_mutex_lock(&held_mutex);
  for (int i = 0; i < n_held && rc == 0; i++) {
    if (strcmp(held[i].path, dir) != 0) continue;
    struct stat st;
    if (stat(dir, &st) != 0)
      rc = tl_fail("%s: the locked folder is gone (%s); nothing more is written", dir,
                   strerror(errno));
    else if (st.st_dev != held[i].dev || st.st_ino != held[i].ino)
      rc = tl_fail(
          "%s: is no longer the folder this process locked (moved or replaced); nothing "
          "more is written",
          dir);
  }
  pthread_mutex_unlock(&held_mutex);
  return rc;
}
