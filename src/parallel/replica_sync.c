#include "parallel/replica_sync.h"

#include <stdlib.h>
#include <string.h>

// Replicas must stay identical; this is checked, not assumed. The checksum is an order-dependent
// hash of the parameters' bits, so any divergence, even in the last bit, shows.
static uint64_t params_checksum(const ParamSet *ps) {
  uint64_t h = 1469598103934665603ULL;
  const uint32_t *bits = (const uint32_t *)ps->data;
  for (size_t i = 0; i < ps->count; i++) h = (h ^ bits[i]) * 1099511628211ULL;
  return h;
}

size_t replica_buffer_floats(const ParamSet *ps) {
  size_t n = 0;
  for (int e = 0; e < ps->n_entries; e++)
    if (ps->entries[e].is_buffer) n += ps->entries[e].count;
  return n;
}

// BatchNorm running statistics are per replica (each normalizes its own shard); averaging them
// by sample count after every step keeps the replicas identical for evaluation and checkpoints.
// All of them go in one exchange: a call per buffer cost a message round each (a ResNet's 21
// buffers were 42 blocking MPI exchanges a step, each waiting out a time slice on a busy host).
void replica_average_buffers(Comm *comm, ParamSet *ps, int samples, float *packed) {
  const size_t n = replica_buffer_floats(ps);
  if (n == 0) return;
  // A plan exchanges the same block without filling it.
  const int planning = comm_dry_run(comm);
  for (size_t e = 0, at = 0; e < (size_t)ps->n_entries && !planning; e++) {
    const ParamEntry *pe = &ps->entries[e];
    if (!pe->is_buffer) continue;
    memcpy(packed + at, ps->data + pe->offset, sizeof(float) * pe->count);
    at += pe->count;
  }
  comm_allreduce_weighted(comm, packed, n, samples);
  for (size_t e = 0, at = 0; e < (size_t)ps->n_entries && !planning; e++) {
    const ParamEntry *pe = &ps->entries[e];
    if (!pe->is_buffer) continue;
    memcpy(ps->data + pe->offset, packed + at, sizeof(float) * pe->count);
    at += pe->count;
  }
}

// Gathers every replica's checksum; returns the first rank that differs from rank 0, or -1.
int replica_check_identical(Comm *comm, const ParamSet *ps) {
  int world = comm_size(comm);
  // A plan sends the same exchange over parameters it never filled.
  uint64_t mine = comm_dry_run(comm) ? 0 : params_checksum(ps);
  // Exchanged as two floats' worth of bits per 32-bit half, through the float allgather.
  float local[2], *all = calloc((size_t)world * 2, sizeof(float));
  memcpy(local, &mine, sizeof mine);
  comm_allgather(comm, local, 2, all, (size_t)world * 2, NULL);
  int differs = -1;
  for (int r = 1; r < world && differs < 0; r++)
    if (memcmp(all + 2 * r, all, sizeof mine) != 0) differs = r;
  free(all);
  return differs;
}
