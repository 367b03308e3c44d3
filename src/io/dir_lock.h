// One process at a time in a folder: an exclusive lock on a file in it, held for the process's
// life (the kernel releases it however the process ends) and not inherited by child processes.
#pragma once

// Locks DIR/NAME (created if missing). -1 with tl_last_error() set when it cannot be created or
// another process holds it ("DIR: another WHAT is using this folder").
int dir_lock(const char *dir, const char *name, const char *what);
