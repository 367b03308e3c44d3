#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Long enough for two paths of PATH_MAX and the words around them.
enum { ERROR_BYTES = 16384 };

static _Thread_local char last_error[ERROR_BYTES];

// Bytes of the UTF-8 sequence at s that a terminal shows as text, or 0: a control character
// (C0, DEL or C1), or bytes that are not well-formed UTF-8.
static size_t printable_bytes(const unsigned char *s) {
  if (*s >= 0x20 && *s < 0x7f) return 1;
  size_t n = *s < 0xc2 ? 0 : *s < 0xe0 ? 2 : *s < 0xf0 ? 3 : *s < 0xf5 ? 4 : 0;
  if (n == 0) return 0;
  unsigned long cp = *s & (0x7f >> n);
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  static const unsigned long least[] = {0, 0, 0xa0, 0x800, 0x10000};  // no overlong forms, no C1
  if (cp < least[n] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return 0;
  return n;
}

// Messages quote file names and file contents (an INI value, an image path): control bytes in
// them are written as \xNN, so a message is one line and cannot drive the terminal it is printed
// on (colours, cursor moves, a rewritten title). A message longer than the buffer ends in "...".
static void sanitize(const char *text, int text_len, char *out, size_t cap) {
  static const char more[] = "...";
  const unsigned char *s = (const unsigned char *)text;
  size_t used = 0, room = cap - sizeof more;  // what may be used while "..." still fits after
  int cut = text_len < 0 || (size_t)text_len >= ERROR_BYTES;
  for (; *s; s++) {
    size_t n = printable_bytes(s);
    if (used + (n ? n : 4) > room) {
      cut = 1;
      break;
    }
    if (n) {
      memcpy(out + used, s, n);
      used += n;
      s += n - 1;
    } else {
      used += (size_t)snprintf(out + used, cap - used, "\\x%02x", *s);
    }
  }
  if (cut) memcpy(out + used, more, sizeof more - 1), used += sizeof more - 1;
  out[used] = 0;
}

// Formats into a buffer of its own first, so arguments may point into last_error (a caller
// adding context to the previous error).
static void format_sanitized(char *out, size_t cap, const char *fmt, va_list ap) {
  char raw[ERROR_BYTES];
  int len = vsnprintf(raw, sizeof raw, fmt, ap);
  if (len < 0) raw[0] = 0;
  sanitize(raw, len, out, cap);
}

int tl_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  format_sanitized(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

const char *tl_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

void tl_die(const char *file, int line, const char *fmt, ...) {
  char message[ERROR_BYTES];
  va_list ap;
  va_start(ap, fmt);
  format_sanitized(message, sizeof message, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tally: internal error at %s:%d: %s\n", file, line, message);
  exit(70);
}

void tl_fatal_input(const char *fmt, ...) {
  char message[ERROR_BYTES];
  va_list ap;
  va_start(ap, fmt);
  format_sanitized(message, sizeof message, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tally: %s\n", message);
  fflush(stderr);
  // _exit: other replica threads may be failing at the same moment, and two exit() calls at once
  // race through the atexit handlers (one ended as an internal error).
  _exit(1);
}
