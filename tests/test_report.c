// `tally report` from run folders written here (ledger.jsonl through the ledger's own writer,
// eval.jsonl, summary.json and config.ini by hand) and from a real run: the page must be
// self-contained (no scripts, no fetched resources), and once a real browser (headless Chromium)
// has parsed it, its DOM must hold the charts (loss per objective against steps, compute and
// time, kNN accuracy, planned beside measured memory as bars in proportion to their bytes) with
// tick labels in readable units, the configuration keys that differ, and the cost table under
// the ledger's questions with the numbers written into the ledgers.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ledger/record.h"

// Makes the run folder tmpdir/NAME and opens its ledger.jsonl for writing.
static FILE *new_ledger(const char *name) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/%s/ledger.jsonl", tmpdir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  return f;
}

// moco's own fields as its declaration in src/objectives/moco.c names them (the report reads
// them through that declaration): the age of the queue's oldest key answers "what is cached".
static const LedgerOwnFields moco_queue_age = {
    1, {{"queue_oldest_age_steps", LEDGER_CACHED, UNIT_STEPS, 0}}};

// A run of `steps` records: B samples, objective-like counts, a falling loss, memory growing
// by category, `flops_per_step` of training compute and 700 + 10 s ms a step; evaluations after
// a third, two thirds and all of the steps; a summary with the planned and measured peaks.
static void write_run(const char *name, const char *objective, int B, int views_grad, int negatives,
                      int steps, double flops_per_step, double planned_peak) {
  char path[600];
  FILE *f = new_ledger(name);
  double seconds = 0;
  for (int s = 0; s < steps; s++) {
    LedgerRecord r = {0};
    r.step = s;
    r.objective = objective;
    r.replicas = 1;
    r.loss = 5.0 - 0.1 * s;
    r.images_source = B;
    r.views_grad = views_grad;
    r.views_nograd = 2 * B - views_grad;
    r.negatives_per_query = negatives;
    r.activation_bytes = (size_t)views_grad << 20;
    r.param_bytes = 1 << 20;
    r.grad_bytes = 1 << 20;
    r.workspace_bytes = (size_t)(4 + s) << 20;
    r.data_bytes = 50 << 20;
    r.eval_bytes = 600 << 20;
    r.queue_bytes = strcmp(objective, "moco") == 0 ? 4096 * 128 * 4 : 0;
    r.flops_forward = flops_per_step / 3;
    r.flops_backward = flops_per_step * 2 / 3;
    r.flops_total = flops_per_step * (s + 1);
    r.step_ms = 700 + 10 * s;
    seconds += r.step_ms / 1e3;
    r.train_seconds = seconds;
    r.images_per_s = B / (r.step_ms / 1e3);
    if (strcmp(objective, "moco") == 0) {
      r.own_fields = &moco_queue_age;
      r.own[0] = s;
    }
    ledger_write_json(f, &r);
  }
  fclose(f);
  snprintf(path, sizeof path, "%s/%s/eval.jsonl", tmpdir, name);
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"step\":0,\"what\":\"raw_pixels\",\"knn_top1\":0.8178,\"knn_top1_k20\":0.85,"
          "\"seconds\":1}\n");
  for (int e = 1; e <= 3; e++)
    fprintf(f,
            "{\"step\":%d,\"what\":\"encoder\",\"knn_top1\":%.4f,\"knn_top1_k20\":0.7,"
            "\"seconds\":1}\n",
            e * steps / 3, 0.6 + 0.05 * e);
  fclose(f);
  snprintf(path, sizeof path, "%s/%s/summary.json", tmpdir, name);
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\n  \"objective\": \"%s\",\n  \"backbone\": \"resnet\",\n  \"batch_size\": %d,\n"
          "  \"peak_rss_bytes\": 1000000000,\n  \"planned_peak_bytes\": %.0f,\n"
          "  \"knn_top1\": 0.75\n}\n",
          objective, B, planned_peak);
  fclose(f);
}

// config.ini as `tally train` writes it, the recipe's and the model file's keys (the latter as
// comments), with the given learning rate, moco queue and model widths.
static void write_config(const char *name, const char *labels, const char *lr, int queue,
                         const char *stage_channels) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s/config.ini", tmpdir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "; Tally configuration as resolved: every key, defaults included.\n"
          "; Recipe: configs/smoke.ini\n\n"
          "[data]\ndataset = stripes\nformat = imagefolder\ntrain = data/samples/stripes\n"
          "image_size = 16\nchannels = 1\nlabels = %s\n\n"
          "[model]\nfile = models/resnet-small.ini\n\n"
          "[train]\nbatch_size = 32\nsteps = 12\nseed = 0\nbudget =\n\n"
          "[optim]\nname = sgd\nlr = %s\nlr_batch = 0\nschedule = cosine\nwarmup_steps = 0\n\n"
          "[moco]\nqueue_size = %d\n\n"
          "; Model file models/resnet-small.ini, as read:\n; [backbone]\n; type = resnet\n"
          "; stage_channels = %s\n",
          labels, lr, queue, stage_channels);
  fclose(f);
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

static char report[600];

static int setup(void **state) {
  (void)state;
  // The same training compute in all, 3.42e11 FLOPs: inbatch in 6 steps of twice moco's.
  write_run("inbatch-run", "inbatch", 32, 64, 62, 6, 5.7e10, 1.2e9);
  write_run("moco-run", "moco", 32, 32, 4096, 12, 2.85e10, 8e8);
  write_config("inbatch-run", "classes", "0.3", 4096, "32,64,128");
  write_config("moco-run", "classes", "0.06", 64, "64,128,256");
  snprintf(report, sizeof report, "%s/report.html", tmpdir);
  return sh("%s report %s/inbatch-run %s/moco-run --out %s > /dev/null", bin, tmpdir, tmpdir,
            report);
}

static void test_self_contained(void **state) {
  (void)state;
  char *html = read_all(report);
  assert_non_null(strstr(html, "<!DOCTYPE html>"));
  // Nothing to fetch or run: no scripts, no external references (the SVG namespace is a name).
  assert_null(strstr(html, "<script"));
  assert_null(strstr(html, "src="));
  assert_null(strstr(html, "href="));
  assert_null(strstr(html, "url("));
  assert_null(strstr(html, "@import"));
  assert_null(strstr(html, "https:"));
  assert_int_equal(count(html, "http:"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  free(html);
}

static void test_default_output_and_errors(void **state) {
  (void)state;
  assert_int_equal(sh("%s report %s/moco-run > /dev/null", bin, tmpdir), 0);
  char path[700];
  snprintf(path, sizeof path, "%s/moco-run/report.html", tmpdir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  // A folder without a ledger is an error naming it.
  assert_int_equal(sh("mkdir -p %s/empty", tmpdir), 0);
  assert_int_not_equal(sh("%s report %s/empty > %s/err.txt 2>&1", bin, tmpdir, tmpdir), 0);
  snprintf(path, sizeof path, "%s/err.txt", tmpdir);
  char *err = read_all(path);
  assert_non_null(strstr(err, "empty/ledger.jsonl"));
  free(err);
}

// Runs `tally report` on tmpdir/RUN with its stderr in tmpdir/err.txt; returns the exit code
// and, in *err, what it printed there (to free).
static int report_run(const char *run, char **err) {
  int rc = sh("%s report %s/%s > /dev/null 2> %s/err.txt", bin, tmpdir, run, tmpdir);
  char path[700];
  snprintf(path, sizeof path, "%s/err.txt", tmpdir);
  *err = read_all(path);
  return rc;
}

// The page `tally report` wrote for tmpdir/RUN (to free).
static char *read_page(const char *run) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s/report.html", tmpdir, run);
  return read_all(path);
}

// A run killed mid-write (kill -9, a full disk) ends its ledger and eval.jsonl in half a line:
// the report drops that line, says so once per file, and draws the rest.
static void test_cut_off_last_line_is_skipped(void **state) {
  (void)state;
  assert_int_equal(sh("cp -r %s/moco-run %s/killed-run && cd %s/killed-run && "
                      "head -c -40 ledger.jsonl > l && mv l ledger.jsonl && "
                      "head -c -20 eval.jsonl > e && mv e eval.jsonl",
                      tmpdir, tmpdir, tmpdir),
                   0);
  char *err;
  assert_int_equal(report_run("killed-run", &err), 0);
  assert_non_null(strstr(err, "killed-run/ledger.jsonl: ignored a cut-off last line (line 12)"));
  assert_non_null(strstr(err, "killed-run/eval.jsonl: ignored a cut-off last line (line 4)"));
  assert_int_equal(count(err, "cut-off"), 2);
  free(err);
  char *html = read_page("killed-run");
  assert_non_null(strstr(html, "11 ledger records"));
  // Two of the three encoder evaluations are left: 65% and 70%, no 75%.
  assert_null(strstr(html, "75.00%"));
  assert_non_null(strstr(html, "<td>70.00%</td>"));
  free(html);
}

// A bad line with lines after it is not a kill but corruption: the report refuses the run and
// names the file and line.
static void test_bad_middle_line_is_an_error(void **state) {
  (void)state;
  assert_int_equal(sh("cp -r %s/moco-run %s/corrupt-ledger && "
                      "sed -i '5s/.*/{\"step\":4,\"loss\":/' %s/corrupt-ledger/ledger.jsonl",
                      tmpdir, tmpdir, tmpdir),
                   0);
  char *err;
  assert_int_not_equal(report_run("corrupt-ledger", &err), 0);
  assert_non_null(strstr(err, "corrupt-ledger/ledger.jsonl:5: "));
  assert_null(strstr(err, "cut-off"));
  free(err);

  assert_int_equal(sh("cp -r %s/moco-run %s/corrupt-eval && "
                      "sed -i '2s/.*/{\"step\":4,\"wh/' %s/corrupt-eval/eval.jsonl",
                      tmpdir, tmpdir, tmpdir),
                   0);
  assert_int_not_equal(report_run("corrupt-eval", &err), 0);
  assert_non_null(strstr(err, "corrupt-eval/eval.jsonl:2: "));
  free(err);
}

// Ledgers with values at the edges of what a double holds: every one is charted in a bounded
// page (ticks are counted, not accumulated until they pass the end), and values that are not
// finite are left out with a note saying how many.
static void test_extreme_values_finish(void **state) {
  (void)state;
  static const struct {
    const char *run, *lines[3];
  } ledgers[] = {
      // Steps 16 apart at 1e17, where doubles are 16 apart: a tick step of 2 adds nothing.
      {"huge-steps",
       {"{\"step\":100000000000000000,\"loss\":1,\"images_per_s\":5,\"param_bytes\":1048576}",
        "{\"step\":100000000000000016,\"loss\":0.9,\"images_per_s\":6,\"param_bytes\":1048576}"}},
      // Losses one ulp apart: a range of 2e-16 around 1.
      {"one-ulp",
       {"{\"step\":1,\"loss\":1,\"images_per_s\":5}",
        "{\"step\":2,\"loss\":1.0000000000000002,\"images_per_s\":5}"}},
      // A range of 2e308, more than a double holds.
      {"full-range",
       {"{\"step\":1,\"loss\":-1e308,\"images_per_s\":1e308}",
        "{\"step\":2,\"loss\":1e308,\"images_per_s\":5,\"param_bytes\":1e19}"}},
      // A step of 2^63, beyond a long.
      {"step-2p63",
       {"{\"step\":9223372036854775808,\"loss\":1,\"images_per_s\":5}",
        "{\"step\":1,\"loss\":0.5,\"images_per_s\":5}"}},
      // NaN, infinities and nulls.
      {"not-finite",
       {"{\"step\":1,\"loss\":NaN,\"images_per_s\":5}",
        "{\"step\":2,\"loss\":1e999,\"images_per_s\":-1e999}",
        "{\"step\":3,\"loss\":1,\"images_per_s\":null}"}},
  };
  for (size_t k = 0; k < sizeof ledgers / sizeof *ledgers; k++) {
    int n = 0;
    while (n < 3 && ledgers[k].lines[n]) n++;
    FILE *f = new_ledger(ledgers[k].run);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", ledgers[k].lines[i]);
    fclose(f);
    char out[700];
    snprintf(out, sizeof out, "%s/%s.html", tmpdir, ledgers[k].run);
    int rc =
        sh("timeout 20 %s report %s/%s --out %s > /dev/null", bin, tmpdir, ledgers[k].run, out);
    if (rc != 0) fail_msg("%s: tally report exited with %d", ledgers[k].run, rc);
    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    // A few records make a page of a few kilobytes, whatever their values.
    if (st.st_size > 64 * 1024) fail_msg("%s: %lld bytes", ledgers[k].run, (long long)st.st_size);
    char *html = read_all(out);
    assert_null(strstr(html, "inf\""));
    assert_null(strstr(html, "nan"));
    if (strcmp(ledgers[k].run, "not-finite") == 0) {
      // The loss chart leaves out NaN and +inf, the throughput chart -inf and null.
      assert_int_equal(count(html, "2 values not drawn (NaN or infinite)"), 2);
    }
    free(html);
  }
}

// A ledger of 100k records (a long run logged every step): the report reads, charts and takes
// medians of all of them. Step times are a permutation of 700..100699 ms in scrambled order (a
// sorted input would hide a quadratic sort), so the median is known: 50699.5 ms.
static void test_long_ledger(void **state) {
  (void)state;
  enum { N = 100000 };
  FILE *f = new_ledger("long-run");
  for (long s = 0; s < N; s++) {
    long step_ms = 700 + s * 7919 % N;  // 7919 is prime to 100000: each value once
    fprintf(f,
            "{\"step\":%ld,\"objective\":\"moco\",\"loss\":%.6f,\"images_per_s\":%.3f,"
            "\"step_ms\":%ld,\"param_bytes\":1048576,\"grad_bytes\":1048576,"
            "\"activation_bytes\":%ld,\"data_bytes\":52428800}\n",
            s, 5.0 / (1 + s * 1e-4), 32e3 / step_ms, step_ms, (32L + s % 7) << 20);
  }
  fclose(f);
  char *err;
  assert_int_equal(report_run("long-run", &err), 0);
  free(err);
  char *html = read_page("long-run");
  assert_non_null(strstr(html, "100000 ledger records"));
  assert_non_null(strstr(html, "<td>50.7 s</td>"));  // 50699.5 ms, as the table writes it
  free(html);
}

// Only regular files are read: a FIFO in place of ledger.jsonl (or eval.jsonl) would block the
// report forever waiting for a writer; it is refused by name.
static void test_fifo_refused(void **state) {
  (void)state;
  assert_int_equal(sh("mkdir %s/fifo-ledger && mkfifo %s/fifo-ledger/ledger.jsonl", tmpdir, tmpdir),
                   0);
  assert_int_equal(sh("cp -r %s/moco-run %s/fifo-eval && rm %s/fifo-eval/eval.jsonl && "
                      "mkfifo %s/fifo-eval/eval.jsonl",
                      tmpdir, tmpdir, tmpdir, tmpdir),
                   0);
  const char *runs[] = {"fifo-ledger", "fifo-eval"};
  const char *files[] = {"fifo-ledger/ledger.jsonl: not a regular file",
                         "fifo-eval/eval.jsonl: not a regular file"};
  for (int k = 0; k < 2; k++) {
    int rc =
        sh("timeout 20 %s report %s/%s > /dev/null 2> %s/err.txt", bin, tmpdir, runs[k], tmpdir);
    assert_int_equal(rc, 1);
    char path[700];
    snprintf(path, sizeof path, "%s/err.txt", tmpdir);
    char *err = read_all(path);
    assert_non_null(strstr(err, files[k]));
    free(err);
  }
}

// An unlabeled run has no kNN to chart: its evaluations' label-free quality is shown instead
// (the last RankMe and embedding_std in the quality table, RankMe and embedding_std as a
// fraction of 1/sqrt(d) over the steps with the collapse threshold dashed), what was not measured
// is said once, with the reason config.ini gives, and the first evaluation found collapsed is
// named by its step. Runs from before the quality was measured (the other fixtures) get none.
static void test_unlabeled_run_shows_quality(void **state) {
  (void)state;
  write_run("unlabeled-run", "vicreg", 32, 64, 0, 12, 2e10, 9e8);
  write_config("unlabeled-run", "none", "0.3", 4096, "32,64,128");
  char path[600];
  snprintf(path, sizeof path, "%s/unlabeled-run/eval.jsonl", tmpdir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  // embedding_std 0.04, then 0.02, then 0.0001 of 1/sqrt(128) = 0.0884: the last is collapsed.
  static const double rankme[3] = {30, 12, 1.2}, std[3] = {0.04, 0.02, 0.0001};
  for (int e = 0; e < 3; e++)
    fprintf(f,
            "{\"step\":%d,\"what\":\"encoder\",\"knn_top1\":null,\"knn_top1_k20\":null,"
            "\"rankme\":%g,\"embedding_std\":%g,\"embedding_std_reference\":0.088388,"
            "\"collapsed\":%s,\"seconds\":1}\n",
            4 * (e + 1), rankme[e], std[e], e == 2 ? "true" : "false");
  fclose(f);
  // summary.json without kNN, as an unlabeled run writes it.
  assert_int_equal(sh("sed -i '/knn_top1/d' %s/unlabeled-run/summary.json", tmpdir), 0);
  char *err;
  assert_int_equal(report_run("unlabeled-run", &err), 0);
  free(err);
  char *html = read_page("unlabeled-run");
  assert_null(strstr(html, "No encoder evaluations recorded"));
  // What is missing, once, with its reason.
  assert_int_equal(count(html, "Not measured"), 1);
  assert_int_equal(count(html, "kNN accuracy"), 1);
  assert_int_equal(count(html, "data.labels = none"), 1);
  // The quality table: RankMe of the last evaluation (1.2) once, its embedding_std 0.0001 of
  // 0.088388 = 0.0011 collapsed; no kNN column.
  assert_int_equal(count(html, "<th>RankMe</th>"), 1);
  assert_int_equal(count(html, "<td>1.20</td>"), 1);
  assert_non_null(strstr(html, "<td>0.001 (collapsed)</td>"));
  assert_null(strstr(html, "<th>kNN top-1</th>"));
  assert_non_null(strstr(html, "RankMe (effective rank of the embeddings) against step"));
  assert_non_null(strstr(html, "embedding_std as a fraction of 1/sqrt(d)"));
  assert_non_null(strstr(html, "collapse threshold"));
  // Loss against steps, compute and time; throughput and learning rate; RankMe; embedding_std
  // and its threshold.
  assert_int_equal(count(html, "<polyline"), 3 + 2 + 1 + 2);
  assert_int_equal(count(html, "class=\"series reference\""), 1);
  assert_non_null(strstr(html, "unlabeled-run (vicreg): collapsed at step 12"));
  assert_null(strstr(html, "collapsed at step 4"));
  assert_null(strstr(html, "collapsed at step 8"));
  free(html);
  html = read_page("moco-run");
  assert_null(strstr(html, "RankMe (effective rank"));
  assert_null(strstr(html, "<th>RankMe</th>"));
  assert_int_equal(count(html, "Not measured"), 1);
  assert_non_null(strstr(html, "<b>moco-run</b>: no label-free quality"));
  free(html);
}

// A number member of the JSON text (first occurrence of "key":), or NaN.
static double json_number(const char *text, const char *key) {
  char what[80];
  snprintf(what, sizeof what, "\"%s\":", key);
  const char *at = strstr(text, what);
  return at ? strtod(at + strlen(what), NULL) : NAN;
}

// A real run, trained here on the unlabeled sample images: its summary.json keeps the peak
// `tally plan` draws up for the same configuration (within what the process' own resident memory
// varies between two processes), and its report sets that beside the measured peak, says once
// that no accuracy could be measured because the data has no labels, and shows its last RankMe
// once.
static void test_real_run(void **state) {
  (void)state;
  const char *settings =
      "--config configs/smoke.ini --set data.dataset=stripes-unlabeled "
      "--set moco.queue_size=64 --set train.steps=4";
  assert_int_equal(sh("%s train --objective=moco %s --quiet --out %s/real-run > /dev/null 2>&1",
                      bin, settings, tmpdir),
                   0);
  assert_int_equal(sh("%s plan --objective=moco %s --json > %s/plan.json", bin, settings, tmpdir),
                   0);
  char path[700];
  snprintf(path, sizeof path, "%s/real-run/summary.json", tmpdir);
  char *summary = read_all(path);
  snprintf(path, sizeof path, "%s/plan.json", tmpdir);
  char *plan = read_all(path);
  const double recorded = json_number(summary, "planned_peak_bytes");
  const double planned = json_number(plan, "planned_total_bytes");
  const double measured = json_number(summary, "peak_rss_bytes");
  const double rankme = json_number(summary, "rankme");
  if (!(fabs(recorded - planned) < 0.05 * planned))
    fail_msg("summary.json's planned peak %.0f, tally plan's %.0f", recorded, planned);
  assert_true(rankme > 0);
  char *err;
  assert_int_equal(report_run("real-run", &err), 0);
  free(err);
  char *html = read_page("real-run");
  char bar[120];
  snprintf(bar, sizeof bar, "class=\"bar planned\" data-bytes=\"%.0f\"", recorded);
  assert_non_null(strstr(html, bar));
  snprintf(bar, sizeof bar, "class=\"bar measured\" data-bytes=\"%.0f\"", measured);
  assert_non_null(strstr(html, bar));
  assert_int_equal(count(html, "Not measured"), 1);
  assert_int_equal(count(html, "data.labels = none"), 1);
  char cell_text[40];
  snprintf(cell_text, sizeof cell_text, "<td>%.2f</td>", rankme);
  assert_int_equal(count(html, cell_text), 1);
  assert_non_null(strstr(html, "moco on resnet (models/resnet-small.ini)"));
  assert_non_null(strstr(html, "<dt>recipe</dt><dd>configs/smoke.ini</dd>"));
  free(html);
  free(plan);
  free(summary);
}

static int have_chromium(void) { return sh("command -v chromium > /dev/null 2>&1") == 0; }

// The x pixel of the last point of the `which`-th run's line (0-based; reference lines not
// counted) in the chart titled `title`.
static double last_point_x(const char *dom, const char *title, int which) {
  const char *chart = strstr(dom, title), *end = chart ? strstr(chart, "</svg>") : NULL;
  assert_non_null(end);
  const char *line = chart;
  for (int i = 0; i <= which; i++) {
    line = strstr(line + 1, "<polyline class=\"series\"");
    assert_true(line && line < end);
  }
  const char *points = strstr(line, "points=\""), *close = strchr(points + 8, '"');
  const char *last = close;
  while (last[-1] == ' ') last--;
  while (last > points && last[-1] != ' ' && last[-1] != '"') last--;
  return atof(last);
}

// The height in pixels of the bar `kind` ("planned", "measured") of data-bytes `bytes`.
static double bar_height(const char *dom, const char *kind, const char *bytes) {
  char what[120];
  snprintf(what, sizeof what, "class=\"bar %s\" data-bytes=\"%s\"", kind, bytes);
  const char *bar = strstr(dom, what);
  if (!bar) fail_msg("no %s", what);
  const char *h = strstr(bar, "height=\"");
  assert_non_null(h);
  return atof(h + 8);
}

// Every tick label of every chart is a short number with its unit: at most 4 significant
// digits (no "0.00035", no "1.5e+11"), then nothing, "%", or a unit a person reads.
static void assert_ticks_readable(const char *dom) {
  static const char *const units[] = {"",      "%",     "FLOP", "kFLOP", "MFLOP", "GFLOP",
                                      "TFLOP", "PFLOP", "B",    "KiB",   "MiB",   "GiB",
                                      "TiB",   "ms",    "s",    "min",   "h"};
  int ticks = 0;
  for (const char *t = dom; (t = strstr(t, "class=\"tick")); t++) {
    const char *text = strchr(t, '>') + 1, *end = strchr(text, '<');
    char label[64];
    snprintf(label, sizeof label, "%.*s", (int)(end - text), text);
    if (!(label[0] == '-' || (label[0] >= '0' && label[0] <= '9'))) continue;  // a run's name
    ticks++;
    int digits = 0, leading = 1;
    const char *c = label + (label[0] == '-');
    for (; (*c >= '0' && *c <= '9') || *c == '.'; c++) {
      if (*c == '.') continue;
      if (*c != '0') leading = 0;
      digits += !leading;
    }
    if (digits > 4 || strchr(label, 'e')) fail_msg("tick label '%s' is not readable", label);
    if (*c == ' ' || *c == '%') c += *c == ' ';
    int known = 0;
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) known |= strcmp(c, units[u]) == 0;
    if (!known) fail_msg("tick label '%s': unknown unit '%s'", label, c);
  }
  assert_true(ticks > 50);
}

static void test_dom_in_browser(void **state) {
  (void)state;
  if (!have_chromium()) {
    // CI installs it (scripts/test.sh): there a missing browser is a failure, not a skip.
    if (getenv("CI"))
      fail_msg("chromium is not installed (scripts/setup.sh --for-tests installs it)");
    print_message("chromium is not installed (scripts/setup.sh --for-tests installs it)\n");
    skip();
  }
  char dom_path[700];
  snprintf(dom_path, sizeof dom_path, "%s/dom.html", tmpdir);
  assert_int_equal(sh("timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic "
                      "--no-first-run --disable-background-networking --disable-component-update "
                      "--disable-sync --user-data-dir=%s/chrome --dump-dom file://%s > %s "
                      "2> /dev/null",
                      tmpdir, report, dom_path),
                   0);
  char *dom = read_all(dom_path);
  // Three kNN charts (against steps, training compute and training time), one line per run and
  // the raw-pixel baseline both share (dashed); no linear-probe charts (the runs did not fit
  // one). A loss chart per objective against each of the three (one line each: inbatch's and
  // moco's losses are not drawn on one axis). Throughput and learning rate. One memory chart.
  assert_int_equal(count(dom, "<svg"), 3 + 2 * 3 + 2 + 1);
  assert_int_equal(count(dom, "<polyline"), 3 * 3 + 2 * 3 + 2 * 2);
  assert_int_equal(count(dom, "class=\"series reference\""), 3);
  assert_non_null(strstr(dom, "kNN top-1 accuracy against training compute"));
  assert_non_null(strstr(dom, "kNN top-1 accuracy against training time"));
  assert_non_null(strstr(dom, "raw pixels (baseline)"));
  assert_non_null(strstr(dom, "inbatch loss against step"));
  assert_non_null(strstr(dom, "moco loss against training compute"));
  // Both runs spent 3.42e11 FLOPs, inbatch in 6 steps and moco in 12: their last evaluations
  // fall together against compute, not against steps.
  const char *knn_flops = "kNN top-1 accuracy against training compute";
  const double end_inbatch = last_point_x(dom, knn_flops, 0),
               end_moco = last_point_x(dom, knn_flops, 1);
  if (!(fabs(end_inbatch - end_moco) < 0.5)) fail_msg("%g against %g", end_inbatch, end_moco);
  const char *knn_steps = "kNN top-1 accuracy against step";
  assert_true(last_point_x(dom, knn_steps, 1) - last_point_x(dom, knn_steps, 0) > 100);
  // Axes in units a person reads: the compute axis of 28.5 to 342 GFLOP in GFLOP, the time
  // axis of 0.7 to 9.1 s in s, memory of up to 1.2e9 bytes (1.12 GiB) in GiB.
  assert_ticks_readable(dom);
  assert_non_null(strstr(dom, " GFLOP</text>"));
  assert_null(strstr(dom, "PFLOP</text>"));
  assert_non_null(strstr(dom, " s</text>"));
  assert_non_null(strstr(dom, "0.2 GiB</text>"));
  // Memory: one group per run on one axis, the planned peak beside the measured one: inbatch
  // planned 1.2e9 bytes and measured 1e9, moco planned 8e8; bars in proportion to their bytes.
  assert_int_equal(count(dom, "class=\"bar planned\""), 2);
  assert_int_equal(count(dom, "class=\"bar measured\""), 2);
  const double planned_inbatch = bar_height(dom, "planned", "1200000000"),
               planned_moco = bar_height(dom, "planned", "800000000"),
               measured = bar_height(dom, "measured", "1000000000");
  if (!(fabs(measured / planned_inbatch - 1e9 / 1.2e9) < 0.01 &&
        fabs(planned_moco / planned_inbatch - 8e8 / 1.2e9) < 0.01))
    fail_msg("bar heights %g, %g, %g", planned_inbatch, planned_moco, measured);
  assert_non_null(strstr(dom, "measured 954 MiB, 125% of the planned 763 MiB"));
  assert_null(strstr(dom, "class=\"band\""));
  // The runs' headers and what differs between their configurations: the learning rate and the
  // model's widths; moco's queue is moco-run's alone (inbatch does not read [moco]), the rest
  // is the same.
  assert_non_null(strstr(dom, "moco on resnet (models/resnet-small.ini)"));
  assert_non_null(strstr(dom, "sgd, lr 0.06, cosine schedule"));
  assert_non_null(strstr(dom, "stripes: data/samples/stripes, 16 px, 1 channel"));
  const char *diff = strstr(dom, "What differs between these runs");
  assert_non_null(diff);
  const char *diff_end = strstr(diff, "</table>");
  assert_non_null(diff_end);
  const char *lr = strstr(diff, "<th>optim.lr</th><td>0.3</td><td>0.06</td>");
  const char *widths =
      strstr(diff, "<th>backbone.stage_channels</th><td>32,64,128</td><td>64,128,256</td>");
  assert_true(lr && lr < diff_end && widths && widths < diff_end);
  const char *queue = strstr(diff, "moco.queue_size"), *seed = strstr(diff, "train.seed");
  assert_true(!queue || queue > diff_end);
  assert_true(!seed || seed > diff_end);
  // The cost table, side by side, its rows under the ledger's four questions: views with
  // gradient 64 against 32 and negatives 62 against 4096 (encoded), activations 64 MiB against
  // 32 MiB (held), moco's queue and its oldest key 11 steps old (cached), the next step's
  // encodings (redo).
  const char *table = strstr(dom, "<table class=\"cost\"");
  assert_non_null(table);
  const char *encoded = strstr(table, "What is encoded this step");
  const char *held = strstr(table, "What is held");
  const char *cached = strstr(table, "What is cached from earlier steps");
  const char *next = strstr(table, "What the next step must redo");
  assert_true(encoded && held && cached && next);
  assert_true(encoded < held && held < cached && cached < next);
  const char *views = strstr(table, "<td>64</td><td>32</td>");
  const char *negatives = strstr(table, "<td>62</td><td>4096</td>");
  const char *activations = strstr(table, "<td>64.0 MiB</td><td>32.0 MiB</td>");
  const char *queue_bytes = strstr(table, "<td>0 B</td><td>2.00 MiB</td>");
  const char *age = strstr(table, "<th>queue_oldest_age_steps</th><td>-</td><td>11</td>");
  assert_true(views > encoded && views < held && negatives > encoded && negatives < held);
  assert_true(activations > held && activations < cached);
  assert_true(queue_bytes > cached && queue_bytes < next && age > cached && age < next);
  // The quality table: the last kNN evaluation 75% for both.
  assert_non_null(strstr(dom, "<td>75.00%</td>"));
  // Median step time of 700, 710, ..., 810 ms.
  assert_non_null(strstr(table, "<td>755 ms</td>"));
  free(dom);
}

int main(void) {
  if (cli_test_init("report") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_self_contained),
      cmocka_unit_test(test_default_output_and_errors),
      cmocka_unit_test(test_cut_off_last_line_is_skipped),
      cmocka_unit_test(test_bad_middle_line_is_an_error),
      cmocka_unit_test(test_extreme_values_finish),
      cmocka_unit_test(test_long_ledger),
      cmocka_unit_test(test_fifo_refused),
      cmocka_unit_test(test_unlabeled_run_shows_quality),
      cmocka_unit_test(test_real_run),
      cmocka_unit_test(test_dom_in_browser),
  };
  int failed = cmocka_run_group_tests(tests, setup, NULL);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) return 1;
  return failed;
}
