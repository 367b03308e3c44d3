// libFuzzer harness: what `tally report` and --resume read from run folders: ledger lines
// (ledger_read_json), whole run folders into an HTML page (report_write), and the ledger cut back
// to a checkpoint's step after checking it is the checkpoint's own (ledger_truncate_for_resume).
// Input: LEDGER.JSONL \0 EVAL.JSONL \0 SUMMARY.JSON \0 SECOND RUN'S LEDGER.JSONL; a part that is
// not there is a file that is not there, and a second ledger makes a two-run report.
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz_util.h"
#include "ledger/record.h"
#include "ledger/report.h"
#include "objectives/objective.h"

// Writes `text` to scratch/run/file, or removes that file when text is NULL.
static void put(const char *run, const char *file, const char *text, size_t len) {
  char rel[64], path[600];
  snprintf(rel, sizeof rel, "%s/%s", run, file);
  fuzz_path(path, sizeof path, rel);
  if (text)
    fuzz_write(path, text, len);
  else
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *parts[4];
  size_t lens[4];
  int n = fuzz_split(data, size, 4, parts, lens);

  for (char *line = parts[0], *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next = '\0';
    LedgerRecord r;
    memset(&r, 0, sizeof r);
    ledger_read_json(line, &r, objective_ledger_fields);
    if (next) *next++ = '\n';
  }

  put("run1", "ledger.jsonl", parts[0], lens[0]);
  put("run1", "eval.jsonl", n > 1 ? parts[1] : NULL, n > 1 ? lens[1] : 0);
  put("run1", "summary.json", n > 2 ? parts[2] : NULL, n > 2 ? lens[2] : 0);
  put("run2", "ledger.jsonl", n > 3 ? parts[3] : NULL, n > 3 ? lens[3] : 0);
  char run1[600], run2[600], out[600];
  fuzz_path(run1, sizeof run1, "run1");
  fuzz_path(run2, sizeof run2, "run2");
  fuzz_path(out, sizeof out, "report.html");
  const char *runs[] = {run1, run2};
  report_write(n > 3 ? 2 : 1, runs, out, objective_ledger_fields);

  // The ledger's tie to a checkpoint: the record of step 1 is the one the checkpoint saw when it
  // is the ledger's first line (a match), else it is missing or another (a refusal); -1 none.
  const char *first_end = parts[0] ? memchr(parts[0], '\n', lens[0]) : NULL;
  unsigned long first_crc =
      first_end ? crc32(0L, (const Bytef *)parts[0], (uInt)(first_end - parts[0] + 1)) : 0;
  const LedgerResume how = {.steps_done = 2,
                            .last_step = size % 2 ? 1 : -1,
                            .last_crc = first_crc,
                            .csv_crc = -1,
                            .eval_bytes = -1};
  LedgerKept kept;
  ledger_truncate_for_resume(run1, &how, &kept);
  fuzz_free_parts(parts, n);
  return 0;
}
