#include "eval/quality.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "ops/matmul.h"

// Eigenvalues of the symmetric (d, d) matrix a (destroyed) into eig: cyclic Jacobi rotations
// until every off-diagonal entry is negligible against the diagonal.
static void symmetric_eigenvalues(double *a, int d, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0, diag = 0;
    for (int p = 0; p < d; p++) {
      diag += a[(size_t)p * d + p] * a[(size_t)p * d + p];
      for (int q = p + 1; q < d; q++) off += a[(size_t)p * d + q] * a[(size_t)p * d + q];
    }
    if (off <= 1e-30 * (diag > 0 ? diag : 1)) break;
    for (int p = 0; p < d; p++)
      for (int q = p + 1; q < d; q++) {
        const double apq = a[(size_t)p * d + q];
        if (fabs(apq) < 1e-300) continue;
        const double app = a[(size_t)p * d + p], aqq = a[(size_t)q * d + q];
        const double theta = (aqq - app) / (2 * apq);
        const double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
        const double c = 1 / sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < d; k++) {  // columns p and q
          const double akp = a[(size_t)k * d + p], akq = a[(size_t)k * d + q];
          a[(size_t)k * d + p] = c * akp - s * akq;
          a[(size_t)k * d + q] = s * akp + c * akq;
        }
        for (int k = 0; k < d; k++) {  // rows p and q
          const double apk = a[(size_t)p * d + k], aqk = a[(size_t)q * d + k];
          a[(size_t)p * d + k] = c * apk - s * aqk;
          a[(size_t)q * d + k] = s * apk + c * aqk;
        }
      }
  }
  for (int p = 0; p < d; p++) eig[p] = a[(size_t)p * d + p];
}

// RankMe reads an even sample of at most QUALITY_SAMPLE of the n rows.
static int rankme_rows(int n) { return n < QUALITY_SAMPLE ? n : QUALITY_SAMPLE; }

int embedding_quality(const float *feat, int n, int d, DnnlCtx *ctx, EmbeddingQuality *q) {
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
  // The singular values of an even sample of QUALITY_SAMPLE rows: the eigenvalues of its Gram
  // matrix, the product on oneDNN.
  const int m = rankme_rows(n);
  float *rows = tl_alloc(sizeof(float) * (size_t)m * d, MEM_EVAL, COMP_OTHER),
        *gram32 = tl_alloc(sizeof(float) * (size_t)d * d, MEM_EVAL, COMP_OTHER);
  double *gram = tl_alloc(sizeof(double) * (size_t)d * d, MEM_EVAL, COMP_OTHER),
         *eig = tl_alloc(sizeof(double) * d, MEM_EVAL, COMP_OTHER);
  for (int i = 0; i < m; i++)
    memcpy(rows + (size_t)i * d, feat + (size_t)((long long)i * n / m) * d, sizeof(float) * d);
  Matmul mm;
  matmul_init(&mm, ctx, d, m, d, 1, 0, COMP_OTHER, 0);
  matmul_run(&mm, ctx, rows, rows, gram32);
  matmul_destroy(&mm);
  for (size_t i = 0; i < (size_t)d * d; i++) gram[i] = gram32[i];
  for (int k = 0; k < d; k++)  // exactly symmetric, whatever the kernel's summation order
    for (int l = 0; l < k; l++) gram[(size_t)k * d + l] = gram[(size_t)l * d + k];
  symmetric_eigenvalues(gram, d, eig);
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
  const size_t rows = (size_t)rankme_rows(n) * d, square = (size_t)d * d;
  return sizeof(float) * (rows + square) + sizeof(double) * (square + 3 * (size_t)d);
}

void embedding_quality_reserve_scratchpad(DnnlCtx *ctx, int n, int d) {
  Matmul mm;
  matmul_init(&mm, ctx, d, rankme_rows(n), d, 1, 0, COMP_OTHER, 0);
  matmul_destroy(&mm);
}

int embedding_quality_collapsed(const EmbeddingQuality *q) {
  return q->embedding_std < QUALITY_COLLAPSED_FRACTION * q->embedding_std_reference;
}
