// Collectives of the MPI backend, one replica per process. Meant for `mpirun -np 2`; started
// alone it is a world of one, where the weighted mean of one replica must be that replica.
// Every rank runs every test and so calls the collectives in the same order; assertions come
// after a test's collectives, so a failing rank does not leave the other waiting in one.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "parallel/comm.h"

static Comm *comm;

// The exchanges this process starts, counted through MPI's profiling interface: these
// definitions take the calls Tally's backend makes and pass them on to the PMPI_ entry points.
static int exchanges;

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm c) {
  exchanges++;
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, c);
}

int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm c, MPI_Request *request) {
  exchanges++;
  return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, c, request);
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm c) {
  exchanges++;
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, c);
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm c) {
  exchanges++;
  return PMPI_Bcast(buffer, count, datatype, root, c);
}

// Who drives the non-blocking sums: set when an MPI_Testall that some thread other than the main
// one called found every started sum complete.
static pthread_t main_thread;
static atomic_int completed_elsewhere;

int MPI_Testall(int count, MPI_Request requests[], int *flag, MPI_Status statuses[]) {
  int rc = PMPI_Testall(count, requests, flag, statuses);
  if (rc == MPI_SUCCESS && *flag && !pthread_equal(pthread_self(), main_thread))
    atomic_store(&completed_elsewhere, 1);
  return rc;
}

// One SGD step at lr 0.1 from parameters (1, 2) with the averaged gradient of the two replicas'
// mean gradients (2, 4) and (6, 0), weighted by their sample counts. `agree` receives whether
// rank 0's parameters, broadcast to all, equal this rank's bit for bit.
static void worked_example_step(double weight_rank0, double weight_rank1, float grad[2],
                                float params[2], int *agree) {
  int rank = comm_rank(comm);
  const float mean_grad[2][2] = {{2, 4}, {6, 0}};
  memcpy(grad, mean_grad[rank], 2 * sizeof *grad);
  params[0] = 1, params[1] = 2;
  comm_allreduce_weighted(comm, grad, 2, rank == 0 ? weight_rank0 : weight_rank1);
  for (int i = 0; i < 2; i++) params[i] -= 0.1f * grad[i];
  float from_rank0[2];
  memcpy(from_rank0, params, sizeof from_rank0);
  comm_broadcast(comm, from_rank0, sizeof from_rank0, 0);
  *agree = memcmp(from_rank0, params, sizeof from_rank0) == 0;
}

static void test_worked_example(void **state) {
  (void)state;
  int world = comm_size(comm);
  if (world == 1) {
    float grad[2] = {2, 4};
    comm_allreduce_weighted(comm, grad, 2, 3);
    assert_true(grad[0] == 2 && grad[1] == 4);
    printf("world of 1: the two-replica worked example was skipped (run under mpirun -np 2)\n");
    return;
  }
  if (world != 2) {
    printf("world of %d: the two-replica worked example was skipped\n", world);
    return;
  }
  float equal_grad[2], equal_params[2], uneven_grad[2], uneven_params[2];
  int equal_agree = 0, uneven_agree = 0;
  worked_example_step(1, 1, equal_grad, equal_params, &equal_agree);
  worked_example_step(2, 6, uneven_grad, uneven_params, &uneven_agree);

  // ((2,4) + (6,0)) / 2 = (4, 2); (1,2) - 0.1*(4,2) = (0.6, 1.8).
  assert_true(equal_grad[0] == 4 && equal_grad[1] == 2);
  assert_float_equal(equal_params[0], 0.6f, 1e-6);
  assert_float_equal(equal_params[1], 1.8f, 1e-6);
  assert_true(equal_agree);
  // (2*(2,4) + 6*(6,0)) / 8 = (5, 1); (1,2) - 0.1*(5,1) = (0.5, 1.9).
  assert_true(uneven_grad[0] == 5 && uneven_grad[1] == 1);
  assert_float_equal(uneven_params[0], 0.5f, 1e-6);
  assert_float_equal(uneven_params[1], 1.9f, 1e-6);
  assert_true(uneven_agree);
}

// A weighted mean is one exchange (the weight travels with the values), one allreduce call in the
// ledger, and its bytes are the payload's: a ring over W ranks moves 2 (W-1)/W of 3 floats each
// way, 4 * 1/2 * 12 = 24 bytes for W = 2, none for W = 1. Rank 0 holds no samples (weight 0): its
// values must not count, so every rank ends with rank 1's (1.5, -2, 0.25) exactly.
static void test_weighted_is_one_exchange(void **state) {
  (void)state;
  int rank = comm_rank(comm), world = comm_size(comm);
  float buf[3] = {1.5f, -2.0f, 0.25f};
  if (rank == 0 && world > 1) buf[0] = buf[1] = buf[2] = 1e6f;
  comm_stats_reset(comm);
  exchanges = 0;
  comm_allreduce_weighted(comm, buf, 3, rank == 0 && world > 1 ? 0 : 3);
  int counted = exchanges;
  CommStats stats = comm_stats(comm);

  assert_int_equal(counted, 1);
  assert_int_equal(stats.calls[COLL_ALLREDUCE], 1);
  assert_true(stats.bytes[COLL_ALLREDUCE] == (world == 2 ? 24.0 : 0.0) || world > 2);
  assert_true(buf[0] == 1.5f && buf[1] == -2.0f && buf[2] == 0.25f);
}

// Rank r contributes r+1 floats 100r, 100r+1, ...: uneven counts, known totals.
static void test_allgatherv(void **state) {
  (void)state;
  int rank = comm_rank(comm), world = comm_size(comm);
  enum { MAX_WORLD = 8 };
  if (world > MAX_WORLD) skip();
  float local[MAX_WORLD], out[MAX_WORLD * (MAX_WORLD + 1) / 2 + 1];
  for (int i = 0; i <= rank; i++) local[i] = 100.0f * rank + (float)i;
  size_t total = (size_t)world * (world + 1) / 2;
  out[total] = -1;  // must survive: nothing is written past the total
  size_t offset = 99;
  comm_stats_reset(comm);
  comm_allgather(comm, local, (size_t)rank + 1, out, total, &offset);
  CommStats stats = comm_stats(comm);

  assert_int_equal(offset, (size_t)rank * (rank + 1) / 2);
  size_t at = 0;
  for (int r = 0; r < world; r++)
    for (int i = 0; i <= r; i++) assert_true(out[at++] == 100.0f * r + (float)i);
  assert_true(out[total] == -1);
  // This rank's floats go to world-1 others; the others' total-(rank+1) floats come here.
  double want_bytes = 4.0 * ((double)(world - 1) * (rank + 1) + (double)(total - (rank + 1)));
  assert_float_equal(stats.bytes[COLL_ALLGATHER], want_bytes, 1e-9);
}

// A started sum completes while the thread that started it makes no MPI call at all, only
// sleeps (as backward computes): Open MPI moves data only inside MPI calls, so the backend's
// progress thread must be making them. 4 MiB a rank, past every eager limit. Without the thread
// the loop gives up after 10 s and the wait below completes the sum.
static void test_sums_advance_while_computing(void **state) {
  (void)state;
  int rank = comm_rank(comm), world = comm_size(comm);
  enum { N = 1 << 20 };
  float *buf = malloc(N * sizeof *buf);
  assert_non_null(buf);
  for (size_t i = 0; i < N; i++) buf[i] = (float)(rank + 1) + (float)(i % 7);
  atomic_store(&completed_elsewhere, 0);
  comm_iallreduce_sum(comm, buf, N);
  const struct timespec tick = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
  for (int i = 0; i < 1000 && !atomic_load(&completed_elsewhere); i++) nanosleep(&tick, NULL);
  int advanced = atomic_load(&completed_elsewhere);
  comm_wait_all(comm);

  assert_true(advanced);
  // Small integers: the sum is exact in any order.
  const float ranks_sum = (float)world * (float)(world + 1) / 2;
  for (size_t i = 0; i < N; i++)
    if (buf[i] != ranks_sum + (float)world * (float)(i % 7))
      fail_msg("float %zu: %g after the sum, expected %g", i, buf[i],
               ranks_sum + (float)world * (float)(i % 7));
  free(buf);
}

static void test_sum_f64_and_backend(void **state) {
  (void)state;
  int rank = comm_rank(comm), world = comm_size(comm);
  double sums[2] = {rank + 1.0, 0.25};
  comm_allreduce_sum_f64(comm, sums, 2);
  assert_string_equal(comm_backend(comm), "mpi");
  assert_false(comm_failed(comm));
  assert_true(sums[0] == world * (world + 1) / 2.0);
  assert_true(sums[1] == 0.25 * world);
}

int main(int argc, char **argv) {
  main_thread = pthread_self();
  comm = comm_mpi_create(&argc, &argv);
  if (!comm) {
    fprintf(stderr, "test_comm_mpi: %s\n", tl_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worked_example),
      cmocka_unit_test(test_weighted_is_one_exchange),
      cmocka_unit_test(test_allgatherv),
      cmocka_unit_test(test_sums_advance_while_computing),
      cmocka_unit_test(test_sum_f64_and_backend),
  };
  int failures = cmocka_run_group_tests(tests, NULL, NULL);
  comm_destroy(comm);
  return failures;
}
