// The configuration engine (config_schema.c): a schema is a table of typed key rows over one
// struct; the engine sets keys from INI files, INI text and single assignments, fills defaults,
// formats values back, and writes a schema as INI or as Markdown reference tables. Tally's own
// tables, and what it does when a key is set, are config.c's.
#pragma once
#include <stdio.h>

#include "config_keys.h"

#define SCHEMA_MAX_KEYS 192  // rows a schema may have (per-file bookkeeping is sized by it)
#define SCHEMA_MAX_LIST 64   // entries an int-list key may hold

typedef struct Schema Schema;
struct Schema {
  const KeySpec *keys;
  size_t n_keys;
  // Called after a key was set from a file or an assignment (not for defaults); nonzero fails
  // the set, its error already recorded. NULL: nothing more to do.
  int (*on_set)(const KeySpec *k, void *base, const char *where);
};

// The row of [section] key, or NULL.
const KeySpec *schema_find_key(const Schema *s, const char *section, const char *key);
// Fails with "WHERE: unknown key/section ..." and the nearest known name (or the list of them).
int schema_unknown_name(const Schema *s, const char *where, const char *section, const char *key);
// Sets [section] key from its text into `base`; `where` names the input in messages.
int schema_assign(const Schema *s, void *base, const char *where, const char *section,
                  const char *key, const char *value);
// Every key's default, set by the same setters as user input.
void schema_apply_defaults(const Schema *s, void *base);
// The text a key's value reads back from (the shortest for a float).
void schema_format_value(const KeySpec *k, const void *base, char *out, size_t cap);
// A whole INI file (a regular file of at most 1 MiB), or INI text named `name` in messages.
int schema_parse_file(const Schema *s, void *base, const char *path);
int schema_parse_text(const Schema *s, void *base, const char *name, const char *text);
// Every key as INI, each line after `prefix` ("; " writes it as comments).
void schema_write(const Schema *s, const void *base, const char *prefix, FILE *out);
// One Markdown table per section; `section_note` may add a parenthesis after its heading.
typedef const char *(*SchemaSectionNote)(const Schema *s, const char *section);
void schema_write_reference(const Schema *s, SchemaSectionNote section_note, FILE *out);

// Appends " (did you mean <open>x<close>?)" for a name close to `typed`, else the list of `what`.
void schema_describe_alternatives(char *out, size_t cap, const char *typed,
                                  const char *const *names, size_t n, const char *open,
                                  const char *close, const char *what);
// strtod for decimal text only (no hexadecimal, inf or nan: for those *end == text).
double schema_strtod_decimal(const char *text, char **end);
// Strips white space from both ends, in place.
char *schema_trim(char *s);
// The longest line inih is set to read (a key and a path), set up on first use.
int schema_ini_max_line(void);
