// Ranks of one job agree before their first step on everything that defines it, or all stop.
// Each rank describes its run as INI-like text ("[section]" lines, then "key = value" lines: the
// resolved configuration and model, the objective, the step it starts from and the run's length,
// the training data's size and checksums); rank 0's text goes to every rank, which compares it
// with its own line by line. A rank that differs stops every rank (comm_abort) with the first key
// that differs and both values. Lines whose key is in `ignored` (paths that may differ from host
// to host while naming the same data) are not compared.
#pragma once
#include "parallel/comm.h"

// 0 when every rank's text equals rank 0's (but for ignored keys); -1 with every rank stopped
// otherwise (comm_failed, the failure naming the key and both values).
int ranks_agree(Comm *c, const char *text, const char *const *ignored);
