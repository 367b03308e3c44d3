// `tally report`: one self-contained HTML page from run folders (ledger.jsonl, eval.jsonl,
// summary.json, config.ini), drawn as inline SVG (no network, no scripts, no fonts to fetch): a
// card per run and the configuration keys that differ between them; the encoder's quality;
// loss per objective against steps, compute and time; throughput and learning rate; planned
// beside measured peak memory; and a side-by-side table of what one step of each run costs,
// under the ledger's four questions.
#pragma once
#include "ledger/record.h"

// Returns 0, or -1 with tl_last_error() set (a run folder without a readable ledger.jsonl, an
// output file that cannot be written).
// `lookup` tells the objectives' own ledger fields (objective_ledger_fields; NULL: none read).
int report_write(int n_runs, const char *const *run_dirs, const char *out_path,
                 LedgerOwnLookup lookup);

// Where a report goes unless told: report.html in the (first) run folder.
void report_default_path(const char *run_dir, char *out, size_t cap);
