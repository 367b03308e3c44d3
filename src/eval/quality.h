// Measures of an encoder's embeddings that need no labels: how many directions they use and how
// spread they are, which fall together when an encoder collapses (every image mapped to nearly
// the same point).
#pragma once
#include "core/dnnl_ctx.h"

enum { QUALITY_SAMPLE = 4096 };

typedef struct {
  // RankMe (Garrido et al., 2023): exp of the entropy of the singular values of the (n, d)
  // embedding matrix normalized to sum 1 (each plus 1e-7, as the paper). 1 for embeddings on one
  // line, d when every direction carries the same share.
  double rankme;
  // The standard deviation over the images of each dimension of the L2-normalized embeddings,
  // averaged over the dimensions. Embeddings spread evenly over the sphere read 1/sqrt(d)
  // (embedding_std_reference); a collapsed encoder reads near 0.
  double embedding_std;
  double embedding_std_reference;  // 1 / sqrt(d)
} EmbeddingQuality;

// feat: (n, d) row-major, n >= 2, 1 <= d <= 4096. embedding_std over every row; rankme over
// QUALITY_SAMPLE rows spread evenly (all when fewer), its singular values the square roots of the
// eigenvalues of their (d, d) Gram matrix (a oneDNN matmul, then cyclic Jacobi rotations in
// double). -1 with tl_last_error() on sizes out of range or non-finite values.
int embedding_quality(const float *feat, int n, int d, DnnlCtx *ctx, EmbeddingQuality *q);
