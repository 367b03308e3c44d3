// Measures of an encoder's embeddings that need no labels: how many directions they use and how
// spread they are, which fall together when an encoder collapses (every image mapped to nearly
// the same point).
#pragma once
#include <stddef.h>

#include "core/exec_ctx.h"

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
// eigenvalues of their Gram matrix on the smaller side, (d, d) or (rows, rows) (a oneDNN matmul,
// then Householder tridiagonalization and implicit QL in double: a second at d = 2048, where
// cyclic Jacobi rotations took minutes). -1 with tl_last_error() on sizes out of range or
// non-finite values. Its buffers are MEM_EVAL, all held until it returns, and the oneDNN scratchpad
// is ctx's.
int embedding_quality(const float *feat, int n, int d, ExecCtx *ctx, EmbeddingQuality *q);

// The MEM_EVAL bytes embedding_quality holds at its peak for n embeddings of d dimensions.
size_t embedding_quality_eval_bytes(int n, int d);
// Grows ctx's scratchpad as embedding_quality(n, d) would, so `tally plan` sees what it leaves.
void embedding_quality_reserve_scratchpad(ExecCtx *ctx, int n, int d);

// Collapsed: embedding_std below 5% of 1/sqrt(d) (NaN is not collapsed). Measured on
// resnet-small and vit-tiny backbones (Fashion-MNIST, 1024 images): untrained encoders read 14%
// and 19%, every shipped contrastive or distilling recipe after 20 to 60 steps 25% to 44%, an
// unstable inbatch (lr 30) 14% to 22%, mae after one epoch 33%; byol with the online network as
// its own target (tau 0, weight decay 1) collapsed to 2.8% (rankme 2.1), then 1.0% (1.1), and
// mae's cls token in a 60-step run sat at 1.0% to 1.5%. 5% is near the geometric mean of 2.8%
// and 14%.
#define QUALITY_COLLAPSED_FRACTION 0.05
int embedding_quality_collapsed(const EmbeddingQuality *q);
