// What keeps replicas identical besides the gradient average, shared by the trainer and the
// plan (which must move the same bytes): BatchNorm running statistics averaged by sample count,
// and a check that every replica holds bit-identical parameters.
#pragma once
#include "core/params.h"
#include "parallel/comm.h"

// Averages the set's buffers (is_buffer entries) across replicas, weighted by `samples`.
void replica_average_buffers(Comm *comm, ParamSet *ps, int samples);

// Gathers a hash of every replica's parameters; returns the first rank whose parameters differ
// from rank 0's, or -1 when all agree.
int replica_check_identical(Comm *comm, const ParamSet *ps);
