// Files Tally reads or writes by name, whoever named them (a user, a copied run folder, a link):
// only regular files, opened without blocking (a FIFO would wait for a writer forever, a device
// such as /dev/zero or /dev/full never ends), and outputs that never replace a device node or a
// run's own state.
#pragma once
#include <stdint.h>
#include <stdio.h>

// The files of a run folder that belong to its run (docs/reference.md, "Commands and run folders"):
// written only by the run, eval.jsonl also by `tally eval RUN` under the folder's lock, and
// compare-eval.json by the compare whose run it is. NULL-terminated.
extern const char *const RUN_STATE_FILES[];
// A compare folder's own files (`tally compare`), written only by the compare under its lock.
extern const char *const COMPARE_STATE_FILES[];

// Opens `path` for reading (or, with `append`, for appending, created when missing) if it is a
// regular file. Returns a file descriptor in blocking mode, or -1 with errno set (ENOENT when it
// does not exist, EINVAL when it is not a regular file) and tl_last_error() naming the path.
// *bytes (may be NULL) receives its size. A path named as one of RUN_STATE_FILES or
// COMPARE_STATE_FILES is not followed when it is a symbolic link (ELOOP).
int regular_open(const char *path, int append, int64_t *bytes);

// The same as a stdio stream: mode "r" or "a".
FILE *regular_fopen(const char *path, const char *mode);

// The whole of the regular file `path` as a NUL-terminated string at *text (malloc'ed; its length
// in *len, which may be NULL): 0, or 1 when there is no such file, or -1 (error set) when it
// cannot be read. A file still growing (a live run's) is read up to the size fstat gave.
int regular_read_text(const char *path, char **text, size_t *len);

// A path a command may write its output to (atomically, by rename): a new path, or an existing
// regular file that is not one of a run folder's (or a compare folder's) own state files. -1 with
// tl_last_error() saying why not.
int output_path_check(const char *path);
