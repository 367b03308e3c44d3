#include "io/param_tensors.h"

#include <stdint.h>
#include <stdio.h>

void st_add_paramset(StFile *s, const char *prefix, const ParamSet *ps) {
  for (int i = 0; i < ps->n_entries; i++) {
    const ParamEntry *e = &ps->entries[i];
    char name[ST_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, e->name);
    int64_t dims[PARAM_MAX_DIMS];
    for (int d = 0; d < e->ndim; d++) dims[d] = e->shape[d];
    st_add(s, name, ST_F32, e->ndim, dims, ps->data + e->offset);
  }
}
