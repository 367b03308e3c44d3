// Files that appear whole or not at all: written to a temporary name beside the target (unique to
// this process and call), flushed, fsync'ed, renamed over the target, and the folder fsync'ed, so
// a crash, a kill or a full disk at any moment leaves either the previous file or the new one.
// Every write error is reported; nothing half-written is ever left under the target's name.
#pragma once
#include <stdio.h>

typedef struct {
  FILE *f;          // write through this (stdio); errors are collected and checked at commit
  char path[4096];  // the target
  char tmp[4160];   // the temporary name
} AtomicFile;

// Opens a temporary file beside `path`. -1 with tl_last_error() naming the folder on failure.
int atomic_open(AtomicFile *a, const char *path);
// Flushes, syncs and renames into place. -1 with tl_last_error() naming the file and the reason
// (the temporary file is removed and the previous target, if any, is kept), also when the target's
// folder is one this process locked (dir_lock.h) and its path names another folder now.
int atomic_commit(AtomicFile *a);
// Gives up: closes and removes the temporary file.
void atomic_abort(AtomicFile *a);

// fsync of the folder holding `path`, so a rename into it survives a power cut.
int fsync_parent_dir(const char *path);

// Removes the temporary files a killed writer left of `names` (NULL-terminated) in `dir`:
// NAME.tmp.PID.N. Only for a folder whose lock the caller holds (dir_lock.h), so that no live
// writer owns one.
void atomic_remove_stale(const char *dir, const char *const *names);
