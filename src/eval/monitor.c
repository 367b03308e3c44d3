#include "eval/monitor.h"

#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "core/timer.h"
#include "eval/knn.h"
#include "eval/linear_probe.h"
#include "io/json_write.h"

static int limit_or_all(int limit, int n) { return limit > 0 && limit < n ? limit : n; }

// m of the n training images, each set of m equally likely, ascending (selection sampling: image
// i is taken with probability (m - taken) / (n - i)), from the seed alone.
static void choose_quality_sample(int *index, int m, int n, uint64_t seed) {
  Rng rng = rng_stream(seed, RNG_QUALITY, 0, 0);
  for (int i = 0, taken = 0; i < n && taken < m; i++) {
    const double u = (double)(rng_next_u64(&rng) >> 11) * 0x1p-53;
    if ((n - i) * u < m - taken) index[taken++] = i;
  }
}

void knn_monitor_init(KnnMonitor *m, const MonitorSettings *set, const Dataset *train,
                      const Dataset *test, const AugmentParams *aug, float *params) {
  memset(m, 0, sizeof *m);
  m->set = *set;
  m->train = train;
  m->test = test;
  m->aug = aug;
  m->labeled = test != NULL;
  m->n_train = m->labeled ? limit_or_all(set->train_limit, train->n) : 0;
  m->n_test = m->labeled ? test->n : 0;
  m->n_quality = limit_or_all(MONITOR_QUALITY_IMAGES, train->n);
  m->batch = set->batch;
  // Everything the monitor allocates, its model's outputs and scratchpad included, is
  // evaluation memory: the training ledger's workspace stays the training step's own.
  tl_alloc_scope_begin(MEM_EVAL);
  exec_ctx_init(&m->ctx);
  m->ctx.scratchpad_category = MEM_EVAL;
  const ModelSpec *spec = set->spec;
  int S = set->image_size, C = set->channels;
  size_t count = backbone_param_count(spec, S, C);
  paramset_bind(&m->bound, params, NULL, count);
  Builder b = {.ctx = &m->ctx, .params = &m->bound, .mode = OP_INFER};
  m->encoder = backbone_create(spec, &b, m->batch, S, C);
  backbone_set_input_normalization(m->encoder, aug->mean, aug->std);
  int D = m->encoder->feature_dim;
  m->images = tl_alloc(sizeof(float) * (size_t)m->batch * S * S * C, MEM_EVAL, COMP_OTHER);
  if (m->labeled) {
    m->train_feat = tl_alloc(sizeof(float) * (size_t)m->n_train * D, MEM_EVAL, COMP_OTHER);
    m->test_feat = tl_alloc(sizeof(float) * (size_t)m->n_test * D, MEM_EVAL, COMP_OTHER);
  }
  m->quality_index = tl_alloc(sizeof(int) * (size_t)m->n_quality, MEM_EVAL, COMP_OTHER);
  m->quality_feat = tl_alloc(sizeof(float) * (size_t)m->n_quality * D, MEM_EVAL, COMP_OTHER);
  // A plan reserves the index without memory behind it, and reads no image.
  if (!tl_alloc_untouched())
    choose_quality_sample(m->quality_index, m->n_quality, train->n, set->seed);
  tl_alloc_scope_end();
}

static int cancelled(const KnnMonitor *m) { return m->cancel && *m->cancel; }

// Encodes n images of ds into feat (n, D): images index[0 .. n - 1], or the first n when index is
// NULL; the last partial batch is zero-padded. -1 with tl_last_error() when an image cannot be
// decoded.
static int encode(KnnMonitor *m, const Dataset *ds, const int *index, int n, float *feat) {
  const int S = m->set.image_size, C = m->set.channels, D = m->encoder->feature_dim;
  const size_t image_floats = (size_t)S * S * C;
  for (int start = 0; start < n && !cancelled(m); start += m->batch) {
    int count = n - start < m->batch ? n - start : m->batch;
    if ((index ? eval_views_at(ds, index + start, count, m->aug, m->images)
               : eval_views(ds, start, count, m->aug, m->images)) != 0)
      return -1;
    if (count < m->batch)
      memset(m->images + count * image_floats, 0,
             (m->batch - count) * image_floats * sizeof(float));
    m->encoder->forward(m->encoder, &m->ctx, m->images);
    memcpy(feat + (size_t)start * D, m->encoder->feature, sizeof(float) * (size_t)count * D);
  }
  return 0;
}

static KnnResult no_result(void) {
  const double nan = NAN;
  return (KnnResult){
      .top1 = nan,
      .top1_k20 = nan,
      .linear_top1 = nan,
      .quality = {.rankme = nan, .embedding_std = nan, .embedding_std_reference = nan}};
}

static KnnResult vote(KnnMonitor *m, const float *train_feat, const float *test_feat, int d) {
  KnnResult r = no_result();
  r.knn_k = knn_k_for_bank(m->set.k, m->train->labels, m->n_train, m->train->n_classes);
  const int ks[2] = {r.knn_k, 20};
  double acc[2] = {-1, -1};
  if (knn_top1_multi(train_feat, m->train->labels, m->n_train, test_feat, m->test->labels,
                     m->n_test, d, m->train->n_classes, ks, 2, m->set.temperature, &m->ctx, acc,
                     NULL) != 0)
    TL_DIE("kNN monitor: %s", tl_last_error());
  r.top1 = acc[0];
  r.top1_k20 = acc[1];
  if (m->set.linear) {
    LinearProbeResult p;
    if (linear_probe(train_feat, m->train->labels, m->n_train, test_feat, m->test->labels,
                     m->n_test, d, m->train->n_classes, m->set.seed, &m->ctx, &p) != 0)
      TL_DIE("linear probe: %s", tl_last_error());
    r.linear_top1 = p.test_top1;
  }
  return r;
}

KnnResult knn_monitor_run(KnnMonitor *m) {
  double t0 = now_ms();
  KnnResult r = no_result();
  const int D = m->encoder->feature_dim;
  r.failed = (m->labeled && (encode(m, m->train, NULL, m->n_train, m->train_feat) != 0 ||
                             encode(m, m->test, NULL, m->n_test, m->test_feat) != 0)) ||
             encode(m, m->train, m->quality_index, m->n_quality, m->quality_feat) != 0;
  r.cancelled = !r.failed && cancelled(m);
  if (r.failed || r.cancelled) return r;
  if (m->labeled) {
    KnnResult v = vote(m, m->train_feat, m->test_feat, D);
    r.top1 = v.top1, r.top1_k20 = v.top1_k20, r.knn_k = v.knn_k, r.linear_top1 = v.linear_top1;
  }
  // Non-finite embeddings have no quality to give: it stays NaN (recorded as null).
  EmbeddingQuality q;
  if (m->n_quality >= 2 && embedding_quality(m->quality_feat, m->n_quality, D, &m->ctx, &q) == 0)
    r.quality = q;
  r.seconds = (now_ms() - t0) / 1e3;
  return r;
}

size_t knn_monitor_reserve_run(KnnMonitor *m) {
  const int D = m->encoder->feature_dim;
  size_t vote_bytes = 0, quality_bytes = embedding_quality_eval_bytes(m->n_quality, D);
  if (m->labeled) {
    knn_reserve_scratchpad(&m->ctx, m->n_train, m->n_test, D);
    vote_bytes = knn_eval_bytes(m->n_train, m->n_test, D);
  }
  embedding_quality_reserve_scratchpad(&m->ctx, m->n_quality, D);
  return vote_bytes > quality_bytes ? vote_bytes : quality_bytes;
}

KnnResult knn_monitor_raw_pixels(KnnMonitor *m) {
  if (!m->labeled) TL_DIE("kNN monitor: raw pixels without labels");
  double t0 = now_ms();
  const int S = m->set.image_size, C = m->set.channels, d = S * S * C;
  float *train_px = tl_alloc(sizeof(float) * (size_t)m->n_train * d, MEM_EVAL, COMP_OTHER);
  float *test_px = tl_alloc(sizeof(float) * (size_t)m->n_test * d, MEM_EVAL, COMP_OTHER);
  if (eval_views(m->train, 0, m->n_train, m->aug, train_px) != 0 ||
      eval_views(m->test, 0, m->n_test, m->aug, test_px) != 0) {
    tl_free(train_px);
    tl_free(test_px);
    KnnResult failed = no_result();
    failed.failed = 1;
    return failed;
  }
  KnnResult r = vote(m, train_px, test_px, d);
  tl_free(train_px);
  tl_free(test_px);
  r.seconds = (now_ms() - t0) / 1e3;
  return r;
}

void knn_monitor_destroy(KnnMonitor *m) {
  m->encoder->destroy(m->encoder);
  tl_free(m->images);
  tl_free(m->train_feat);
  tl_free(m->test_feat);
  tl_free(m->quality_index);
  tl_free(m->quality_feat);
  paramset_free(&m->bound);
  exec_ctx_destroy(&m->ctx);
}

// "key":value, (%.6f), or "key":null, when v is not finite.
static void json_number_field(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, "\"%s\":%.6f,", key, v);
  else
    fprintf(f, "\"%s\":null,", key);
}

void knn_result_write_line(FILE *f, long step, const char *what, const char *source,
                           const KnnResult *r) {
  fprintf(f, "{\"step\":%ld,\"what\":\"%s\",", step, what);
  if (source) {
    fprintf(f, "\"source\":");
    json_put_string(f, source);
    fputc(',', f);
  }
  json_number_field(f, "knn_top1", r->top1);
  json_number_field(f, "knn_top1_k20", r->top1_k20);
  if (r->knn_k > 0 && isfinite(r->top1))
    fprintf(f, "\"knn_k\":%d,", r->knn_k);
  else
    fprintf(f, "\"knn_k\":null,");
  if (isfinite(r->linear_top1)) fprintf(f, "\"linear_top1\":%.6f,", r->linear_top1);
  if (strcmp(what, "encoder") == 0) {
    json_number_field(f, "rankme", r->quality.rankme);
    json_number_field(f, "embedding_std", r->quality.embedding_std);
    json_number_field(f, "embedding_std_reference", r->quality.embedding_std_reference);
    fprintf(f, "\"collapsed\":%s,", embedding_quality_collapsed(&r->quality) ? "true" : "false");
  }
  fprintf(f, "\"seconds\":%.3f}\n", r->seconds);
}
