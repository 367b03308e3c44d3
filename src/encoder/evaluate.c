#include "encoder/evaluate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/timer.h"
#include "eval/knn.h"
#include "eval/linear_probe.h"
#include "eval/monitor.h"
#include "eval/quality.h"
#include "io/atomic_file.h"
#include "io/dir_lock.h"
#include "io/json_write.h"
#include "io/regular_file.h"

static void say(const EvalOptions *opt, const char *what, int n) {
  if (opt->quiet) return;
  if (n > 0)
    printf("tally eval: %s (%d images)...\n", what, n);
  else
    printf("tally eval: %s...\n", what);
  fflush(stdout);
}

// A result as soon as it is known (the table at the end repeats it).
static void tell(const EvalOptions *opt, const char *what, double top1, double top1_k20, int k) {
  if (opt->quiet) return;
  if (isnan(top1_k20))
    printf("tally eval: %s: %.4f\n", what, top1);
  else
    printf("tally eval: %s: %.4f (k=%d), %.4f (k=20)\n", what, top1, k, top1_k20);
  fflush(stdout);
}

// kNN at k (knn_k_for_bank) and 20; accuracies into top1, top1_k20.
static int knn(const Config *cfg, int k, const float *train, const Dataset *tr, const float *test,
               const Dataset *te, int d, ExecCtx *ctx, double *top1, double *top1_k20) {
  const int ks[2] = {k, 20};
  double acc[2];
  if (knn_top1_multi(train, tr->labels, tr->n, test, te->labels, te->n, d, tr->n_classes, ks, 2,
                     cfg->eval.knn_temperature, ctx, acc, NULL) != 0)
    return -1;
  *top1 = acc[0];
  *top1_k20 = acc[1];
  return 0;
}

static int linear(const Dataset *tr, const float *train, const Dataset *te, const float *test,
                  int d, uint64_t seed, ExecCtx *ctx, double *top1, double *lambda) {
  LinearProbeResult p;
  if (linear_probe(train, tr->labels, tr->n, test, te->labels, te->n, d, tr->n_classes, seed, ctx,
                   &p) != 0)
    return -1;
  *top1 = p.test_top1;
  *lambda = p.lambda;
  return 0;
}

// Raw pixels as features: the evaluation transform's output, flattened (*rc -1 when an image
// cannot be decoded).
static float *pixels(const FeatureEncoder *e, const Dataset *ds, int *rc) {
  const int S = e->cfg.data.image_size, d = S * S * e->cfg.data.channels;
  float *px = tl_alloc(sizeof(float) * (size_t)ds->n * d, MEM_EVAL, COMP_OTHER);
  if (*rc == 0 && eval_views(ds, 0, ds->n, &e->norm, px) != 0) *rc = -1;
  return px;
}

static int score(FeatureEncoder *e, const EvalOptions *opt, const Dataset *tr, const Dataset *te,
                 EvalResult *r) {
  const Config *cfg = &e->cfg;
  const int D = feature_encoder_dim(e),
            P = cfg->data.image_size * cfg->data.image_size * cfg->data.channels;
  say(opt, "encoding the training set", tr->n);
  float *ftr = tl_alloc(sizeof(float) * (size_t)tr->n * D, MEM_EVAL, COMP_OTHER);
  int rc = feature_encoder_run(e, tr, tr->n, ftr);
  // Without labels (te NULL) only the training set's embeddings are measured.
  float *fte = NULL;
  if (te) {
    say(opt, "encoding the test set", te->n);
    fte = tl_alloc(sizeof(float) * (size_t)te->n * D, MEM_EVAL, COMP_OTHER);
    if (rc == 0) rc = feature_encoder_run(e, te, te->n, fte);
  }
  // What needs no labels: how many directions the embeddings use, and how spread they are.
  EmbeddingQuality q;
  if (rc == 0 && (rc = embedding_quality(ftr, tr->n, D, &e->ctx, &q)) == 0) {
    r->encoder.quality = q;
    if (!opt->quiet) {
      printf("tally eval: rankme %.1f of %d dimensions; embedding_std %.4f (1/sqrt(d) = %.4f)\n",
             q.rankme, D, q.embedding_std, q.embedding_std_reference);
      fflush(stdout);
    }
  }
  // The raw-pixel baseline's features only when it is asked for.
  float *ptr = te && opt->baseline ? pixels(e, tr, &rc) : NULL;
  float *pte = te && opt->baseline ? pixels(e, te, &rc) : NULL;
  if (rc == 0 && te && opt->knn) {
    const int k = knn_k_for_bank(cfg->eval.knn_k, tr->labels, tr->n, tr->n_classes);
    r->encoder.knn_k = r->raw_pixels.knn_k = k;
    say(opt, "kNN on the features", te->n);
    rc = knn(cfg, k, ftr, tr, fte, te, D, &e->ctx, &r->encoder.top1, &r->encoder.top1_k20);
    if (rc == 0) tell(opt, "kNN top-1 of the encoder", r->encoder.top1, r->encoder.top1_k20, k);
    if (rc == 0 && opt->baseline) {
      say(opt, "kNN on raw pixels", te->n);
      rc = knn(cfg, k, ptr, tr, pte, te, P, &e->ctx, &r->raw_pixels.top1, &r->raw_pixels.top1_k20);
      if (rc == 0)
        tell(opt, "kNN top-1 on raw pixels", r->raw_pixels.top1, r->raw_pixels.top1_k20, k);
    }
  }
  if (rc == 0 && te && opt->linear) {
    say(opt, "linear probe on the features", tr->n);
    rc = linear(tr, ftr, te, fte, D, cfg->train.seed, &e->ctx, &r->encoder.linear_top1,
                &r->linear_lambda);
    if (rc == 0) tell(opt, "linear probe top-1 of the encoder", r->encoder.linear_top1, NAN, 0);
    if (rc == 0 && opt->baseline) {
      say(opt, "linear probe on raw pixels", tr->n);
      rc = linear(tr, ptr, te, pte, P, cfg->train.seed, &e->ctx, &r->raw_pixels.linear_top1,
                  &r->linear_lambda_raw_pixels);
      if (rc == 0) tell(opt, "linear probe top-1 on raw pixels", r->raw_pixels.linear_top1, NAN, 0);
    }
  }
  tl_free(ftr);
  tl_free(fte);
  tl_free(ptr);
  tl_free(pte);
  return rc;
}

// Two paths that name one file or folder (after links).
static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int evaluate_encoder(FeatureEncoder *e, const EvalOptions *opt, EvalResult *r) {
  double t0 = now_ms();
  const double nan = NAN;
  const KnnResult none = {
      .top1 = nan,
      .top1_k20 = nan,
      .linear_top1 = nan,
      .quality = {.rankme = nan, .embedding_std = nan, .embedding_std_reference = nan}};
  *r = (EvalResult){
      .encoder = none, .raw_pixels = none, .linear_lambda = nan, .linear_lambda_raw_pixels = nan};
  const Config *cfg = &e->cfg;
  Dataset tr = {0}, te = {0};
  // The run's evaluation set: the monitor's own ([eval] train, test) when it had one, whole.
  const int own = cfg->eval.train[0] != 0;
  const char *train = own ? cfg->eval.train : cfg->data.train;
  const char *test = own ? cfg->eval.test : cfg->data.test;
  say(opt, "loading the training and test sets", 0);
  const int unlabeled = !own && strcmp(cfg->data.labels, "none") == 0;
  int rc = feature_dataset_load(e, &tr, train, own ? 0 : cfg->data.limit, unlabeled);
  // Images without class labels are still measured: what needs no labels. A run's own data is
  // unlabeled when its recipe says so (data.labels = none), whatever its subfolders are called
  // (a photo collection by year); the monitor's own set (eval.train) is labeled by definition.
  const char *why = NULL;
  if (rc == 0 && unlabeled)
    why =
        "is unlabeled (data.labels = none; --set data.labels=auto reads its subfolders as classes)";
  else if (rc == 0 && tr.n_classes == 0)
    why = "has no class labels";
  else if (rc == 0 && !test[0])
    why = "has class labels but no test set is named (--set data.test=PATH)";
  const int labeled = rc == 0 && !why;
  if (rc == 0 && labeled)
    rc = feature_dataset_load(e, &te, test, own ? 0 : cfg->data.test_limit, 0);
  if (rc == 0 && labeled) rc = dataset_align_test_labels(&tr, &te, test);
  if (rc == 0 && labeled && same_file(train, test))
    fprintf(stderr,
            "tally eval: warning: the test set is the training set (%s): kNN finds every test "
            "image itself among its neighbours and the probe is scored on what it was fitted to; "
            "both read high. Give a held-out set with --set data.test=PATH\n",
            test);
  if (rc == 0 && !labeled && !opt->quiet) {
    printf(
        "tally eval: %s %s: kNN and the linear probe need labels; measuring what needs none "
        "(rankme, embedding_std)\n",
        train, why);
    fflush(stdout);
  }
  if (rc == 0) {
    r->n_train = tr.n;
    r->n_test = labeled ? te.n : 0;
    r->n_classes = labeled ? tr.n_classes : 0;
    r->feature_dim = feature_encoder_dim(e);
    rc = score(e, opt, &tr, labeled ? &te : NULL, r);
  }
  dataset_free(&tr);
  dataset_free(&te);
  r->encoder.seconds = (now_ms() - t0) / 1e3;
  return rc;
}

int evaluate_record(const char *dir, long step, const EvalResult *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s/eval.jsonl", dir);
  if (step < 0) return tl_fail("%s: the checkpoint does not say its step", dir);
  if (dir_lock(dir, ".lock", "run") != 0) return errno == EWOULDBLOCK ? 1 : -1;
  char *text = NULL;
  size_t len = 0;
  int rc = regular_read_text(path, &text, &len);
  if (rc < 0) return -1;
  while (len > 0 && text[len - 1] != '\n') len--;  // a killed writer's cut-off line
  AtomicFile a;
  if (atomic_open(&a, path) != 0) {
    free(text);
    return -1;
  }
  if (len) fwrite(text, 1, len, a.f);
  free(text);
  knn_result_write_line(a.f, step, "encoder", "tally eval", &r->encoder);
  return atomic_commit(&a);
}

static void json_number(FILE *f, const char *name, double v, int last) {
  if (isfinite(v))
    fprintf(f, "\"%s\": %.6g%s", name, v, last ? "" : ", ");
  else
    fprintf(f, "\"%s\": null%s", name, last ? "" : ", ");
}

// One row of the eval table; a measure not taken (NaN) shows as "-".
static void eval_row(FILE *f, const char *label, double encoder, double pixels) {
  fprintf(f, "%-24s %10.4f", label, encoder);
  if (isfinite(pixels))
    fprintf(f, " %12.4f", pixels);
  else
    fprintf(f, " %12s", "-");
}

void evaluate_print(FILE *f, const FeatureEncoder *enc, const EvalResult *r, int json) {
  if (json) {
    fprintf(f, "{\"source\": ");
    json_put_string(f, enc->source);
    fprintf(f, ", \"objective\": ");
    json_put_string(f, enc->objective);
    fprintf(f, ", \"step\": %ld, \"source_crc32\": ", enc->step);
    json_put_string(f, enc->crc32);
    fprintf(f, ", ");
    fprintf(f, "\"n_train\": %d, \"n_test\": %d, \"n_classes\": %d, \"feature_dim\": %d, ",
            r->n_train, r->n_test, r->n_classes, r->feature_dim);
    fprintf(f, "\"knn_k\": %d, ", r->encoder.knn_k);
    json_number(f, "knn_top1", r->encoder.top1, 0);
    json_number(f, "knn_top1_k20", r->encoder.top1_k20, 0);
    json_number(f, "knn_top1_raw_pixels", r->raw_pixels.top1, 0);
    json_number(f, "knn_top1_k20_raw_pixels", r->raw_pixels.top1_k20, 0);
    json_number(f, "linear_top1", r->encoder.linear_top1, 0);
    json_number(f, "linear_top1_raw_pixels", r->raw_pixels.linear_top1, 0);
    json_number(f, "linear_lambda", r->linear_lambda, 0);
    json_number(f, "linear_lambda_raw_pixels", r->linear_lambda_raw_pixels, 0);
    json_number(f, "rankme", r->encoder.quality.rankme, 0);
    json_number(f, "embedding_std", r->encoder.quality.embedding_std, 0);
    json_number(f, "embedding_std_reference", r->encoder.quality.embedding_std_reference, 0);
    fprintf(f, " \"collapsed\": %s,",
            embedding_quality_collapsed(&r->encoder.quality) ? "true" : "false");
    json_number(f, "seconds", r->encoder.seconds, 1);
    fprintf(f, "}\n");
    return;
  }
  fprintf(f, "%s (%s, step %ld): %d training, %d test images, %d classes, %d-d features\n",
          enc->source, enc->objective[0] ? enc->objective : "?", enc->step, r->n_train, r->n_test,
          r->n_classes, r->feature_dim);
  fprintf(f, "%-24s %10s %12s\n", "", "encoder", "raw pixels");
  char k_label[32];
  snprintf(k_label, sizeof k_label, "kNN top-1 (k=%d)", r->encoder.knn_k);
  if (isfinite(r->encoder.top1)) {
    eval_row(f, k_label, r->encoder.top1, r->raw_pixels.top1);
    fprintf(f, "\n");
    eval_row(f, "kNN top-1 (k=20)", r->encoder.top1_k20, r->raw_pixels.top1_k20);
    fprintf(f, "\n");
  }
  if (isfinite(r->encoder.linear_top1)) {
    eval_row(f, "linear probe top-1", r->encoder.linear_top1, r->raw_pixels.linear_top1);
    if (isfinite(r->linear_lambda_raw_pixels))
      fprintf(f, "   (L2 %g / %g)\n", r->linear_lambda, r->linear_lambda_raw_pixels);
    else
      fprintf(f, "   (L2 %g)\n", r->linear_lambda);
  }
  fprintf(f, "%-24s %10.1f   (effective rank of the training set's embeddings, of %d)\n", "rankme",
          r->encoder.quality.rankme, r->feature_dim);
  fprintf(f, "%-24s %10.4f   (per dimension, L2-normalized; 1/sqrt(d) = %.4f, collapsed ~ 0)\n",
          "embedding_std", r->encoder.quality.embedding_std,
          r->encoder.quality.embedding_std_reference);
  if (embedding_quality_collapsed(&r->encoder.quality))
    fprintf(f,
            "warning: the embeddings have collapsed: embedding_std is below %g of 1/sqrt(d), every "
            "image maps to nearly the same direction\n",
            QUALITY_COLLAPSED_FRACTION);
  fprintf(f, "%.1f s\n", r->encoder.seconds);
}
