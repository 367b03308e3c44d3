#include "run/run_state.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "parallel/agree.h"

// CRC-32 of the training images: their pixels when in memory; streamed, each file's name under
// the root and its size in pixels (a rank reads its own copy, which must list the same images).
static unsigned long data_crc32(const Dataset *d, const char *root) {
  uLong crc = crc32(0L, Z_NULL, 0);
  if (d->pixels) return crc32_z(crc, d->pixels, (size_t)d->n * d->h * d->w * d->c);
  const size_t root_len = strlen(root);
  for (int i = 0; i < d->n; i++) {
    const char *name = d->files[i];
    if (strncmp(name, root, root_len) == 0) name += root_len;
    crc = crc32_z(crc, (const Bytef *)name, strlen(name) + 1);
    const uint16_t size[2] = {d->source_h[i], d->source_w[i]};
    crc = crc32_z(crc, (const Bytef *)size, sizeof size);
  }
  return crc;
}

// What defines this rank's run, for ranks_agree: the objective, the resolved configuration and
// model, where it starts and how long it is, and the training data itself (its size and the
// CRC-32 of its pixels and labels: the same folder mounted at another path is the same data).
int run_ranks_agree(Run *run, Comm *comm) {
  const Dataset *d = &run->train;
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f) TL_DIE("out of memory");
  // The objective, then the configuration: a difference is named by what the user chose.
  fprintf(f, "[run]\nobjective = %s\n", run->layout.def->name);
  fputs(run->config_text, f);
  fputs("[model file]\n", f);
  fputs(run->model_text, f);
  fprintf(f, "[run]\nstart_step = %d\n", run->start_step);
  fprintf(f, "total_steps = %d\nlength_fixed = %d\nstop_at = %ld\nno_knn = %d\n",
          run->length_frozen ? run->layout.total_steps : -1, run->length_frozen, run->opt->stop_at,
          run->no_knn);
  fprintf(f, "flops_spent = %.17g\n", run->flops_total);
  fprintf(f, "[training data]\nimages = %d\nimage = %dx%dx%d\nclasses = %d\n", d->n, d->h, d->w,
          d->c, d->n_classes);
  fprintf(f, "pixels_crc32 = %08lx\nlabels_crc32 = %08lx\n", data_crc32(d, run->cfg->data.train),
          crc32_z(crc32(0L, Z_NULL, 0), (const Bytef *)d->labels, sizeof(int) * (size_t)d->n));
  fclose(f);
  // Rank 0 alone reads the monitor's own set: the others' paths to it need not exist.
  static const char *const paths[] = {"data.train", "data.test", "model.file",
                                      "eval.train", "eval.test", NULL};
  int rc = ranks_agree(comm, text, paths);
  free(text);
  return rc == 0;
}
