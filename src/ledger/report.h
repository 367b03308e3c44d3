// `tally report`: one self-contained HTML page from run folders (ledger.jsonl, eval.jsonl,
// summary.json, config.ini): loss, kNN accuracy, images/s and memory by category over the steps,
// drawn as inline SVG (no network, no scripts, no fonts to fetch), and with several runs a
// side-by-side table of what one step of each objective costs.
#pragma once
#include "ledger/record.h"

// Returns 0, or -1 with tl_last_error() set (a run folder without a readable ledger.jsonl, an
// output file that cannot be written).
// `lookup` tells the objectives' own ledger fields (objective_ledger_fields; NULL: none read).
int report_write(int n_runs, const char *const *run_dirs, const char *out_path,
                 LedgerOwnLookup lookup);
