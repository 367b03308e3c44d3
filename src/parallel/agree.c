#include "parallel/agree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

// The next line of *p (without its newline) into line, and the section it is in; 0 at the end.
static int next_line(const char **p, char *line, size_t cap, char *section, size_t section_cap) {
  for (;;) {
    if (!**p) return 0;
    const char *end = strchr(*p, '\n');
    size_t n = end ? (size_t)(end - *p) : strlen(*p);
    snprintf(line, cap, "%.*s", (int)(n < cap ? n : cap - 1), *p);
    *p += n + (end != NULL);
    if (line[0] == '[') {
      snprintf(section, section_cap, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
      continue;
    }
    if (line[0] && line[0] != ';' && line[0] != '#') return 1;
  }
}

// "key" of a "key = value" line into key; its value's start.
static const char *split(const char *line, char *key, size_t cap) {
  size_t n = strcspn(line, "=");
  while (n > 0 && line[n - 1] == ' ') n--;
  snprintf(key, cap, "%.*s", (int)(n < cap ? n : cap - 1), line);
  const char *eq = strchr(line, '=');
  if (!eq) return "";
  eq++;
  while (*eq == ' ') eq++;
  return eq;
}

static int is_ignored(const char *section, const char *key, const char *const *ignored) {
  char name[256];
  snprintf(name, sizeof name, "%s.%s", section, key);
  for (int i = 0; ignored && ignored[i]; i++)
    if (strcmp(name, ignored[i]) == 0) return 1;
  return 0;
}

// The first difference between rank 0's text and this rank's, written into why; 0 if none.
static int first_difference(const char *theirs, const char *mine, const char *const *ignored,
                            int rank, char *why, size_t cap) {
  const char *a = theirs, *b = mine;
  char la[1024], lb[1024], sa[128] = "", sb[128] = "", ka[256], kb[256];
  for (;;) {
    int more_a, more_b;
    do more_a = next_line(&a, la, sizeof la, sa, sizeof sa);
    while (more_a && is_ignored(sa, (split(la, ka, sizeof ka), ka), ignored));
    do more_b = next_line(&b, lb, sizeof lb, sb, sizeof sb);
    while (more_b && is_ignored(sb, (split(lb, kb, sizeof kb), kb), ignored));
    if (!more_a && !more_b) return 0;
    const char *va = more_a ? split(la, ka, sizeof ka) : "(nothing)";
    const char *vb = more_b ? split(lb, kb, sizeof kb) : "(nothing)";
    if (!more_a || !more_b || strcmp(sa, sb) != 0 || strcmp(ka, kb) != 0) {
      snprintf(why, cap,
               "ranks disagree on what their run is: rank 0 has %s.%s where rank %d has %s.%s",
               more_a ? sa : "", more_a ? ka : "(nothing)", rank, more_b ? sb : "",
               more_b ? kb : "(nothing)");
      return 1;
    }
    if (strcmp(va, vb) != 0) {
      snprintf(why, cap, "ranks disagree on %s.%s: %s on rank 0, %s on rank %d", sa, ka, va, vb,
               rank);
      return 1;
    }
  }
}

int ranks_agree(Comm *c, const char *text, const char *const *ignored) {
  if (comm_size(c) == 1 || comm_failed(c)) return comm_failed(c) ? -1 : 0;
  uint64_t length = comm_rank(c) == 0 ? strlen(text) : 0;
  comm_broadcast(c, &length, sizeof length, 0);
  if (comm_failed(c)) return -1;
  char *theirs = malloc(length + 1);
  if (!theirs)
    TL_DIE("out of memory for rank 0's run description (%llu bytes)", (unsigned long long)length);
  if (comm_rank(c) == 0) memcpy(theirs, text, length);
  theirs[length] = 0;
  comm_broadcast(c, theirs, length, 0);
  char why[2048];
  const int differs = !comm_failed(c) && comm_rank(c) != 0 &&
                      first_difference(theirs, text, ignored, comm_rank(c), why, sizeof why);
  free(theirs);
  // Every rank learns whether any differs, so the ones that agree do not go on alone.
  double count = differs;
  comm_allreduce_sum_f64(c, &count, 1);
  if (differs) comm_abort(c, why);
  // The ranks that agree stop the job too, but only after the one that differs has had time to
  // say how (an abort from here could end it before its line is written).
  if (!comm_failed(c) && count > 0) {
    nanosleep(&(struct timespec){2, 0}, NULL);
    comm_abort(c, "another rank's run differs (its message says how)");
  }
  return comm_failed(c) ? -1 : 0;
}
