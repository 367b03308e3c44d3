// What keeps replicas identical besides the gradient average, shared by the trainer and the
// plan (which must move the same bytes): BatchNorm running statistics averaged by sample count,
// and a check that every replica holds bit-identical parameters.
#pragma once
#include "core/params.h"
#include "parallel/comm.h"

// Floats in the set's buffers (is_buffer entries): the size of replica_average_buffers' `packed`.
size_t replica_buffer_floats(const ParamSet *ps);
// Averages the set's buffers across replicas, weighted by `samples`, in one exchange through
// `packed` (replica_buffer_floats of them, allocated once by the caller).
void replica_average_buffers(Comm *comm, ParamSet *ps, int samples, float *packed);

// Gathers a hash of every replica's parameters; returns the first rank whose parameters differ
// from rank 0's, or -1 when all agree.
int replica_check_identical(Comm *comm, const ParamSet *ps);
