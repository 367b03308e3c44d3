// `tally compare`: trains every (objective, budget, seed) one after another, each as a child
// `tally train` in its own run folder under the compare's folder, scores each finished run with a
// child `tally eval --json`, and writes compare.json and compare.html: per objective and budget,
// each measure's mean over seeds with its 95% interval, the compute and memory it took, the
// ledger's answers, and a verdict. Every step is kept in files, so the same command run again
// after a crash, a Ctrl-C or a kill -9 skips what finished and resumes the run under way.
#pragma once
#include "compare/compare_spec.h"

// Runs the compare. Returns the exit code: 0 with compare.json and compare.html written; 1 when a
// plan, a run or an evaluation failed (one line says which and why), the code of a training
// that stopped on a NaN loss (3), 128 + the signal when interrupted (the run under way keeps its
// checkpoint; the same command continues); 2 when --out holds a compare of other settings.
int compare_run(const CompareSpec *spec);
