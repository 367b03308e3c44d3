#include "run/run_state.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/dir_lock.h"
#include "io/regular_file.h"
#include "train/checkpoint.h"

// mkdir -p. The reason given is the first folder's that could not be made (a read-only file
// system, not the "No such file" its missing child then gets).
static int make_dirs(const char *dir) {
  // Room for the longest name written inside it, a temporary checkpoint's.
  char path[4096];
  if (strlen(dir) + 64 > sizeof path)
    return tl_fail("%.64s...: a run folder's path of %zu bytes is too long (at most %zu)", dir,
                   strlen(dir), sizeof path - 64);
  snprintf(path, sizeof path, "%s", dir);
  // Every name checked before any folder is made: a long one half way would leave the folders
  // before it behind.
  for (const char *c = path; *c;) {
    size_t n = strcspn(c, "/");
    if (n > NAME_MAX)
      return tl_fail("%s: a folder name of %zu bytes is longer than the file system's %d", dir, n,
                     NAME_MAX);
    c += n + (c[n] == '/');
  }
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p) continue;
    char c = *p;
    *p = 0;
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return tl_fail("%s: cannot create run folder%s%s: %s", dir, c ? " " : "", c ? path : "",
                     strerror(errno));
    if (!c) return 0;
    *p = c;
  }
}

int run_folder_has(const char *dir, const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

// Creates and locks the run folder. A folder that holds a run is refused unless the run is
// being resumed or --overwrite says to replace it.
int run_make_folder(const char *dir, Run *run) {
  if (make_dirs(dir) != 0 || dir_lock(dir, ".lock", "run") != 0) return -1;
  atomic_remove_stale(dir, RUN_STATE_FILES);
  int resuming = run->opt->resume_path != NULL;
  if (!resuming && !run->opt->overwrite &&
      (run_folder_has(dir, CHECKPOINT_FILE) || run_folder_has(dir, "ledger.jsonl") ||
       run_folder_has(dir, "summary.json")))
    return tl_fail(
        "%s: holds a run already; continue it with --resume %s, or replace it with "
        "--overwrite",
        dir, dir);
  snprintf(run->path_jsonl, sizeof run->path_jsonl, "%s/ledger.jsonl", dir);
  snprintf(run->path_csv, sizeof run->path_csv, "%s/ledger.csv", dir);
  snprintf(run->path_ckpt, sizeof run->path_ckpt, "%s/%s", dir, CHECKPOINT_FILE);
  snprintf(run->path_summary, sizeof run->path_summary, "%s/summary.json", dir);
  snprintf(run->path_eval, sizeof run->path_eval, "%s/eval.jsonl", dir);
  // A previous summary would look like this run's result if this run fails; a new run starts
  // from none of the old run's files.
  const char *const remove_fresh[] = {run->path_summary, run->path_eval, run->path_ckpt,
                                      run->path_jsonl, run->path_csv};
  for (int i = 0; i < (resuming ? 1 : 5); i++)
    if (unlink(remove_fresh[i]) != 0 && errno != ENOENT)
      return tl_fail("%s: cannot remove: %s", remove_fresh[i], strerror(errno));
  // A run resumed at its last step without its summary evaluates that step again (trainer.c).
  const LedgerResume how = {.steps_done = run->start_step,
                            .last_step = run->ledger_last_step,
                            .last_crc = run->ledger_last_crc,
                            .csv_crc = run->opt->ledger_csv_crc,
                            .eval_bytes = run->opt->eval_bytes,
                            .eval_crc = run->opt->eval_crc,
                            .evaluate_again = run->finishing && !run->opt->no_knn};
  LedgerKept kept = {0};
  if (resuming && ledger_truncate_for_resume(dir, &how, &kept) != 0) return -1;
  run->ledger_csv_crc = kept.csv_crc;
  run->eval_bytes = kept.eval_bytes;
  run->eval_crc = kept.eval_crc;
  char path[4200];
  snprintf(path, sizeof path, "%s/config.ini", dir);
  AtomicFile a;
  if (atomic_open(&a, path) != 0) return -1;
  fputs(run->config_text, a.f);
  return atomic_commit(&a);
}

// The configuration as INI texts: config.ini's content and the model section, both kept in
// every checkpoint.
void run_config_texts(Run *run) {
  size_t n;
  FILE *f = open_memstream(&run->config_text, &n);
  if (!f) TL_DIE("out of memory");
  config_write(run->cfg, f);
  fclose(f);
  f = open_memstream(&run->model_text, &n);
  if (!f) TL_DIE("out of memory");
  config_write_model(run->cfg, f);
  fclose(f);
}

void run_default_folder(const char *objective, char *out, size_t cap) {
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  snprintf(out, cap, "runs/%s-%s", objective, stamp);
}
