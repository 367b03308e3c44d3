#include "objectives/ema.h"

#include <math.h>
#include <string.h>

void ema_copy(ParamSet *target, const ParamSet *online) {
  memcpy(target->data, online->data, sizeof(float) * target->count);
}

float ema_momentum_at(float base, const char *schedule, long step, long total_steps) {
  if (strcmp(schedule, "cosine") != 0 || total_steps <= 0) return base;
  double progress = (double)step / (double)total_steps;
  if (progress > 1) progress = 1;
  return (float)(1.0 - (1.0 - base) * (cos(M_PI * progress) + 1.0) / 2.0);
}

double ema_update(ParamSet *target, const ParamSet *online, float m) {
  double diff2 = 0, norm2 = 0;
  for (int e = 0; e < online->n_entries; e++) {
    const ParamEntry *pe = &online->entries[e];
    if (pe->is_buffer) continue;
    float *tk = target->data + pe->offset;
    const float *tq = online->data + pe->offset;
    for (size_t i = 0; i < pe->count; i++) {
      tk[i] = m * tk[i] + (1.0f - m) * tq[i];
      double dd = (double)tk[i] - tq[i];
      diff2 += dd * dd;
      norm2 += (double)tq[i] * tq[i];
    }
  }
  return norm2 > 0 ? sqrt(diff2 / norm2) : 0;
}
