// Writing JSON by hand (the ledger, summaries, `--json` outputs): strings that may hold anything
// a user typed or a file system allows, such as paths, go through here.
#pragma once
#include <stdio.h>

// s as a JSON string, in quotes: quotes, backslashes and control bytes escaped.
void json_put_string(FILE *f, const char *s);
