// One process at a time in a folder: an exclusive lock on the folder itself (flock on a
// descriptor of the directory), held for the process's life (the kernel releases it however the
// process ends) and not inherited by child processes. A lock on a file in the folder would be a
// name only: removing the file (a cleaner deleting an old empty dotfile) lets a second process
// lock a new file of the same name while the first still writes.
#pragma once

// Locks the folder DIR and leaves DIR/NAME as its visible mark (created if missing; a symbolic
// link or anything but a regular file there is refused, never followed). -1 with tl_last_error()
// set when it cannot be locked, or another process holds it ("DIR: another WHAT is using this
// folder", errno EWOULDBLOCK).
int dir_lock(const char *dir, const char *name, const char *what);

// Before a file of a folder this process locked is replaced: 0 while the path `dir` still names
// the folder that was locked, -1 with tl_last_error() when it was moved or replaced (another
// process may hold the new one). 0 for a folder this process did not lock.
int dir_lock_check(const char *dir);
