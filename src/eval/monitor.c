#include "eval/monitor.h"

#include <math.h>
#include <string.h>

#include "core/timer.h"
#include "eval/knn.h"
#include "eval/linear_probe.h"

static int limit_or_all(int limit, int n) { return limit > 0 && limit < n ? limit : n; }

void knn_monitor_init(KnnMonitor *m, const MonitorSettings *set, const Dataset *train,
                      const Dataset *test, const AugmentParams *aug, float *params) {
  memset(m, 0, sizeof *m);
  m->set = *set;
  m->train = train;
  m->test = test;
  m->aug = aug;
  m->n_train = limit_or_all(set->train_limit, train->n);
  m->n_test = test->n;
  m->batch = set->batch;
  // Everything the monitor allocates, its model's outputs and scratchpad included, is
  // evaluation memory: the training ledger's workspace stays the training step's own.
  tl_alloc_scope_begin(MEM_EVAL);
  dnnl_ctx_init(&m->ctx);
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
  m->train_feat = tl_alloc(sizeof(float) * (size_t)m->n_train * D, MEM_EVAL, COMP_OTHER);
  m->test_feat = tl_alloc(sizeof(float) * (size_t)m->n_test * D, MEM_EVAL, COMP_OTHER);
  tl_alloc_scope_end();
}

static int cancelled(const KnnMonitor *m) { return m->cancel && *m->cancel; }

// Encodes the first n images of ds into feat (n, D); the last partial batch is zero-padded. -1
// with tl_last_error() when an image cannot be decoded.
static int encode_all(KnnMonitor *m, const Dataset *ds, int n, float *feat) {
  const int S = m->set.image_size, C = m->set.channels, D = m->encoder->feature_dim;
  const size_t image_floats = (size_t)S * S * C;
  for (int start = 0; start < n && !cancelled(m); start += m->batch) {
    int count = n - start < m->batch ? n - start : m->batch;
    if (eval_views(ds, start, count, m->aug, m->images) != 0) return -1;
    if (count < m->batch)
      memset(m->images + count * image_floats, 0,
             (m->batch - count) * image_floats * sizeof(float));
    m->encoder->forward(m->encoder, &m->ctx, m->images);
    memcpy(feat + (size_t)start * D, m->encoder->feature, sizeof(float) * (size_t)count * D);
  }
  return 0;
}

static KnnResult vote(KnnMonitor *m, const float *train_feat, const float *test_feat, int d) {
  KnnResult r = {.linear_top1 = NAN};
  const int ks[2] = {m->set.k, 20};
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
  if (encode_all(m, m->train, m->n_train, m->train_feat) != 0 ||
      encode_all(m, m->test, m->n_test, m->test_feat) != 0)
    return (KnnResult){.top1 = NAN, .linear_top1 = NAN, .failed = 1};
  if (cancelled(m)) return (KnnResult){.top1 = NAN, .linear_top1 = NAN, .cancelled = 1};
  KnnResult r = vote(m, m->train_feat, m->test_feat, m->encoder->feature_dim);
  r.seconds = (now_ms() - t0) / 1e3;
  return r;
}

KnnResult knn_monitor_raw_pixels(KnnMonitor *m) {
  double t0 = now_ms();
  const int S = m->set.image_size, C = m->set.channels, d = S * S * C;
  float *train_px = tl_alloc(sizeof(float) * (size_t)m->n_train * d, MEM_EVAL, COMP_OTHER);
  float *test_px = tl_alloc(sizeof(float) * (size_t)m->n_test * d, MEM_EVAL, COMP_OTHER);
  if (eval_views(m->train, 0, m->n_train, m->aug, train_px) != 0 ||
      eval_views(m->test, 0, m->n_test, m->aug, test_px) != 0) {
    tl_free(train_px);
    tl_free(test_px);
    return (KnnResult){.top1 = NAN, .linear_top1 = NAN, .failed = 1};
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
  paramset_free(&m->bound);
  dnnl_ctx_destroy(&m->ctx);
}
