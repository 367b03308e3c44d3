#include "run/run_state.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "io/regular_file.h"
#include "encoder/features.h"

// One evaluation's console line: kNN top-1 (labeled data), the probe, the label-free quality.
static void print_eval(const char *what, KnnResult r) {
  if (isfinite(r.top1))
    printf("kNN top-1 %-26s %.4f (k=%d; k=20: %.4f)", what, r.top1, r.knn_k, r.top1_k20);
  else
    printf("label-free quality %-17s", what);
  if (isfinite(r.linear_top1)) printf("  linear probe %.4f", r.linear_top1);
  if (isfinite(r.quality.rankme))
    printf("  rankme %.1f  embedding_std %.4f (1/sqrt(d) %.4f)", r.quality.rankme,
           r.quality.embedding_std, r.quality.embedding_std_reference);
  printf("  [%.1f s]\n", r.seconds);
  fflush(stdout);
}

// Appends one evaluation to eval.jsonl (knn_result_write_line), its bytes counted into the
// CRC-32 the next checkpoint keeps. Returns -1 with tl_last_error() when the line could not be
// written whole.
static int record_eval(Run *run, const char *what, long step, KnnResult r) {
  FILE *f = regular_fopen(run->path_eval, "a");
  if (!f) return -1;
  char *line = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&line, &len);
  if (!m) TL_DIE("out of memory");
  knn_result_write_line(m, step, what, NULL, &r);
  fclose(m);
  fwrite(line, 1, len, f);
  run->eval_bytes += (long long)len;
  run->eval_crc = crc32(run->eval_crc, (const Bytef *)line, (uInt)len);
  free(line);
  int ok = fflush(f) == 0 && !ferror(f);
  int err = errno;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : tl_fail("%s: cannot write: %s", run->path_eval, strerror(err ? err : EIO));
}

// One warning line when the embeddings collapse (at the first evaluation that finds them so, and
// again only if they recover and collapse anew), on stderr so a quiet run shows it too.
static void warn_at_collapse(Run *run, int step, const EmbeddingQuality *q) {
  const int collapsed = embedding_quality_collapsed(q);
  if (collapsed && !run->collapsed)
    fprintf(stderr,
            "tally: warning: step %d: the embeddings have collapsed: embedding_std %.2g is %.1f%% "
            "of 1/sqrt(d) = %.4f (collapse: below %.0f%%), rankme %.2f\n",
            step, q->embedding_std, 100 * q->embedding_std / q->embedding_std_reference,
            q->embedding_std_reference, 100 * QUALITY_COLLAPSED_FRACTION, q->rankme);
  run->collapsed = collapsed;
}

// Rank 0's evaluation; the other replicas wait at the barrier that follows. 1 when a stop
// signal cut it short (nothing recorded).
int run_evaluate(Run *run, KnnMonitor *mon, int step) {
  // Encoding the memory bank takes a while: say so before it starts.
  if (!run->opt->quiet) {
    if (mon->labeled)
      printf(
          "kNN monitor: encoding %d training and %d test images, and %d for the label-free "
          "quality...\n",
          mon->n_train, mon->n_test, mon->n_quality);
    else
      printf("quality monitor: encoding %d training images...\n", mon->n_quality);
    fflush(stdout);
  }
  KnnResult r = knn_monitor_run(mon);
  if (r.failed) return tl_fail("%s monitor: %s", mon->labeled ? "kNN" : "quality", tl_last_error());
  if (r.cancelled) return 1;
  char what[64];
  snprintf(what, sizeof what, "after step %d:", step);
  print_eval(what, r);
  warn_at_collapse(run, step, &r.quality);
  run->last_eval = r;
  run->evaluated = 1;
  return record_eval(run, "encoder", step, r);
}

// Rank 0's monitor: with labels, the raw-pixel baseline; the untrained encoder when asked.
int run_open_monitor(ReplicaState *r) {
  Run *run = r->run;
  r->use_monitor = !run->opt->no_knn;
  if (!r->use_monitor) return 0;
  const MonitorSettings set = replica_monitor_settings(r->cfg);
  knn_monitor_init(&r->mon, &set, run->bank, run->no_knn ? NULL : &run->test, &run->aug,
                   r->rep.ps.data);
  r->mon.cancel = &run_stop_signal;
  if (r->mon.labeled) {
    if (!run->opt->quiet) {
      printf("kNN monitor: raw-pixel baseline on %d training and %d test images...\n",
             r->mon.n_train, r->mon.n_test);
      fflush(stdout);
    }
    run->knn_raw = knn_monitor_raw_pixels(&r->mon);
    if (run->knn_raw.failed) return tl_fail("kNN monitor: %s", tl_last_error());
    print_eval("raw pixels (baseline):", run->knn_raw);
    if (record_eval(run, "raw_pixels", 0, run->knn_raw) != 0) return -1;
  }
  if (run->opt->knn_at_start && run->start_step == 0) {
    if (!run->opt->quiet) printf("monitor: encoding with the untrained encoder...\n");
    run->knn_start = knn_monitor_run(&r->mon);
    if (run->knn_start.failed) return tl_fail("monitor: %s", tl_last_error());
    run->knn_start_done = 1;
    print_eval("untrained encoder:", run->knn_start);
    warn_at_collapse(run, 0, &run->knn_start.quality);
    return record_eval(run, "encoder", 0, run->knn_start);
  }
  return 0;
}

// The monitor's labeled sets: [eval] train (its memory bank and quality sample) and test when
// given, for labeled and unlabeled training data alike, read by rank 0 alone (the only one that
// evaluates); else [data] test beside the training set, when that is labeled. Unlabeled training
// data without a set of the monitor's own has nothing to vote with (run->no_knn): the monitor
// measures the label-free quality only. -1 with tl_last_error().
int run_load_monitor_data(Run *run) {
  const Config *cfg = run->cfg;
  run->bank = &run->train;
  if (cfg->eval.train[0]) {
    run->bank = &run->eval_train;
    if (run->quiet_rank) return 0;
    if (dataset_load_path(cfg, &run->eval_train, cfg->eval.train, 0, 0) != 0 ||
        dataset_load_path(cfg, &run->test, cfg->eval.test, 0, 0) != 0)
      return -1;
    const char *unlabeled = !run->eval_train.n_classes ? cfg->eval.train
                            : !run->test.n_classes     ? cfg->eval.test
                                                       : NULL;
    if (unlabeled)
      return tl_fail(
          "%s: no class subfolders; the monitor's own set ([eval] train, test) is "
          "there to be labeled",
          unlabeled);
    return dataset_align_test_labels(&run->eval_train, &run->test, cfg->eval.test);
  }
  if (strcmp(cfg->data.labels, "none") == 0) {
    if (!run->quiet_rank)
      printf(
          "kNN monitor off: data.labels = none; each evaluation measures the label-free quality "
          "(rankme, embedding_std) only (give the monitor a labeled set of its own with "
          "eval.train and eval.test, or score the encoder with `tally eval RUN --set "
          "eval.train=LABELED --set eval.test=LABELED`)\n");
    run->no_knn = 1;
    return 0;
  }
  if (!cfg->data.test[0])
    return tl_fail(
        "the kNN monitor scores the encoder on a labeled test set, and data.test is empty: give "
        "--set data.test=PATH (labeled as %s is), or --no-knn",
        cfg->data.train);
  const int ch = cfg->data.channels;
  if ((strcmp(cfg->data.format, "idx") == 0
           ? dataset_load_idx(&run->test, cfg->data.test, ch, cfg->data.test_limit)
           : dataset_load_imagefolder(&run->test, cfg->data.test, cfg->data.image_size, ch,
                                      cfg->data.test_limit, cfg->data.stream)) != 0)
    return -1;
  return dataset_align_test_labels(&run->train, &run->test, cfg->data.test);
}
