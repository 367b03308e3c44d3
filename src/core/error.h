// Recoverable errors: a function that fails on bad input records one line saying what and where
// (file, line, path, step) and returns -1; the caller decides whether to print it and exit.
#pragma once

#if defined(__GNUC__)
#define TL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TL_PRINTF(a, b)
#endif

// Record the message for this thread; always returns -1 so callers can `return tl_fail(...)`.
int tl_fail(const char *fmt, ...) TL_PRINTF(1, 2);
const char *tl_last_error(void);

// Bad input found where it cannot be returned (deep in model construction, from a thread):
// prints the recorded message as a user error and exits 1 — every replica stops with the process,
// and under MPI the launcher stops the other ranks.
_Noreturn void tl_fatal_input(const char *fmt, ...) TL_PRINTF(1, 2);

// Unrecoverable programming or library errors: print with location and abort the process.
_Noreturn void tl_die(const char *file, int line, const char *fmt, ...) TL_PRINTF(3, 4);
#define TL_DIE(...) tl_die(__FILE__, __LINE__, __VA_ARGS__)
#define TL_ASSERT(cond)                                 \
  do {                                                  \
    if (!(cond)) TL_DIE("assertion failed: %s", #cond); \
  } while (0)
