#include "train/optim.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

// Entries are cut into chunks of at most this many floats so the parallel loop balances a few
// large weight tensors against many small biases; every result depends only on the chunk plan,
// never on the thread count.
enum { CHUNK_FLOATS = 1 << 14 };

typedef struct {
  int entry;
  size_t begin, end;  // element range in the flat block
} Chunk;

struct OptimPrivate {
  Chunk *chunks;  // (n_chunks) covering every non-buffer entry, in entry order
  int n_chunks;
  int n_entries;  // the set's entry count at creation
  // LARS only: squared norms of p and of the decayed gradient, per chunk then per entry.
  double *chunk_sq;  // (n_chunks, 2)
  float *trust;      // (n_entries)
};

static const struct {
  const char *name;
  OptimKind kind;
  int state_buffers;  // floats of state per parameter
} optim_table[] = {
    {"sgd", OPTIM_SGD, 1},
    {"lars", OPTIM_LARS, 1},
    {"adamw", OPTIM_ADAMW, 2},
};
enum { N_OPTIMS = sizeof optim_table / sizeof optim_table[0] };

static int optim_lookup(const char *name) {
  for (int i = 0; i < N_OPTIMS; i++)
    if (strcmp(name, optim_table[i].name) == 0) return i;
  return -1;
}

size_t optim_state_bytes(const char *name, size_t param_count) {
  int i = optim_lookup(name);
  return i < 0 ? 0 : (size_t)optim_table[i].state_buffers * param_count * sizeof(float);
}

static int check_hyper(const char *name, OptimKind kind, float lr, float momentum,
                       float weight_decay, float beta1, float beta2, float eps, float lars_eta) {
  if (!(lr >= 0)) return tl_fail("optim.lr: %g must be >= 0", lr);
  if (!(weight_decay >= 0)) return tl_fail("optim.weight_decay: %g must be >= 0", weight_decay);
  if (kind != OPTIM_ADAMW && !(momentum >= 0 && momentum < 1))
    return tl_fail("optim.momentum: %g must be in [0, 1) for %s", momentum, name);
  if (kind == OPTIM_LARS && !(lars_eta > 0))
    return tl_fail("optim.lars_eta: %g must be > 0", lars_eta);
  if (kind == OPTIM_ADAMW) {
    if (!(beta1 >= 0 && beta1 < 1)) return tl_fail("optim.beta1: %g must be in [0, 1)", beta1);
    if (!(beta2 >= 0 && beta2 < 1)) return tl_fail("optim.beta2: %g must be in [0, 1)", beta2);
    if (!(eps > 0)) return tl_fail("optim.eps: %g must be > 0", eps);
  }
  return 0;
}

static void plan_chunks(struct OptimPrivate *priv, const ParamSet *ps) {
  int n = 0;
  for (int e = 0; e < ps->n_entries; e++)
    if (!ps->entries[e].is_buffer)
      n += (int)((ps->entries[e].count + CHUNK_FLOATS - 1) / CHUNK_FLOATS);
  priv->chunks = malloc(sizeof(Chunk) * (size_t)(n ? n : 1));
  if (!priv->chunks) TL_DIE("out of memory");
  priv->n_chunks = 0;
  for (int e = 0; e < ps->n_entries; e++) {
    const ParamEntry *pe = &ps->entries[e];
    if (pe->is_buffer) continue;
    for (size_t b = 0; b < pe->count; b += CHUNK_FLOATS) {
      size_t end = b + CHUNK_FLOATS < pe->count ? b + CHUNK_FLOATS : pe->count;
      priv->chunks[priv->n_chunks++] = (Chunk){e, pe->offset + b, pe->offset + end};
    }
  }
  priv->n_entries = ps->n_entries;
}

Optimizer *optim_create(const char *name, ParamSet *ps, float lr, float momentum,
                        float weight_decay, float beta1, float beta2, float eps, float lars_eta) {
  int idx = optim_lookup(name);
  if (idx < 0) {
    tl_fail("optim.name: unknown optimizer '%s' (sgd, lars or adamw)", name);
    return NULL;
  }
  OptimKind kind = optim_table[idx].kind;
  if (check_hyper(name, kind, lr, momentum, weight_decay, beta1, beta2, eps, lars_eta) < 0)
    return NULL;
  if (!ps->grad) {
    tl_fail("optim: parameter set has no gradients to step from");
    return NULL;
  }
  Optimizer *opt = calloc(1, sizeof *opt);
  struct OptimPrivate *priv = calloc(1, sizeof *priv);
  if (!opt || !priv) TL_DIE("out of memory");
  *opt = (Optimizer){.kind = kind,
                     .ps = ps,
                     .lr = lr,
                     .momentum = momentum,
                     .weight_decay = weight_decay,
                     .beta1 = beta1,
                     .beta2 = beta2,
                     .eps = eps,
                     .lars_eta = lars_eta,
                     .backbone_lr_scale = 1.0f,
                     .priv = priv};
  opt->momentum_buf = tl_alloc(ps->count * sizeof(float), MEM_OPTIM, COMP_OTHER);
  if (kind == OPTIM_ADAMW)
    opt->second_moment = tl_alloc(ps->count * sizeof(float), MEM_OPTIM, COMP_OTHER);
  plan_chunks(priv, ps);
  if (kind == OPTIM_LARS) {
    priv->chunk_sq = malloc(sizeof(double) * 2 * (size_t)(priv->n_chunks ? priv->n_chunks : 1));
    priv->trust = malloc(sizeof(float) * (size_t)(ps->n_entries ? ps->n_entries : 1));
    if (!priv->chunk_sq || !priv->trust) TL_DIE("out of memory");
  }
  return opt;
}

Optimizer *optim_create_from_config(const Config *cfg, ParamSet *ps) {
  return optim_create(cfg->optim.name, ps, config_lr(cfg), cfg->optim.momentum,
                      cfg->optim.weight_decay, cfg->optim.beta1, cfg->optim.beta2, cfg->optim.eps,
                      cfg->optim.lars_eta);
}

static float entry_decay(const Optimizer *opt, int entry) {
  return opt->ps->entries[entry].no_decay ? 0.0f : opt->weight_decay;
}

static int chunk_frozen(const Optimizer *opt, const Chunk *ch) {
  return opt->backbone_frozen && ch->begin < opt->backbone_floats;
}

// A chunk's learning rate: the step's, scaled for the backbone's (chunks never straddle the
// backbone's end: it ends an entry).
static float chunk_lr(const Optimizer *opt, const Chunk *ch, float lr) {
  return ch->begin < opt->backbone_floats ? lr * opt->backbone_lr_scale : lr;
}

// PyTorch SGD (dampening 0, no Nesterov): g = grad + wd*p; buf = momentum*buf + g; p -= lr*buf.
// PyTorch sets buf = g on the first step; the zero-initialized buffer gives exactly that.
static void sgd_step(Optimizer *opt, float lr) {
  const struct OptimPrivate *priv = opt->priv;
  float *p = opt->ps->data, *grad = opt->ps->grad, *buf = opt->momentum_buf;
  const float mom = opt->momentum;
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < priv->n_chunks; c++) {
    const Chunk ch = priv->chunks[c];
    if (chunk_frozen(opt, &ch)) continue;
    const float wd = entry_decay(opt, ch.entry), step_lr = chunk_lr(opt, &ch, lr);
    for (size_t i = ch.begin; i < ch.end; i++) {
      float g = grad[i] + wd * p[i];
      buf[i] = mom * buf[i] + g;
      p[i] -= step_lr * buf[i];
    }
  }
}

// LARS as in the SimCLR TensorFlow code (classic momentum, no Nesterov), per tensor:
//   g     = grad + wd*p                                 (no_decay tensors: wd = 0)
//   trust = eta*||p||/||g||  if ||p|| > 0 and ||g|| > 0, else 1   (no_decay tensors: 1)
//   buf   = momentum*buf + lr*trust*g
//   p     = p - buf
static void lars_step(Optimizer *opt, float lr) {
  struct OptimPrivate *priv = opt->priv;
  const ParamSet *ps = opt->ps;
  float *p = ps->data, *grad = ps->grad, *buf = opt->momentum_buf;
  const float mom = opt->momentum;
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < priv->n_chunks; c++) {
    const Chunk ch = priv->chunks[c];
    const float wd = entry_decay(opt, ch.entry);
    double p_sq = 0, g_sq = 0;
    for (size_t i = ch.begin; i < ch.end; i++) {
      float g = grad[i] + wd * p[i];
      p_sq += (double)p[i] * p[i];
      g_sq += (double)g * g;
    }
    priv->chunk_sq[2 * c] = p_sq;
    priv->chunk_sq[2 * c + 1] = g_sq;
  }
  // Chunks of one entry are consecutive, so summing them in order keeps the norms independent of
  // the thread count.
  for (int e = 0; e < ps->n_entries; e++) priv->trust[e] = 1.0f;
  for (int c = 0; c < priv->n_chunks;) {
    int e = priv->chunks[c].entry;
    double p_sq = 0, g_sq = 0;
    for (; c < priv->n_chunks && priv->chunks[c].entry == e; c++) {
      p_sq += priv->chunk_sq[2 * c];
      g_sq += priv->chunk_sq[2 * c + 1];
    }
    if (!ps->entries[e].no_decay && p_sq > 0 && g_sq > 0)
      priv->trust[e] = (float)(opt->lars_eta * sqrt(p_sq) / sqrt(g_sq));
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < priv->n_chunks; c++) {
    const Chunk ch = priv->chunks[c];
    if (chunk_frozen(opt, &ch)) continue;
    const float wd = entry_decay(opt, ch.entry);
    const float scaled_lr = chunk_lr(opt, &ch, lr) * priv->trust[ch.entry];
    for (size_t i = ch.begin; i < ch.end; i++) {
      float g = grad[i] + wd * p[i];
      buf[i] = mom * buf[i] + scaled_lr * g;
      p[i] -= buf[i];
    }
  }
}

// PyTorch AdamW at step t (1-based):
//   p -= lr*wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
static void adamw_step(Optimizer *opt, float lr) {
  const struct OptimPrivate *priv = opt->priv;
  float *p = opt->ps->data, *grad = opt->ps->grad;
  float *m = opt->momentum_buf, *v = opt->second_moment;
  const long t = opt->steps_done + 1;
  const float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
  const float step_size = (float)(lr / (1.0 - pow(b1, (double)t)));
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(b2, (double)t)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < priv->n_chunks; c++) {
    const Chunk ch = priv->chunks[c];
    const float keep = 1.0f - lr * entry_decay(opt, ch.entry);
    for (size_t i = ch.begin; i < ch.end; i++) {
      float g = grad[i];
      p[i] *= keep;
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
    }
  }
}

void optim_step(Optimizer *opt, float lr) {
  // The chunk plan was made from the entries at creation; a later take would go unoptimized.
  TL_ASSERT(opt->ps->n_entries == opt->priv->n_entries);
  // adamw's bias correction counts the block's updates, which a frozen part would miss.
  TL_ASSERT(!opt->backbone_frozen || opt->kind != OPTIM_ADAMW);
  switch (opt->kind) {
    case OPTIM_SGD:
      sgd_step(opt, lr);
      break;
    case OPTIM_LARS:
      lars_step(opt, lr);
      break;
    case OPTIM_ADAMW:
      adamw_step(opt, lr);
      break;
  }
  opt->steps_done++;
}

void optim_state(Optimizer *opt, StFile *s) {
  int64_t n = (int64_t)opt->ps->count;
  st_add(s, "optim.momentum", ST_F32, 1, &n, opt->momentum_buf);
  if (opt->second_moment) st_add(s, "optim.second_moment", ST_F32, 1, &n, opt->second_moment);
  // long is 64-bit on every platform Tally builds on (LP64).
  _Static_assert(sizeof opt->steps_done == sizeof(int64_t), "steps_done is saved as I64");
  st_add(s, "optim.steps_done", ST_I64, 0, NULL, &opt->steps_done);
}

void optim_destroy(Optimizer *opt) {
  if (!opt) return;
  tl_free(opt->momentum_buf);
  tl_free(opt->second_moment);
  free(opt->priv->chunks);
  free(opt->priv->chunk_sq);
  free(opt->priv->trust);
  free(opt->priv);
  free(opt);
}

float backbone_lr_scale_at(int step, int freeze_steps, int warmup_steps) {
  if (freeze_steps <= 0 || step < freeze_steps) return 1.0f;
  // The schedule's own warm-up, counted from the end of the freeze, to a peak of 1.
  return lr_at_step(1.0f, step - freeze_steps, warmup_steps, INT_MAX, "constant");
}

float lr_at_step(float peak_lr, int step, int warmup_steps, int total_steps, const char *schedule) {
  if (step < warmup_steps) return (float)((double)(step + 1) / warmup_steps * peak_lr);
  if (strcmp(schedule, "constant") == 0) return peak_lr;
  if (strcmp(schedule, "cosine") != 0) TL_DIE("unknown learning-rate schedule '%s'", schedule);
  int decay_steps = total_steps - warmup_steps;
  if (step >= total_steps || decay_steps <= 0) return 0.0f;
  double progress = (double)(step - warmup_steps) / decay_steps;
  return (float)(0.5 * peak_lr * (1.0 + cos(M_PI * progress)));
}
