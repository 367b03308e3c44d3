#include "ledger/record.h"

#include <math.h>

// One table drives both writers, so JSON and CSV can never disagree on names or values.
typedef enum { F_LONG, F_INT, F_SIZE, F_DOUBLE, F_STRING } FieldType;
typedef struct {
  const char *name;
  FieldType type;
  size_t offset;
} Field;

#define FIELD(name, type) {#name, type, offsetof(LedgerRecord, name)}
#define FIELD_AT(label, member, type) {label, type, offsetof(LedgerRecord, member)}

static const Field fields[] = {
    FIELD(step, F_LONG),
    FIELD(epoch, F_INT),
    FIELD(objective, F_STRING),
    FIELD(replicas, F_INT),
    FIELD(lr, F_DOUBLE),
    FIELD(loss, F_DOUBLE),
    FIELD(images_source, F_LONG),
    FIELD(views_grad, F_LONG),
    FIELD(views_nograd, F_LONG),
    FIELD(patches_total, F_LONG),
    FIELD(patches_encoded, F_LONG),
    FIELD(patches_decoded, F_LONG),
    FIELD(negatives_per_query, F_LONG),
    FIELD(positives_per_query, F_LONG),
    FIELD(activation_bytes, F_SIZE),
    FIELD_AT("activation_encoder_bytes", activation_bytes_by[COMP_ENCODER], F_SIZE),
    FIELD_AT("activation_head_bytes", activation_bytes_by[COMP_HEAD], F_SIZE),
    FIELD_AT("activation_decoder_bytes", activation_bytes_by[COMP_DECODER], F_SIZE),
    FIELD_AT("activation_loss_bytes", activation_bytes_by[COMP_LOSS], F_SIZE),
    FIELD(activation_grad_bytes, F_SIZE),
    FIELD(param_bytes, F_SIZE),
    FIELD(grad_bytes, F_SIZE),
    FIELD(optimizer_bytes, F_SIZE),
    FIELD(momentum_encoder_bytes, F_SIZE),
    FIELD(workspace_bytes, F_SIZE),
    FIELD(data_bytes, F_SIZE),
    FIELD(queue_vectors, F_LONG),
    FIELD(queue_random_vectors, F_LONG),
    FIELD(queue_bytes, F_SIZE),
    FIELD(queue_oldest_age_steps, F_DOUBLE),
    FIELD(queue_mean_age_steps, F_DOUBLE),
    FIELD(momentum_distance, F_DOUBLE),
    FIELD(encodings_next_new, F_LONG),
    FIELD(encodings_next_reused, F_LONG),
    FIELD(flops_forward, F_DOUBLE),
    FIELD(flops_backward, F_DOUBLE),
    FIELD_AT("flops_forward_encoder", flops_forward_by[COMP_ENCODER], F_DOUBLE),
    FIELD_AT("flops_forward_head", flops_forward_by[COMP_HEAD], F_DOUBLE),
    FIELD_AT("flops_forward_decoder", flops_forward_by[COMP_DECODER], F_DOUBLE),
    FIELD_AT("flops_forward_loss", flops_forward_by[COMP_LOSS], F_DOUBLE),
    FIELD_AT("flops_backward_encoder", flops_backward_by[COMP_ENCODER], F_DOUBLE),
    FIELD_AT("flops_backward_head", flops_backward_by[COMP_HEAD], F_DOUBLE),
    FIELD_AT("flops_backward_decoder", flops_backward_by[COMP_DECODER], F_DOUBLE),
    FIELD_AT("flops_backward_loss", flops_backward_by[COMP_LOSS], F_DOUBLE),
    FIELD(comm_bytes, F_DOUBLE),
    FIELD(comm_allreduce_bytes, F_DOUBLE),
    FIELD(comm_allgather_bytes, F_DOUBLE),
    FIELD(shard_samples, F_INT),
    FIELD(shard_weight, F_DOUBLE),
    FIELD(data_ms, F_DOUBLE),
    FIELD(forward_ms, F_DOUBLE),
    FIELD(backward_ms, F_DOUBLE),
    FIELD(comm_ms, F_DOUBLE),
    FIELD(optimizer_ms, F_DOUBLE),
    FIELD(step_ms, F_DOUBLE),
    FIELD(images_per_s, F_DOUBLE),
    FIELD(peak_rss_bytes, F_SIZE),
};
enum { N_FIELDS = sizeof fields / sizeof fields[0] };

static void write_value(FILE *f, const LedgerRecord *r, const Field *fd, int json) {
  const char *p = (const char *)r + fd->offset;
  switch (fd->type) {
    case F_LONG: fprintf(f, "%ld", *(const long *)p); break;
    case F_INT: fprintf(f, "%d", *(const int *)p); break;
    case F_SIZE: fprintf(f, "%zu", *(const size_t *)p); break;
    case F_DOUBLE: {
      double v = *(const double *)p;
      if (isfinite(v))
        fprintf(f, "%.9g", v);
      else
        fputs(json ? "null" : "", f);  // JSON has no NaN; an empty CSV cell reads as missing
      break;
    }
    case F_STRING: {
      const char *s = *(const char *const *)p;
      fprintf(f, json ? "\"%s\"" : "%s", s ? s : "");
      break;
    }
  }
}

void ledger_write_json(FILE *f, const LedgerRecord *r) {
  fputc('{', f);
  for (int i = 0; i < N_FIELDS; i++) {
    fprintf(f, "%s\"%s\":", i ? "," : "", fields[i].name);
    write_value(f, r, &fields[i], 1);
  }
  fputs("}\n", f);
}

void ledger_write_csv_header(FILE *f) {
  for (int i = 0; i < N_FIELDS; i++) fprintf(f, "%s%s", i ? "," : "", fields[i].name);
  fputc('\n', f);
}

void ledger_write_csv(FILE *f, const LedgerRecord *r) {
  for (int i = 0; i < N_FIELDS; i++) {
    if (i) fputc(',', f);
    write_value(f, r, &fields[i], 0);
  }
  fputc('\n', f);
}
