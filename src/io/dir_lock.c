#include "io/dir_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/error.h"

int dir_lock(const char *dir, const char *name, const char *what) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return tl_fail("%s: cannot create the %s's lock: %s", path, what, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return tl_fail("%s: another %s is using this folder", dir, what);
  }
  return 0;  // fd stays open: the lock lasts as long as the process
}
