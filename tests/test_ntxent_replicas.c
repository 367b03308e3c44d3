// NT-Xent split over local replicas: one batch of B samples, held by one replica or sharded over
// two or three (even and uneven shards), must give one global loss and, for every replica's
// rows, the gradient that one replica holding the whole batch gives those rows. Both are also
// checked against the loss written out here in double precision and its finite differences.
//
// What a replica's rows must receive: the global loss is L = (sum over all 2B rows of the
// per-row loss) / 2B, and a row enters it twice: as a query (its own loss row, the row-role
// gradient ntxent_forward_backward returns in du_local) and as a positive or negative of every
// other query on every replica (the column-role gradient du_col, which each replica computes
// for all 2B rows from its own queries). So dL/du for replica r's rows is its du_local plus the
// sum over all replicas of du_col at r's rows, and equals, row for row, the one-replica dL/du:
// the rows are disjoint, so no weighting enters here. The weighting comes after: the trainer
// averages parameter gradients as sum_r (b_r / B) g_r, which is why inbatch hands backward
// (B / b_r) times this slice (a replica with fewer samples is scaled up, not down).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "objectives/ntxent.h"
#include "parallel/comm.h"
#include "replica_test_util.h"

enum { B = 8, D = 5, M = 2 * B, MAX_WORLD = 3 };
static const float temperature = 0.3f;

// The batch as one replica holds it: row v*B + i is view v of sample i, unit length.
static float u_batch[M * D];

// One replica: samples [first, first + b), its rows laid out as [view 0 of them; view 1].
typedef struct {
  LocalGroup *group;
  int rank, first, b;
  float u[M * D];       // (2b, D)
  float du_row[M * D];  // (2b, D) row-role gradient
  float du_col[M * D];  // (M, D) column-role gradient for every gathered row
  int row0;             // where this replica's rows start in the gathered matrix
  double loss_sum;      // sum of this replica's per-row losses
} Replica;

// Row j of a replica's 2b rows is this row of the one-replica layout.
static int batch_row(const Replica *r, int j) {
  int view = j / r->b, sample = r->first + j % r->b;
  return view * B + sample;
}

static void *replica_thread(void *arg) {
  Replica *r = arg;
  Comm *comm = comm_local_rank(r->group, r->rank);
  ExecCtx ctx;
  exec_ctx_init(&ctx);
  NtXent loss;
  ntxent_init(&loss, &ctx, M, 2 * r->b, D, temperature);
  float u_all[M * D];
  size_t offset = 0;
  comm_allgather(comm, r->u, (size_t)2 * r->b * D, u_all, M * D, &offset);
  r->row0 = (int)(offset / D);
  r->loss_sum = ntxent_forward_backward(&loss, &ctx, u_all, r->u, r->row0, r->du_row);
  memcpy(r->du_col, loss.du_col, sizeof r->du_col);
  ntxent_destroy(&loss);
  exec_ctx_destroy(&ctx);
  comm_destroy(comm);
  return NULL;
}

// Runs the batch `u` sharded as `sizes` (consecutive samples) on `world` thread replicas.
static void run_replicas(int world, const int *sizes, const float *u, Replica *reps) {
  LocalGroup *g = comm_local_group_create(world);
  for (int r = 0, first = 0; r < world; first += sizes[r++]) {
    reps[r] = (Replica){.group = g, .rank = r, .first = first, .b = sizes[r]};
    for (int j = 0; j < 2 * sizes[r]; j++)
      memcpy(reps[r].u + j * D, u + batch_row(&reps[r], j) * D, sizeof(float) * D);
  }
  run_on_threads(world, replica_thread, reps, sizeof reps[0]);
  comm_local_group_destroy(g);
}

// The global loss of the batch sharded as `sizes`; grad receives dL/du in the one-replica
// layout, each replica's rows assembled from its row-role gradient and every replica's
// column-role gradient at those rows.
static double run_split(int world, const int *sizes, const float *u, float *grad) {
  Replica reps[MAX_WORLD];
  run_replicas(world, sizes, u, reps);
  double loss_sum = 0;
  for (int r = 0; r < world; r++) {
    const Replica *p = &reps[r];
    loss_sum += p->loss_sum;
    for (int j = 0; j < 2 * p->b; j++)
      for (int k = 0; k < D; k++) {
        double g_jk = p->du_row[j * D + k];
        for (int s = 0; s < world; s++) g_jk += reps[s].du_col[(p->row0 + j) * D + k];
        grad[batch_row(p, j) * D + k] = (float)g_jk;
      }
  }
  return loss_sum / M;
}

// The loss from its definition, in double: row a's positive is the other view of its sample,
// its negatives every row but itself and the positive, logits u_a . u_k / temperature.
static double reference_loss(const float *u) {
  double total = 0;
  for (int a = 0; a < M; a++) {
    int positive = (a + B) % M;
    double logits[M], largest = -INFINITY;
    for (int k = 0; k < M; k++) {
      double dot = 0;
      for (int c = 0; c < D; c++) dot += (double)u[a * D + c] * u[k * D + c];
      logits[k] = dot / temperature;
      if (k != a && logits[k] > largest) largest = logits[k];
    }
    double z = 0;
    for (int k = 0; k < M; k++)
      if (k != a) z += exp(logits[k] - largest);
    total += largest + log(z) - logits[positive];
  }
  return total / M;
}

static double reference_loss_of(void *u) { return reference_loss(u); }

static void make_batch(void) {
  Rng r = rng_stream(21, RNG_TEST, 0, 0);
  float z[M * D];
  for (int i = 0; i < M * D; i++) z[i] = rng_normal(&r);
  for (int i = 0; i < M; i++) {  // each row divided by its length
    double ss = 0;
    for (int k = 0; k < D; k++) ss += (double)z[i * D + k] * z[i * D + k];
    for (int k = 0; k < D; k++) u_batch[i * D + k] = (float)(z[i * D + k] / sqrt(ss));
  }
}

static void expect_split_equals_one(int world, const int *sizes) {
  make_batch();
  float one[M * D], split[M * D];
  double loss_one = run_split(1, (const int[]){B}, u_batch, one);
  double loss_split = run_split(world, sizes, u_batch, split);
  double loss_ref = reference_loss(u_batch);
  print_message("%d replicas: loss %.9f, one replica %.9f, reference %.9f\n", world, loss_split,
                loss_one, loss_ref);
  assert_float_equal(loss_one, loss_ref, 1e-5);
  assert_float_equal(loss_split, loss_one, 1e-6);
  // dL/du is ~1/(M temperature) per entry: float sums agree to ~1e-7 of that.
  for (int i = 0; i < M * D; i++)
    if (fabsf(split[i] - one[i]) > 1e-6f)
      fail_msg("row %d col %d: %d replicas %.9g, one replica %.9g", i / D, i % D, world, split[i],
               one[i]);
  // Every entry of the split gradient against the reference's central differences.
  float u[M * D];
  memcpy(u, u_batch, sizeof u);
  double err =
      gradcheck(reference_loss_of, u, u, split, M * D, M * D, 1e-3f, 1e-3, "split ntxent du");
  assert_true(err < 1e-3);
}

static void test_two_even_replicas(void **state) {
  (void)state;
  expect_split_equals_one(2, (const int[]){4, 4});
}

static void test_two_uneven_replicas(void **state) {
  (void)state;
  expect_split_equals_one(2, (const int[]){5, 3});
}

static void test_three_uneven_replicas(void **state) {
  (void)state;
  expect_split_equals_one(3, (const int[]){3, 3, 2});
}

// A replica's own loss rows are not the whole story: dropping the column-role gradients of the
// other replicas' queries must change a replica's gradient, or the comparison above could not
// tell a replica that ignores them from one that gathers them.
static void test_other_replicas_contribute(void **state) {
  (void)state;
  make_batch();
  float one[M * D];
  run_split(1, (const int[]){B}, u_batch, one);
  Replica reps[2];
  run_replicas(2, (const int[]){5, 3}, u_batch, reps);
  const Replica *p = &reps[1];
  double largest_gap = 0;
  for (int j = 0; j < 2 * p->b; j++)
    for (int k = 0; k < D; k++) {
      double own_only = p->du_row[j * D + k] + p->du_col[(p->row0 + j) * D + k];
      largest_gap = fmax(largest_gap, fabs(own_only - one[batch_row(p, j) * D + k]));
    }
  assert_true(largest_gap > 1e-3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_even_replicas),
      cmocka_unit_test(test_two_uneven_replicas),
      cmocka_unit_test(test_three_uneven_replicas),
      cmocka_unit_test(test_other_replicas_contribute),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
