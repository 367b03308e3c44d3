// Reading the flat JSON objects Tally writes itself (summary.json, `tally eval --json`, an
// eval.jsonl line): a member's value by name, no nesting needed. Nested objects and arrays are
// searched as text, so a name must be unique in the object to be read this way.
#pragma once
#include <stddef.h>

// The text just after "key": (spaces skipped), or NULL when there is no such member.
const char *json_flat_value(const char *text, const char *key);
// The member's number; NaN when it is absent, null or not a number.
double json_flat_number(const char *text, const char *key);
// The member's string (without escapes) into out; "" when absent or not a string.
void json_flat_string(const char *text, const char *key, char *out, size_t n);
// The member's boolean as 1 or 0; NaN when it is absent or not a boolean.
double json_flat_bool(const char *text, const char *key);

// What a member must hold, for json_flat_require.
typedef enum { JSON_NUMBER, JSON_NUMBER_OR_NULL, JSON_STRING, JSON_BOOL } JsonType;
typedef struct {
  const char *key;
  JsonType type;
} JsonMember;

// A file Tally reads back must be the whole object it wrote, not "absent values": `text` must be
// one JSON object (first and last non-blank characters '{' and '}', braces and brackets balanced
// outside strings, nothing after it), and hold each of `members` (n of them) with its type.
// -1 with tl_last_error() naming `path` and what is wrong (a cut-off file, another kind of file,
// a missing or mistyped member), 0 when it is whole.
int json_flat_require(const char *text, const char *path, const JsonMember *members, int n);
