#include "eval/quality.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "ops/matmul.h"

// Householder reduction of the symmetric (n, n) matrix a (destroyed; only its lower triangle is
// read) to a tridiagonal one with the same eigenvalues: diagonal diag[0..n), sub-diagonal
// off[1..n) (off[0] = 0). About 2/3 n^3 multiply-adds.
static void tridiagonalize(double *a, int n, double *diag, double *off) {
#define A(r, c) a[(size_t)(r)*n + (c)]
  for (int i = n - 1; i > 0; i--) {
    const int l = i - 1;
    double h = 0, scale = 0;
    for (int k = 0; k <= l; k++) scale += fabs(A(i, k));
    if (l == 0 || scale == 0) {  // nothing to annihilate left of the sub-diagonal
      off[i] = A(i, l);
      continue;
    }
    for (int k = 0; k <= l; k++) A(i, k) /= scale, h += A(i, k) * A(i, k);
    double f = A(i, l), g = f >= 0 ? -sqrt(h) : sqrt(h);
    off[i] = scale * g;
    h -= f * g;
    A(i, l) = f - g;  // row i, 0..l, is now the Householder vector u; P = I - u u^T / h
    f = 0;
    for (int j = 0; j <= l; j++) {  // p = A u / h into off[0..l], K = u^T p / 2h
      g = 0;
      for (int k = 0; k <= j; k++) g += A(j, k) * A(i, k);
      for (int k = j + 1; k <= l; k++) g += A(k, j) * A(i, k);
      off[j] = g / h;
      f += off[j] * A(i, j);
    }
    const double hh = f / (h + h);
    for (int j = 0; j <= l; j++) {  // A -= u q^T + q u^T with q = p - K u, lower triangle
      f = A(i, j);
      off[j] = g = off[j] - hh * f;
      for (int k = 0; k <= j; k++) A(j, k) -= f * off[k] + g * A(i, k);
    }
  }
  for (int i = 0; i < n; i++) diag[i] = A(i, i);
  off[0] = 0;
#undef A
}

// The eigenvalues of the symmetric tridiagonal matrix (diag, off as tridiagonalize leaves them)
// into diag, by the QL algorithm with implicit Wilkinson shifts; off is destroyed.
static void tridiagonal_eigenvalues(double *diag, double *off, int n) {
  for (int i = 1; i < n; i++) off[i - 1] = off[i];
  off[n - 1] = 0;
  for (int l = 0; l < n; l++) {
    for (int iter = 0; iter < 64; iter++) {
      int m = l;  // the first negligible off-diagonal entry from l on splits the matrix
      while (m < n - 1 && fabs(off[m]) > DBL_EPSILON * (fabs(diag[m]) + fabs(diag[m + 1]))) m++;
      if (m == l) break;
      double g = (diag[l + 1] - diag[l]) / (2 * off[l]), r = hypot(g, 1);
      g = diag[m] - diag[l] + off[l] / (g + copysign(r, g));
      double s = 1, c = 1, p = 0;
      int i;
      for (i = m - 1; i >= l; i--) {
        double f = s * off[i], b = c * off[i];
        off[i + 1] = r = hypot(f, g);
        if (r == 0) {  // underflow: deflate and start again
          diag[i + 1] -= p;
          off[m] = 0;
          break;
        }
        s = f / r;
        c = g / r;
        g = diag[i + 1] - p;
        r = (diag[i] - g) * s + 2 * c * b;
        diag[i + 1] = g + (p = s * r);
        g = c * r - b;
      }
      if (r == 0 && i >= l) continue;
      diag[l] -= p;
      off[l] = g;
      off[m] = 0;
    }
  }
}

// RankMe reads an even sample of at most QUALITY_SAMPLE of the n rows.
static int rankme_rows(int n) { return n < QUALITY_SAMPLE ? n : QUALITY_SAMPLE; }
// The side of the Gram matrix whose eigenvalues give the sample's singular values.
static int gram_side(int n, int d) { return rankme_rows(n) < d ? rankme_rows(n) : d; }

static void gram_init(Matmul *mm, ExecCtx *ctx, int m, int d) {
  if (m < d)
    matmul_init(mm, ctx, m, d, m, 0, 1, COMP_OTHER, 0);  // rows rows^T
  else
    matmul_init(mm, ctx, d, m, d, 1, 0, COMP_OTHER, 0);  // rows^T rows
}

int embedding_quality(const float *feat, int n, int d, ExecCtx *ctx, EmbeddingQuality *q) {
  if (n < 2 || d < 1 || d > 4096)
    return tl_fail("embedding quality: %d embeddings of %d dimensions (need 2 or more, 1..4096)", n,
                   d);
  for (size_t i = 0; i < (size_t)n * d; i++)
    if (!isfinite(feat[i]))
      return tl_fail("embedding quality: embedding value %zu is %g", i, feat[i]);
  // The spread: every embedding, L2-normalized.
  // Every buffer is evaluation memory, held until the end: embedding_quality_eval_bytes.
  double *sum = tl_alloc(sizeof(double) * d, MEM_EVAL, COMP_OTHER),
         *sum_sq = tl_alloc(sizeof(double) * d, MEM_EVAL, COMP_OTHER);
  for (int i = 0; i < n; i++) {
    const float *x = feat + (size_t)i * d;
    double norm = 0;
    for (int k = 0; k < d; k++) norm += (double)x[k] * x[k];
    norm = norm > 0 ? sqrt(norm) : 1;
    for (int k = 0; k < d; k++) {
      const double u = x[k] / norm;
      sum[k] += u;
      sum_sq[k] += u * u;
    }
  }
  double spread = 0;
  for (int k = 0; k < d; k++) {
    const double mean = sum[k] / n, var = sum_sq[k] / n - mean * mean;
    spread += sqrt(var > 0 ? var : 0);
  }
  // The singular values of an even sample of QUALITY_SAMPLE rows: the square roots of the
  // eigenvalues of their Gram matrix on the smaller side, rows^T rows (d, d) or rows rows^T
  // (m, m) when there are fewer rows than dimensions (the other d - m singular values are 0),
  // the product on oneDNN.
  const int m = rankme_rows(n), r = gram_side(n, d);
  float *rows = tl_alloc(sizeof(float) * (size_t)m * d, MEM_EVAL, COMP_OTHER),
        *gram32 = tl_alloc(sizeof(float) * (size_t)r * r, MEM_EVAL, COMP_OTHER);
  double *gram = tl_alloc(sizeof(double) * (size_t)r * r, MEM_EVAL, COMP_OTHER),
         *eig = tl_alloc(sizeof(double) * 2 * d, MEM_EVAL, COMP_OTHER);
  for (int i = 0; i < m; i++)
    memcpy(rows + (size_t)i * d, feat + (size_t)((long long)i * n / m) * d, sizeof(float) * d);
  Matmul mm;
  gram_init(&mm, ctx, m, d);
  matmul_run(&mm, ctx, rows, rows, gram32);
  matmul_destroy(&mm);
  for (size_t i = 0; i < (size_t)r * r; i++) gram[i] = gram32[i];
  for (int k = 0; k < 2 * d; k++) eig[k] = 0;
  tridiagonalize(gram, r, eig, eig + d);  // reads the lower triangle only
  tridiagonal_eigenvalues(eig, eig + d, r);
  double total = 0;
  for (int k = 0; k < d; k++) total += eig[k] = sqrt(eig[k] > 0 ? eig[k] : 0);
  double entropy = 0;
  for (int k = 0; k < d; k++) {
    const double p = (total > 0 ? eig[k] / total : 0) + 1e-7;
    entropy -= p * log(p);
  }
  q->rankme = exp(entropy);
  q->embedding_std = spread / d;
  q->embedding_std_reference = 1 / sqrt((double)d);
  tl_free(rows);
  tl_free(gram32);
  tl_free(gram);
  tl_free(eig);
  tl_free(sum);
  tl_free(sum_sq);
  return 0;
}

size_t embedding_quality_eval_bytes(int n, int d) {
  const size_t rows = (size_t)rankme_rows(n) * d,
               square = (size_t)gram_side(n, d) * gram_side(n, d);
  return sizeof(float) * (rows + square) + sizeof(double) * (square + 4 * (size_t)d);
}

void embedding_quality_reserve_scratchpad(ExecCtx *ctx, int n, int d) {
  Matmul mm;
  gram_init(&mm, ctx, rankme_rows(n), d);
  matmul_destroy(&mm);
}
int embedding_quality_collapsed(const EmbeddingQuality *q) {
  return q->embedding_std < QUALITY_COLLAPSED_FRACTION * q->embedding_std_reference;
}
