#include "run/run_state.h"

#include <math.h>
#include <stdio.h>

#include "io/atomic_file.h"

int run_write_summary(Run *run) {
  AtomicFile a;
  if (atomic_open(&a, run->path_summary) != 0) return -1;
  FILE *f = a.f;
  const Config *cfg = run->cfg;
  fprintf(f, "{\n  \"objective\": \"%s\",\n  \"backbone\": \"%s\",\n", run->layout.def->name,
          cfg->model.spec.type);
  fprintf(f, "  \"steps\": %d,\n  \"epochs\": %.4f,\n  \"batch_size\": %d,\n  \"replicas\": %d,\n",
          run->steps_done, (double)run->steps_done / run->layout.steps_per_epoch,
          run->layout.global_batch, run->layout.world);
  // The results depend on it (oneDNN's reductions split by thread): said beside them.
  fprintf(f, "  \"threads_per_replica\": %d,\n", run_threads_per_replica(run->layout.world));
  if (isfinite(run->final_loss))
    fprintf(f, "  \"final_loss\": %.9g,\n", run->final_loss);
  else
    fprintf(f, "  \"final_loss\": null,\n");
  fprintf(f, "  \"images_per_s\": %.3f,\n  \"train_seconds\": %.3f,\n", run->images_per_s,
          run->train_seconds);
  fprintf(f, "  \"peak_rss_bytes\": %zu,\n  \"flops_total\": %.9g,\n", run->peak_rss,
          run->flops_total);
  if (run->opt->planned_peak_bytes)
    fprintf(f, "  \"planned_peak_bytes\": %zu,\n", run->opt->planned_peak_bytes);
  else
    fprintf(f, "  \"planned_peak_bytes\": null,\n");
  if (cfg->train.budget[0]) {
    // How much of the budget the run spent: training seconds, FLOPs or epochs over what was given.
    const Budget *b = &run->budget;
    const double spent = b->kind == BUDGET_SECONDS ? run->train_seconds
                         : b->kind == BUDGET_FLOPS
                             ? run->flops_total
                             : (double)run->steps_done / run->layout.steps_per_epoch;
    fprintf(f, "  \"budget\": \"%s\",\n", cfg->train.budget);
    if (b->amount > 0) fprintf(f, "  \"budget_used\": %.4f,\n", spent / b->amount);
  }
  const KnnResult *last = &run->last_eval;
  if (run->evaluated && isfinite(last->top1))
    fprintf(f, "  \"knn_top1\": %.6f,\n  \"knn_top1_k20\": %.6f,\n", last->top1, last->top1_k20);
  else
    fprintf(f, "  \"knn_top1\": null,\n");
  if (run->evaluated && isfinite(last->linear_top1))
    fprintf(f, "  \"linear_top1\": %.6f,\n", last->linear_top1);
  // The label-free quality of the last evaluation (none with --no-knn).
  if (run->evaluated) {
    const EmbeddingQuality *q = &last->quality;
    const double v[3] = {q->rankme, q->embedding_std, q->embedding_std_reference};
    static const char *const keys[3] = {"rankme", "embedding_std", "embedding_std_reference"};
    for (int i = 0; i < 3; i++)
      if (isfinite(v[i]))
        fprintf(f, "  \"%s\": %.6f,\n", keys[i], v[i]);
      else
        fprintf(f, "  \"%s\": null,\n", keys[i]);
    fprintf(f, "  \"collapsed\": %s,\n", embedding_quality_collapsed(q) ? "true" : "false");
  }
  if (!run->no_knn && isfinite(run->knn_raw.linear_top1))
    fprintf(f, "  \"linear_top1_raw_pixels\": %.6f,\n", run->knn_raw.linear_top1);
  if (run->knn_start_done && isfinite(run->knn_start.top1))
    fprintf(f, "  \"knn_top1_untrained\": %.6f,\n", run->knn_start.top1);
  if (run->no_knn)
    fprintf(f, "  \"knn_top1_raw_pixels\": null\n}\n");
  else
    fprintf(f, "  \"knn_top1_raw_pixels\": %.6f\n}\n", run->knn_raw.top1);
  return atomic_commit(&a);
}
