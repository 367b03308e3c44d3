#!/usr/bin/env bash
# Throughput and memory per objective: trains each recipe for a few steps on Fashion-MNIST at
# batch 256 (TALLY_BENCH_BATCH to change it) and prints images/s (median step after warm-up),
# GFLOP per step and peak RSS.
#   scripts/bench.sh [STEPS] [RECIPE...]     e.g. scripts/bench.sh 25 inbatch moco mae
# Extra settings go through TALLY_BENCH_SET, e.g. TALLY_BENCH_SET="parallel.replicas=2".
#
# Tally against PyTorch 2.6 on the same networks, in the settings PyTorch's users choose, all
# measured in one run, alternately:
#   scripts/bench.sh --vs-pytorch [--quick] [--warmup W] [--steps N] [--repeats R] [--no-peak]
#                    [--peak-size N] [--any-blas] [--with-pytorch113] [--compile-timeout S]
#                    [--no-compile]
#                    [--wait-quiet SECONDS] [--require-quiet] [OBJECTIVE/MODEL...]
# Rows (default): inbatch/resnet-small-32 moco/resnet-small-32 mae/vit-tiny inbatch/vit-tiny
# moco/vit-tiny inbatch/resnet18-small-images moco/resnet18-small-images; MODEL is a file in
# models/, the recipe configs/OBJECTIVE.ini (configs/OBJECTIVE-vit.ini for a vit model, except
# mae). The resnet18-small-images rows train on photo-sized input: 64x64 RGB at batch 64
# (TALLY_BENCH_PHOTO_BATCH), from a folder of 512 synthetic RGB images the benchmark writes once
# (bench-results/photos-64); PyTorch's side, as on every row, trains on random tensors.
# Each row measures, in R (default 2) repeats of W (5) warm-up + N (20) measured steps each:
# - Tally in fp32 and in bf16 (train.precision = bf16);
# - PyTorch 2.6 in fp32 and in bf16 (torch.autocast("cpu", dtype=torch.bfloat16)), each eager,
#   eager with its fast path (channels_last for a ResNet: "cl"; F.scaled_dot_product_attention
#   for a ViT: "sdpa"), and compiled (torch.compile of the whole training step, fast path on;
#   at least 3 warm-up steps, the first two compile). A compile that fails, needs a compiler or
#   headers that are missing, or takes longer than S seconds (--compile-timeout, 900) is
#   recorded as "does not compile: REASON", and the benchmark goes on (--no-compile leaves the
#   compiled settings out, and the summary's flags say so);
# - with --with-pytorch113, the host's PyTorch 1.13 in fp32 as well (the earlier reference).
# A repeat runs Tally fp32, then the fp32 PyTorch settings, then Tally bf16 and the bf16 ones;
# the next repeat runs the same in reverse. Every PyTorch setting trains from the same seed on
# the same inputs, so its first loss must agree with fp32's (the summary flags one that does not).
# Where PyTorch runs: natively when /usr/bin/python3's torch is 2.6 or later; otherwise (Debian
# 12's is 1.13) in the Debian 13 root of scripts/test-debian13.sh (TALLY_DEBIAN13_ROOT, by
# default ~/.cache/tally/debian13; run that script first to make it), which needs root. The
# root is mounted as scripts/lib-debian13.sh does it (used as it is if already mounted, and then
# left mounted), the checkout copied to TALLY_BENCH_ROOT_DIR (/opt/tally-bench) there, and the
# PyTorch side reads Tally's config from and writes its results to that folder.
# scripts/bench_torch.py is the PyTorch side (and measures both sides' processes). Before the
# rows and again after them, a oneDNN matmul of N×N×N (4096) in fp32 and, when the CPU has
# avx512_bf16, bf16 measures the peak (the best reading) the achieved GFLOP/s are a fraction
# of. Results, logs and every run folder go under bench-results/<timestamp>-vs-pytorch/;
# summary.md there (printed last) has per row each setting's images/s, peak RSS and GFLOP/s,
# PyTorch's best setting in each precision and overall, and Tally's best over PyTorch's best in
# the same precision and overall; with the CPU model, the date, the oneDNN of each side (Tally's
# from DNNL_VERBOSE, PyTorch's from torch.__config__), PyTorch's version and the flags.
# summary.json holds the same.
# TALLY_BENCH_BIN names the host's Tally (default build/tally; the test runs the one it built).
# --quick: 1 warm-up + 2 measured steps, one repeat, batch 32 (16 on the photo rows), no peak,
# compile capped at 600 s: a check that the whole path runs (tests/test_bench_quick.sh), not a
# measurement. Later options override its values.
# Final numbers need a quiet machine: the summary flags a run that started with a load average
# of 1.5 or more or during which other processes kept a quarter of a core busy (--wait-quiet S
# waits up to S seconds for the load to drop first; --require-quiet exits with 3 instead of
# measuring if it has not).
#
# Tally on both stacks: built on the host (Debian 12: oneDNN 2.6, gcc 12) and in the Debian 13
# root (oneDNN 3.7, gcc 14; built in TALLY_BENCH_ROOT_DIR there), the same rows alternately:
#   scripts/bench.sh --stacks [--quick] [--precisions fp32,bf16] [--warmup W] [--steps N]
#                    [--repeats R] [--wait-quiet S] [--require-quiet] [OBJECTIVE/MODEL...]
# Each repeat runs, per precision, the host's build then the root's (reversed in the next one);
# summary.md in bench-results/<timestamp>-stacks/ has images/s, GFLOP/s and peak RSS side by
# side. Needs root and the Debian 13 root, as above.
#
# Where a step's time goes, primitive by primitive, from oneDNN's own timings (DNNL_VERBOSE):
#   scripts/bench.sh --profile [--stacks] [--precisions fp32,bf16] [--warmup W] [--steps N]
#                    [--no-peak] [--peak-size N] [--wait-quiet S] [--require-quiet] [OBJECTIVE/MODEL...]
# Each row trains W (2) + N (4) steps per precision with DNNL_VERBOSE=1 (on the host's build, and
# with --stacks on the Debian 13 root's too), and scripts/onednn_profile.py turns the log into a
# table per run: each kind of primitive's ms per step, share of the median step, GFLOP/s and the
# fraction of the peak measured on the same oneDNN (the matmul above, f32 and bf16). summary.md
# in bench-results/<timestamp>-profile/ holds the tables. DNNL_VERBOSE adds a little time of its
# own to each primitive: read shares, not the step's speed.
#
# The time `tally plan --time` predicts against the run's measured time, recipe by recipe:
#   scripts/bench.sh --plan-time [STEPS=40] [RECIPE...]    e.g. --plan-time 40 moco photos/moco
#
# Decoding on one core (tests/bench_decode.c): stb_image against libjpeg-turbo, full size and at
# the reduction a view allows, over the first N images of a folder:
#   scripts/bench.sh --decode DIR [N=500] [VIEW_SIZE=64] [CHANNELS=3] [REPEATS=3]
#
# How PyTorch is made fair (the conditions under which the reference numbers were measured),
# the same on the host and in the Debian 13 root:
# - Debian's python3-torch, run with /usr/bin/python3 (a python3 earlier on PATH may lack torch).
# - BLAS: Debian's torch calls whatever libblas.so.3 resolves to, the reference BLAS by default,
#   which makes every Linear and attention matmul many times slower. libopenblas0-openmp is
#   installed when missing (apt-get, in the root through chroot; it also becomes the system's
#   libblas.so.3 alternative) and its directory is put first on the PyTorch process's
#   LD_LIBRARY_PATH whatever the alternative says; the PyTorch process reports the BLAS it
#   actually mapped, and the benchmark stops if that is not OpenBLAS (--any-blas to go on
#   anyway). Convolutions go through oneDNN in both: the libdnnl Tally links, and the oneDNN
#   built into PyTorch (3.7 in Debian 13's; the summary names both).
# - GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=... for PyTorch only: with
#   default malloc every large tensor is a fresh mmap, and freed heap is handed back, so its page
#   faults make PyTorch's batch-256 steps several times slower here (it trades memory for speed:
#   PyTorch's peak RSS is the tuned one). No mmap and no trimming keeps freed tensors in the heap
#   for the next step. (glibc 2.36 silently ignores an mmap_threshold above 32 MiB, which is
#   what an earlier form of this setting relied on.) The PyTorch side reports its minor page
#   faults per measured step, and the summary says when they show the tunables did not take.
#   Tally runs as built, with default malloc and no environment of its own.
# - torch.set_num_threads(2) and OMP_NUM_THREADS=2 (Tally uses both cores by itself); the same
#   batch (train.batch_size from TALLY_BENCH_BATCH, default 256), input size, optimizer and
#   objective settings: the PyTorch side reads Tally's resolved config.ini of the same row, and
#   checks its parameter count against `tally plan`'s.
# - Not equal, in PyTorch's favour: PyTorch trains on random tensors made outside its step timer
#   (no data pipeline, no dataset in its RSS); Tally's step time includes waiting for its loader,
#   whose augmentation thread shares the two cores, and its RSS holds the training set.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184

die() {
  echo "bench: $*" >&2
  exit 2
}

# The peak: a oneDNN matmul in C, compiled against the installed headers.
write_peak_c() {
  cat <<'CEOF'
#define _POSIX_C_SOURCE 200809L
// Peak matmul throughput of this machine through oneDNN (the library Tally and PyTorch use):
// C = A B with A (n x n) and B (n x n), fp32 and, when the library takes it, bf16 inputs with
// fp32 output (asked for with a third argument "bf16"). Prints one line per type:
// "peak <type> <best GFLOP/s> <median GFLOP/s> <implementation>", or "peak <type> unsupported".
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void fill(dnnl_memory_t m, dnnl_data_type_t dt, size_t count) {
  void *p = NULL;
  dnnl_memory_get_data_handle(m, &p);
  uint32_t s = 12345u;
  for (size_t i = 0; i < count; i++) {
    s = s * 1664525u + 1013904223u;
    float v = ((s >> 8) * (1.0f / 16777216.0f)) - 0.5f;
    if (dt == dnnl_f32) {
      ((float *)p)[i] = v;
    } else {
      uint32_t u;
      memcpy(&u, &v, sizeof u);
      ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    }
  }
}

#define CHECK(x)                                                       \
  do {                                                                 \
    dnnl_status_t st_ = (x);                                           \
    if (st_ != dnnl_success) {                                         \
      fprintf(stderr, "peak: %s failed (status %d)\n", #x, (int)st_); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

// oneDNN 3 made memory descriptors handles and primitive descriptors one call; the program
// builds against either (the host's 2.x, the Debian 13 root's 3.x).
#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t md_t;
typedef const_dnnl_memory_desc_t md_ref;
#define MD(x) (x)
static dnnl_status_t md_init(md_t *md, const dnnl_dims_t dims, dnnl_data_type_t dt,
                             dnnl_format_tag_t tag) {
  return dnnl_memory_desc_create_with_tag(md, 2, dims, dt, tag);
}
static dnnl_status_t matmul_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, md_t *a, md_t *b,
                               md_t *c) {
  return dnnl_matmul_primitive_desc_create(pd, eng, *a, *b, NULL, *c, NULL);
}
#else
typedef dnnl_memory_desc_t md_t;
typedef const dnnl_memory_desc_t *md_ref;
#define MD(x) (&(x))
static dnnl_status_t md_init(md_t *md, const dnnl_dims_t dims, dnnl_data_type_t dt,
                             dnnl_format_tag_t tag) {
  return dnnl_memory_desc_init_by_tag(md, 2, dims, dt, tag);
}
static dnnl_status_t matmul_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, md_t *a, md_t *b,
                               md_t *c) {
  dnnl_matmul_desc_t d;
  dnnl_status_t st = dnnl_matmul_desc_init(&d, a, b, NULL, c);
  return st != dnnl_success ? st : dnnl_primitive_desc_create(pd, &d, NULL, eng, NULL);
}
#endif

static int run(dnnl_engine_t eng, dnnl_stream_t s, dnnl_data_type_t dt, const char *name, int n,
               int reps) {
  dnnl_dims_t dims = {n, n};
  md_t a_md, b_any, c_md, b_plain;
  CHECK(md_init(&a_md, dims, dt, dnnl_ab));
  CHECK(md_init(&b_any, dims, dt, dnnl_format_tag_any));
  CHECK(md_init(&b_plain, dims, dt, dnnl_ab));
  CHECK(md_init(&c_md, dims, dnnl_f32, dnnl_ab));
  dnnl_primitive_desc_t pd;
  if (matmul_pd(&pd, eng, &a_md, &b_any, &c_md) != dnnl_success) {
    printf("peak %s unsupported 0 0 none\n", name);
    return 0;
  }
  const char *impl = "?";
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (strncmp(impl, "ref", 3) == 0) {  // a reference kernel is no peak: the ISA lacks the type
    printf("peak %s unsupported 0 0 %s\n", name, impl);
    return 0;
  }
  // Weights in the layout the kernel wants (reordered once, outside the timing).
  md_ref b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  dnnl_memory_t a, b, bp, c;
  CHECK(dnnl_memory_create(&a, MD(a_md), eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&bp, MD(b_plain), eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&b, b_md, eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&c, MD(c_md), eng, DNNL_MEMORY_ALLOCATE));
  fill(a, dt, (size_t)n * n);
  fill(bp, dt, (size_t)n * n);
  dnnl_primitive_desc_t rpd;
  CHECK(dnnl_reorder_primitive_desc_create(&rpd, MD(b_plain), eng, b_md, eng, NULL));
  dnnl_primitive_t reorder;
  CHECK(dnnl_primitive_create(&reorder, rpd));
  dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, bp}, {DNNL_ARG_TO, b}};
  CHECK(dnnl_primitive_execute(reorder, s, 2, rargs));
  CHECK(dnnl_stream_wait(s));
  dnnl_primitive_t mm;
  CHECK(dnnl_primitive_create(&mm, pd));
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  double flop = 2.0 * n * (double)n * n, *rate = calloc((size_t)reps, sizeof *rate);
  for (int i = -1; i < reps; i++) {  // one warm-up
    double t0 = now_s();
    CHECK(dnnl_primitive_execute(mm, s, 3, args));
    CHECK(dnnl_stream_wait(s));
    double t = now_s() - t0;
    if (i >= 0) rate[i] = flop / t / 1e9;
  }
  qsort(rate, (size_t)reps, sizeof *rate, cmp);
  printf("peak %s %.1f %.1f %s\n", name, rate[reps - 1], rate[reps / 2], impl);
  fflush(stdout);
  free(rate);
  dnnl_primitive_destroy(mm);
  dnnl_primitive_destroy(reorder);
  dnnl_primitive_desc_destroy(rpd);
  dnnl_primitive_desc_destroy(pd);
  dnnl_memory_destroy(a);
  dnnl_memory_destroy(b);
  dnnl_memory_destroy(bp);
  dnnl_memory_destroy(c);
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_destroy(a_md);
  dnnl_memory_desc_destroy(b_any);
  dnnl_memory_desc_destroy(b_plain);
  dnnl_memory_desc_destroy(c_md);
#endif
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4096, reps = argc > 2 ? atoi(argv[2]) : 5;
  int with_bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0;
  if (n < 16 || reps < 1) {
    fprintf(stderr, "usage: peak [N] [REPS] [bf16]\n");
    return 2;
  }
  const dnnl_version_t *v = dnnl_version();
  printf("onednn %d.%d.%d isa %d\n", v->major, v->minor, v->patch, (int)dnnl_get_effective_cpu_isa());
  dnnl_engine_t eng;
  dnnl_stream_t s;
  CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&s, eng, dnnl_stream_default_flags));
  if (run(eng, s, dnnl_f32, "f32", n, reps)) return 1;
  if (with_bf16 && run(eng, s, dnnl_bf16, "bf16", n, reps)) return 1;
  dnnl_stream_destroy(s);
  dnnl_engine_destroy(eng);
  return 0;
}
CEOF
}

# Runs the peak program (built once into $PEAK_DIR), appends its lines to $out/peak.txt and sets
# PEAK_* to the best reading so far: measured before and after the rows, so that one burst of
# other work on a shared machine does not set the peak.
measure_peak() {
  local out=$1 n=$2 when=$3
  if [ -z "${PEAK_DIR:-}" ]; then
    PEAK_DIR=$(mktemp -d)
    write_peak_c > "$PEAK_DIR/peak.c"
    if ! cc -O2 -std=c11 -o "$PEAK_DIR/peak" "$PEAK_DIR/peak.c" -ldnnl 2> "$out/peak-build.log"; then
      echo "bench: could not build the peak program (libdnnl-dev?), see $out/peak-build.log" >&2
      return 0
    fi
  fi
  [ -x "$PEAK_DIR/peak" ] || return 0
  local types="" lines
  grep -qw avx512_bf16 /proc/cpuinfo && types=bf16
  echo "peak ($when): oneDNN matmul ${n}x${n}x${n}, f32${types:+ and $types}, best of $PEAK_REPS"
  lines=$("$PEAK_DIR/peak" "$n" "$PEAK_REPS" $types 2>&1) || true
  printf '%s\n' "$lines" | sed "s/^/$when /" | tee -a "$out/peak.txt"
  PEAK_ONEDNN=$(awk '$2 == "onednn" { v = $3 } END { print v }' "$out/peak.txt")
  local t best impl
  for t in f32 bf16; do
    # the best reading over all measurements, and its implementation
    read -r best impl < <(awk -v t=$t '$2 == "peak" && $3 == t && $4 != "unsupported" && $4 + 0 > b + 0 { b = $4; i = $6 }
      END { if (b) print b, i }' "$out/peak.txt") || true
    if [ $t = f32 ]; then PEAK_F32=${best:-} PEAK_F32_IMPL=${impl:-}; else PEAK_BF16=${best:-} PEAK_BF16_IMPL=${impl:-}; fi
    best="" impl=""
  done
}

# libopenblas0-openmp for the PyTorch side, installed only when missing.
ensure_openblas() {
  if dpkg-query -W -f='${Status}' libopenblas0-openmp 2> /dev/null | grep -q 'install ok installed'; then
    return 0
  fi
  echo "bench: installing libopenblas0-openmp (PyTorch's BLAS for the comparison)"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -o DPkg::Lock::Timeout=600 libopenblas0-openmp > /dev/null ||
    die "could not install libopenblas0-openmp; install it, or pass --any-blas to measure PyTorch on the BLAS it finds"
}

loadavg() { cut -d' ' -f1 /proc/loadavg; }

# make_photos DIR N SIZE: N SIZExSIZE 24-bit RGB BMPs in DIR (once): smooth colour gradients with
# a few discs, so crops, flips and colour jitter see an image rather than noise.
make_photos() {
  [ -f "$1/done" ] && return 0
  mkdir -p "$1"
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import struct, sys
import numpy as np
out, n, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
y, x = np.mgrid[0:s, 0:s] / s
for i in range(n):
    a = rng.uniform(0, 1, (3, 3))
    img = np.stack([a[c, 0] + a[c, 1] * x + a[c, 2] * y for c in range(3)], -1)
    for _ in range(3):
        cx, cy, r = rng.uniform(0, 1, 3) * (1, 1, 0.3)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 1, 3)
    rgb = (np.clip(img / img.max(), 0, 1) * 255).astype(np.uint8)
    rows = rgb[::-1, :, ::-1].reshape(s, s * 3)  # BMP: bottom-up rows, BGR
    pad = (-s * 3) % 4
    data = b"".join(r.tobytes() + b"\0" * pad for r in rows)
    head = struct.pack("<2sIHHI", b"BM", 54 + len(data), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, s, s, 1, 24, 0, len(data), 2835, 2835, 0, 0)
    with open(f"{out}/img{i:04d}.bmp", "wb") as f:
        f.write(head + info + data)
PYEOF
  touch "$1/done"
}

# --- What --vs-pytorch and --stacks share: the rows, the options, the measured Tally run.

DEFAULT_ROWS=(inbatch/resnet-small-32 moco/resnet-small-32 mae/vit-tiny inbatch/vit-tiny moco/vit-tiny
  inbatch/resnet18-small-images moco/resnet18-small-images)
# The folder of the root that holds the checkout's copy, its build (--stacks) and the PyTorch side's
# exchange files (never /opt/tally, which scripts/test-debian13.sh owns).
BENCH_DIR=${TALLY_BENCH_ROOT_DIR:-/opt/tally-bench}
# The host's Tally (the root's is always its own build/tally).
TALLY_HOST=${TALLY_BENCH_BIN:-build/tally}

# parse_common MODE ARGS...: the options of both modes (and MODE's own) into globals; the rest are
# rows. --quick first sets short values that later options may override.
parse_common() {
  local mode=$1
  shift
  WARMUP=5 STEPS=20 REPEATS=2 BATCH=${TALLY_BENCH_BATCH:-256} PHOTO_BATCH=${TALLY_BENCH_PHOTO_BATCH:-64}
  PEAK=1 PEAK_N=4096 ANY_BLAS=0 WAIT_QUIET=0 REQUIRE_QUIET=0 WITH_113=0 COMPILE_TIMEOUT=900 NO_COMPILE=0
  PRECISIONS="fp32 bf16" QUICK=0 ROWS=()
  PEAK_REPS=8 PROFILE_STACKS=0
  [ "$mode" = --profile ] && WARMUP=2 STEPS=4
  FLAGS="$mode $*"
  while [ $# -gt 0 ]; do
    case $mode:$1 in
      *:--quick) QUICK=1 WARMUP=1 STEPS=2 REPEATS=1 BATCH=32 PHOTO_BATCH=16 PEAK=0 COMPILE_TIMEOUT=600; shift ;;
      *:--warmup) WARMUP=${2:-}; shift 2 ;;
      *:--steps) STEPS=${2:-}; shift 2 ;;
      *:--repeats) REPEATS=${2:-}; shift 2 ;;
      *:--wait-quiet) WAIT_QUIET=${2:-}; shift 2 ;;
      *:--require-quiet) REQUIRE_QUIET=1; shift ;;
      --vs-pytorch:--no-peak) PEAK=0; shift ;;
      --vs-pytorch:--peak-size) PEAK_N=${2:-}; shift 2 ;;
      --vs-pytorch:--any-blas) ANY_BLAS=1; shift ;;
      --vs-pytorch:--with-pytorch113) WITH_113=1; shift ;;
      --vs-pytorch:--compile-timeout) COMPILE_TIMEOUT=${2:-}; shift 2 ;;
      --vs-pytorch:--no-compile) NO_COMPILE=1; shift ;;
      --stacks:--precisions | --profile:--precisions) PRECISIONS=${2//,/ }; shift 2 ;;
      --profile:--stacks) PROFILE_STACKS=1; shift ;;
      --profile:--no-peak) PEAK=0; shift ;;
      --profile:--peak-size) PEAK_N=${2:-}; shift 2 ;;
      *:-h | *:--help) sed -n '/^# Tally against PyTorch 2.6/,/^# The time/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *:--*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
      */*) ROWS+=("${1#*:}"); shift ;;
      *) die "unknown argument '${1#*:}' for $mode (rows are OBJECTIVE/MODEL, e.g. moco/vit-tiny)" ;;
    esac
  done
  local v
  for v in "$WARMUP" "$STEPS" "$REPEATS" "$PEAK_N" "$WAIT_QUIET" "$COMPILE_TIMEOUT"; do
    [[ $v =~ ^[0-9]+$ ]] || die "expected a number, got '$v'"
  done
  if [ "$STEPS" -lt 1 ] || [ "$REPEATS" -lt 1 ]; then die "need --steps >= 1 and --repeats >= 1"; fi
  for v in $PRECISIONS; do [[ $v == fp32 || $v == bf16 ]] || die "--precisions: fp32 or bf16, not '$v'"; done
  [ ${#ROWS[@]} -gt 0 ] || ROWS=("${DEFAULT_ROWS[@]}")
}

# wait_for_quiet: --wait-quiet S waits up to S seconds for the 1-minute load average to fall below
# 1.5; --require-quiet then exits with 3 if it has not.
wait_for_quiet() {
  local waited=0
  while [ "$waited" -lt "$WAIT_QUIET" ] && awk -v l="$(loadavg)" 'BEGIN { exit !(l >= 1.5) }'; do
    [ "$waited" -eq 0 ] && echo "bench: load average $(loadavg); waiting up to ${WAIT_QUIET}s for it to fall below 1.5"
    sleep 15
    waited=$((waited + 15))
  done
  if [ "$REQUIRE_QUIET" -eq 1 ] && awk -v l="$(loadavg)" 'BEGIN { exit !(l >= 1.5) }'; then
    echo "bench: load average $(loadavg) is still 1.5 or more: not measuring (--require-quiet)" >&2
    exit 3
  fi
}

# results_dir SUFFIX: makes bench-results/<timestamp>-SUFFIX, sets OUT, STAMP and LOAD_START.
results_dir() {
  STAMP=$(date +%Y%m%d-%H%M%S)-$1
  OUT=bench-results/$STAMP
  mkdir -p "$OUT"
  LOAD_START=$(loadavg)
  echo "bench: results in $OUT; load average $LOAD_START$(awk -v l="$LOAD_START" \
    'BEGIN { if (l >= 1.5) print " (loaded: numbers from this run are not final)" }')"
  : > "$OUT/rows.tsv"
}

# row_setup ROW: sets objective, model, config, slug, fast (the PyTorch fast path of the backbone:
# cl for a ResNet, sdpa for a ViT) and row_set, the --set arguments of the row's Tally runs (paths
# relative to the checkout: the same on the host and in the root).
row_setup() {
  objective=${1%%/*}
  model=${1#*/}
  [ -f "models/$model.ini" ] || die "no model file models/$model.ini (row $1)"
  if [[ $model == vit* && $objective != mae ]]; then config=configs/$objective-vit.ini; else config=configs/$objective.ini; fi
  [ -f "$config" ] || die "no recipe $config (row $1)"
  slug=$objective-$model
  fast=cl
  grep -Eq '^[[:space:]]*type[[:space:]]*=[[:space:]]*vit' "models/$model.ini" && fast=sdpa
  row_set=(--set "model.file=models/$model.ini" --set "train.batch_size=$BATCH")
  local kv
  for kv in ${TALLY_BENCH_SET:-}; do row_set+=(--set "$kv"); done
  [ "$objective" = mae ] && row_set+=(--set mae.png_every=0)  # output, not training
  if [ "$model" = resnet18-small-images ]; then
    make_photos bench-results/photos-64 512 64
    row_set+=(--set data.format=imagefolder --set data.labels=none --set data.train=bench-results/photos-64
      --set data.test=bench-results/photos-64 --set data.image_size=64 --set data.channels=3
      --set "train.batch_size=$PHOTO_BATCH")
  fi
  return 0
}

# tally_onednn PROGRAM...: the oneDNN version a Tally binary runs on, from DNNL_VERBOSE's first
# lines during a plan (which creates the primitives of a step without running them). A PROGRAM
# that clears the environment (the root's) sets DNNL_VERBOSE=1 itself.
tally_onednn() {
  DNNL_VERBOSE=1 "$@" plan --objective=mae --config configs/mae.ini 2>&1 |
    sed -n 's/.*info,oneDNN v\([0-9][0-9.]*\).*/\1/p' | head -n 1
}

# row_args PRECISION: the current row's Tally training arguments, into the caller's `args`.
row_args() {
  args=(train --objective="$objective" --config "$config" --steps $((WARMUP + STEPS)) --no-knn
    --quiet "${row_set[@]}" --set "train.precision=$1")
}

# root_row_dir: the current row's results folder inside the Debian 13 root's checkout (made),
# relative to it.
root_row_dir() {
  mkdir -p "$DEBIAN13_ROOT$BENCH_DIR/bench-results/$STAMP/$slug"
  echo "bench-results/$STAMP/$slug"
}

# run_tally NAME PRECISION [root]: one measured Tally run of the current row into $dir/NAME, built
# on the host or (root) in the Debian 13 root, whose run folder is then moved out beside the rest.
run_tally() {
  local name=$1 precision=$2 where=${3:-host} args inside
  row_args "$precision"
  echo "bench: $slug: Tally $name"
  if [ "$where" = root ]; then
    inside=$(root_row_dir)
    "$PY" scripts/bench_torch.py exec --json "$dir/$name.exec.json" --log "$dir/$name.log" -- \
      "${DEBIAN13_CHROOT[@]}" /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$BENCH_DIR" \
      build/tally "${args[@]}" --out "$inside/$name" || echo "bench: Tally failed on $slug, see $dir/$name.log" >&2
    [ ! -d "$DEBIAN13_ROOT$BENCH_DIR/$inside/$name" ] || mv "$DEBIAN13_ROOT$BENCH_DIR/$inside/$name" "$dir/$name"
  else
    "$PY" scripts/bench_torch.py exec --json "$dir/$name.exec.json" --log "$dir/$name.log" -- \
      env -u GLIBC_TUNABLES "$TALLY_HOST" "${args[@]}" --out "$dir/$name" ||
      echo "bench: Tally failed on $slug, see $dir/$name.log" >&2
  fi
}

# root_for MODE: the Debian 13 root mounted (or used as it is) and the checkout copied into
# $BENCH_DIR there; released on exit.
root_for() {
  [ "$(id -u)" -eq 0 ] || die "$1 runs in the Debian 13 root, which needs root (chroot): sudo $0 $1 ..."
  # shellcheck source=scripts/lib-debian13.sh
  . scripts/lib-debian13.sh
  [ -d "$DEBIAN13_ROOT" ] ||
    die "no Debian 13 root at $DEBIAN13_ROOT: run scripts/test-debian13.sh first (it makes one with python3-torch 2.6 and Tally's build dependencies; TALLY_DEBIAN13_ROOT to use another)"
  debian13_mount
  debian13_copy_tree "$BENCH_DIR"
}

bench_cleanup() {
  [ -z "${PEAK_DIR:-}" ] || rm -rf "$PEAK_DIR"
  if declare -F debian13_release > /dev/null; then debian13_release; fi
}

# write_meta KEY=VALUE...: meta.json of the results folder, from the run's settings and these.
write_meta() {
  "$PY" - "$OUT/meta.json" "$@" <<'PYEOF'
import datetime, json, os, sys
e = os.environ
num = lambda k: float(e[k]) if e.get(k) else None
cpu = "?"
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
meta = {"warmup": int(e["WARMUP"]), "steps": int(e["STEPS"]), "repeats": int(e["REPEATS"]),
        "batch": int(e["BATCH"]), "photo_batch": int(e["PHOTO_BATCH"]), "quick": e["QUICK"] == "1",
        "flags": e["FLAGS"], "cpu": cpu, "cpus": os.cpu_count(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "tunables": e["TUNABLES"], "loadavg_start": num("LOAD_START"), "loadavg_end": num("LOAD_END"),
        "peak": {"n": int(e["PEAK_N"]), "reps": int(e["PEAK_REPS"]), "onednn": e.get("PEAK_ONEDNN", ""),
                 "f32": num("PEAK_F32"), "f32_impl": e.get("PEAK_F32_IMPL", ""),
                 "bf16": num("PEAK_BF16"), "bf16_impl": e.get("PEAK_BF16_IMPL", "")}}
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1)
    meta[k] = v
json.dump(meta, open(sys.argv[1], "w"), indent=1)
PYEOF
}

# --- --vs-pytorch

version_at_least() {  # VERSION MIN: is VERSION (e.g. 2.6.0+debian) MIN or later?
  "$PY" -c 'import re, sys
v = [int(x) for x in re.findall(r"\d+", sys.argv[1])[:2]]
sys.exit(0 if v and v >= [int(x) for x in sys.argv[2].split(".")] else 1)' "$1" "$2"
}

# torch_sides: where PyTorch 2.6 runs (natively when the host's torch is 2.6 or later, else in the
# Debian 13 root, with OpenBLAS installed there when missing) and, with --with-pytorch113, the
# host's 1.13. Sets TORCH_CMD (and TORCH113_CMD): the command line that starts bench_torch.py
# with the fairness environment, and XCHG_IN / XCHG_HOST: the folder whose $STAMP/ROW holds its
# files, as it and as the host see it.
torch_sides() {
  local host_torch env_=(GLIBC_TUNABLES="$TUNABLES" OMP_NUM_THREADS=2)
  host_torch=$("$PY" -c 'import torch; print(torch.__version__)' 2> /dev/null) || host_torch=""
  if [ -n "$host_torch" ] && version_at_least "$host_torch" 2.6; then
    TORCH_WHERE=host
    [ "$WITH_113" -eq 0 ] || die "--with-pytorch113: this host's PyTorch is $host_torch, not 1.13"
    ensure_openblas
    TORCH_CMD=(env "${env_[@]}" "LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" scripts/bench_torch.py)
    XCHG_IN=bench-results XCHG_HOST=bench-results
  else
    TORCH_WHERE="Debian 13 root"
    echo "bench: this host's PyTorch is ${host_torch:-missing}: PyTorch 2.6 runs in the Debian 13 root"
    root_for --vs-pytorch
    debian13_run / '/usr/bin/python3 -c "import torch"' ||
      die "the Debian 13 root's python3 cannot import torch: scripts/test-debian13.sh installs python3-torch there"
    if ! debian13_run / "dpkg-query -W -f='\${Status}' libopenblas0-openmp 2> /dev/null | grep -q 'install ok installed'"; then
      echo "bench: installing libopenblas0-openmp in the Debian 13 root (PyTorch's BLAS for the comparison)"
      debian13_run / 'DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 libopenblas0-openmp > /dev/null' ||
        die "could not install libopenblas0-openmp in the Debian 13 root; --any-blas to measure PyTorch on the BLAS it finds"
    fi
    TORCH_CMD=("${DEBIAN13_CHROOT[@]}" "${env_[@]}" "LD_LIBRARY_PATH=$OPENBLAS_DIR" /usr/bin/python3 "$BENCH_DIR/scripts/bench_torch.py")
    XCHG_IN=$BENCH_DIR/bench-results XCHG_HOST=$DEBIAN13_ROOT$BENCH_DIR/bench-results
  fi
  if [ "$WITH_113" -eq 1 ]; then
    [ -n "$host_torch" ] || die "--with-pytorch113: $PY cannot import torch: apt-get install python3-torch"
    ensure_openblas
    TORCH113_CMD=(env "${env_[@]}" "LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" scripts/bench_torch.py)
  fi
}

# run_torch SIDE SETTING NAME: one measured PyTorch run of the current row (SIDE torch: 2.6,
# torch113: the host's 1.13) into $dir/NAME.json; a setting that cannot run gets its reason there.
run_torch() {
  local side=$1 setting=$2 name=$3 cmd=("${TORCH_CMD[@]}") in=$XCHG_IN/$STAMP/$slug host=$XCHG_HOST/$STAMP/$slug
  [ "$side" = torch113 ] && cmd=("${TORCH113_CMD[@]}") in=$dir host=$dir
  [ -f "$dir/tally-fp32-rep1/config.ini" ] || {
    echo "bench: no Tally config for $slug (its first run failed): PyTorch skipped" >&2
    return 0
  }
  mkdir -p "$host"
  cp "$dir/tally-fp32-rep1/config.ini" "$host/config.ini"
  local limit=() rc=0 why
  [[ $setting == *-compile ]] && limit=(timeout --kill-after=30 "$COMPILE_TIMEOUT")
  echo "bench: $slug: PyTorch $name"
  "$PY" scripts/bench_torch.py exec --json "$dir/$name.exec.json" --log "$dir/$name.log" -- \
    "${limit[@]}" "${cmd[@]}" run --config "$in/config.ini" --objective "$objective" --setting "$setting" \
    --warmup "$WARMUP" --steps "$STEPS" --expect-params "$params" --json "$in/$name.json" || rc=$?
  [ "$host" = "$dir" ] || [ ! -f "$host/$name.json" ] || mv -f "$host/$name.json" "$dir/$name.json"
  if [ ! -s "$dir/$name.json" ]; then
    why="failed (exit $rc): $(tail -n 1 "$dir/$name.log")"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="not done within ${COMPILE_TIMEOUT} s (--compile-timeout)"
    [[ $setting == *-compile ]] && why="does not compile: $why"
    echo "bench: PyTorch $setting on $slug: $why" >&2
    "$PY" -c 'import json, sys; json.dump({"setting": sys.argv[2], "unavailable": sys.argv[3]}, open(sys.argv[1], "w"))' \
      "$dir/$name.json" "$setting" "$why"
  fi
  check_blas "$side" "$dir/$name.json"
}

# check_blas SIDE JSON: the first result of each PyTorch names the BLAS it mapped; not OpenBLAS
# stops the benchmark (its numbers would not be fair) unless --any-blas.
check_blas() {
  local seen=BLAS_SEEN_$1 blas
  [ -z "${!seen:-}" ] || return 0
  blas=$("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(",".join(d["blas"]) if "blas" in d else "-")' "$2")
  [ "$blas" != - ] || return 0
  printf -v "$seen" %s "$blas"
  echo "bench: PyTorch ($1) uses BLAS ${blas:-(none mapped)}"
  if [[ $blas != *openblas* ]] && [ "$ANY_BLAS" -eq 0 ]; then
    die "PyTorch did not map OpenBLAS (got '${blas:-nothing}'): its numbers would not be fair; --any-blas to go on"
  fi
}

# The runs of one row, in the order of a repeat: Tally and PyTorch alternate, each precision's
# PyTorch settings after Tally's run in it.
row_runs() {
  local p
  for p in fp32 bf16; do
    if [ "$NO_COMPILE" -eq 1 ]; then
      echo "tally:$p torch:$p torch:$p-$fast"
    else
      echo "tally:$p torch:$p torch:$p-$fast torch:$p-$fast-compile"
    fi
  done
  [ "$WITH_113" -eq 0 ] || echo "torch113:fp32"
}

vs_pytorch() {
  parse_common --vs-pytorch "$@"
  [ -x "$TALLY_HOST" ] || scripts/setup.sh
  trap bench_cleanup EXIT
  torch_sides
  wait_for_quiet
  results_dir vs-pytorch
  TALLY_ONEDNN=$(tally_onednn "$TALLY_HOST")
  PEAK_ONEDNN="" PEAK_F32="" PEAK_F32_IMPL="" PEAK_BF16="" PEAK_BF16_IMPL="" PEAK_DIR=""
  [ "$PEAK" -eq 0 ] || measure_peak "$OUT" "$PEAK_N" start

  local row r run runs
  for row in "${ROWS[@]}"; do
    row_setup "$row"
    dir=$OUT/$slug
    mkdir -p "$dir"
    # shellcheck disable=SC2207  # run names have no spaces
    runs=($(row_runs))
    printf '%s\t%s\t%s\t%s\t%s\n' "$slug" "$objective" "models/$model.ini" "$config" "${runs[*]}" >> "$OUT/rows.tsv"
    params=$("$TALLY_HOST" plan --objective="$objective" --config "$config" "${row_set[@]}" 2> "$dir/plan.log" |
      awk '$1 == "parameters" { print $2 }') || true
    [ -n "$params" ] || { echo "bench: tally plan failed for $row, see $dir/plan.log" >&2; continue; }
    for ((r = 1; r <= REPEATS; r++)); do
      local order=("${runs[@]}")
      [ $((r % 2)) -eq 0 ] && mapfile -t order < <(printf '%s\n' "${runs[@]}" | tac)
      for run in "${order[@]}"; do
        case $run in
          tally:*) run_tally "tally-${run#*:}-rep$r" "${run#*:}" ;;
          *) run_torch "${run%%:*}" "${run#*:}" "${run%%:*}-${run#*:}-rep$r" ;;
        esac
      done
    done
  done

  [ "$PEAK" -eq 0 ] || measure_peak "$OUT" "$PEAK_N" end
  LOAD_END=$(loadavg) write_meta mode=vs-pytorch "torch_where=$TORCH_WHERE" "tally_onednn=$TALLY_ONEDNN" \
    "compile_timeout=$COMPILE_TIMEOUT" "compiled_settings=$([ "$NO_COMPILE" -eq 1 ] && echo "left out (--no-compile)" || echo measured)"
  echo
  "$PY" scripts/bench_torch.py summarize "$OUT"
  echo "runs, logs, summary.md and summary.json: $OUT"
}

# --- --stacks: Tally built on the host and in the Debian 13 root, alternately.
stacks() {
  parse_common --stacks "$@"
  [ -x "$TALLY_HOST" ] || scripts/setup.sh
  trap bench_cleanup EXIT
  root_for --stacks
  echo "bench: building Tally in the Debian 13 root ($BENCH_DIR)"
  debian13_run "$BENCH_DIR" 'cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build -j2 --target tally > /dev/null' ||
    die "the build in the Debian 13 root failed (scripts/test-debian13.sh installs what it needs)"
  wait_for_quiet
  results_dir stacks
  local host_onednn root_onednn row r run runs p
  host_onednn=$(tally_onednn "$TALLY_HOST")
  root_onednn=$(tally_onednn "${DEBIAN13_CHROOT[@]}" DNNL_VERBOSE=1 /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$BENCH_DIR" build/tally)
  for row in "${ROWS[@]}"; do
    row_setup "$row"
    [ "$model" != resnet18-small-images ] || make_photos "$DEBIAN13_ROOT$BENCH_DIR/bench-results/photos-64" 512 64
    dir=$OUT/$slug
    mkdir -p "$dir"
    runs=()
    for p in $PRECISIONS; do runs+=("host:$p" "debian13:$p"); done
    printf '%s\t%s\t%s\t%s\t%s\n' "$slug" "$objective" "models/$model.ini" "$config" "${runs[*]}" >> "$OUT/rows.tsv"
    for ((r = 1; r <= REPEATS; r++)); do
      local order=("${runs[@]}")
      [ $((r % 2)) -eq 0 ] && mapfile -t order < <(printf '%s\n' "${runs[@]}" | tac)
      for run in "${order[@]}"; do
        if [ "${run%%:*}" = host ]; then
          run_tally "host-${run#*:}-rep$r" "${run#*:}"
        else
          run_tally "debian13-${run#*:}-rep$r" "${run#*:}" root
        fi
      done
    done
  done
  PEAK_N=0 PEAK_ONEDNN="" LOAD_END=$(loadavg) write_meta mode=stacks "host_onednn=$host_onednn" \
    "root_onednn=$root_onednn" "precisions=$PRECISIONS"
  echo
  "$PY" scripts/bench_torch.py summarize-stacks "$OUT"
  echo "runs, logs, summary.md and summary.json: $OUT"
}

# --- --profile: each primitive's share of a step and fraction of the peak, per row and precision.
# profile_run NAME PRECISION [root]: one DNNL_VERBOSE run of the current row, its log beside it.
profile_run() {
  local name=$1 precision=$2 where=${3:-host} args inside
  row_args "$precision"
  echo "bench: $slug: $name"
  if [ "$where" = root ]; then
    inside=$(root_row_dir)
    "${DEBIAN13_CHROOT[@]}" DNNL_VERBOSE=1 /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$BENCH_DIR" \
      build/tally "${args[@]}" --out "$inside/$name" > "$dir/$name.verbose" 2>&1 || return 1
    mv "$DEBIAN13_ROOT$BENCH_DIR/$inside/$name" "$dir/$name"
  else
    DNNL_VERBOSE=1 "$TALLY_HOST" "${args[@]}" --out "$dir/$name" > "$dir/$name.verbose" 2>&1 || return 1
  fi
}

# measure_peak_root OUT N: the peak program built and run in the Debian 13 root (its oneDNN);
# sets ROOT_PEAK_F32 and ROOT_PEAK_BF16.
measure_peak_root() {
  local out=$1 n=$2 types=""
  mkdir -p "$DEBIAN13_ROOT$BENCH_DIR/bench-results"
  write_peak_c > "$DEBIAN13_ROOT$BENCH_DIR/bench-results/peak.c"
  debian13_run "$BENCH_DIR" 'cc -O2 -std=c11 -o bench-results/peak bench-results/peak.c -ldnnl' \
    > "$out/peak-root-build.log" 2>&1 || { echo "bench: the peak program did not build in the root" >&2; return 0; }
  grep -qw avx512_bf16 /proc/cpuinfo && types=bf16
  "${DEBIAN13_CHROOT[@]}" /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$BENCH_DIR" \
    bench-results/peak "$n" "$PEAK_REPS" $types 2>&1 | sed 's/^/debian13 /' | tee -a "$out/peak-root.txt"
  ROOT_PEAK_F32=$(awk '$2 == "peak" && $3 == "f32" && $4 + 0 > b { b = $4 } END { print b + 0 }' "$out/peak-root.txt")
  ROOT_PEAK_BF16=$(awk '$2 == "peak" && $3 == "bf16" && $4 + 0 > b { b = $4 } END { print b + 0 }' "$out/peak-root.txt")
}

profile() {
  parse_common --profile "$@"
  [ -x "$TALLY_HOST" ] || scripts/setup.sh
  trap bench_cleanup EXIT
  if [ "$PROFILE_STACKS" -eq 1 ]; then
    root_for --profile
    echo "bench: building Tally in the Debian 13 root ($BENCH_DIR)"
    debian13_run "$BENCH_DIR" 'cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build -j2 --target tally > /dev/null' ||
      die "the build in the Debian 13 root failed (scripts/test-debian13.sh installs what it needs)"
  fi
  wait_for_quiet
  results_dir profile
  PEAK_F32=0 PEAK_BF16=0 ROOT_PEAK_F32=0 ROOT_PEAK_BF16=0
  if [ "$PEAK" -eq 1 ]; then
    measure_peak "$OUT" "$PEAK_N" "host"
    [ "$PROFILE_STACKS" -eq 0 ] || measure_peak_root "$OUT" "$PEAK_N"
  fi
  local row p where name peak_args
  {
    echo "# Where a step's time goes: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "\`scripts/bench.sh $FLAGS\`: $WARMUP warm-up + $STEPS measured steps per run, batch $BATCH, kNN off, load average $LOAD_START at the start."
    echo "Measured peak (oneDNN matmul ${PEAK_N}³, best of $PEAK_REPS): host f32 ${PEAK_F32:-0}, bf16 ${PEAK_BF16:-0} GFLOP/s$([ "$PROFILE_STACKS" -eq 1 ] && echo "; Debian 13 root f32 $ROOT_PEAK_F32, bf16 $ROOT_PEAK_BF16 GFLOP/s")."
  } > "$OUT/summary.md"
  for row in "${ROWS[@]}"; do
    row_setup "$row"
    [ "$PROFILE_STACKS" -eq 0 ] || [ "$model" != resnet18-small-images ] ||
      make_photos "$DEBIAN13_ROOT$BENCH_DIR/bench-results/photos-64" 512 64
    dir=$OUT/$slug
    mkdir -p "$dir"
    for p in $PRECISIONS; do
      for where in host root; do
        [ "$where" = host ] || [ "$PROFILE_STACKS" -eq 1 ] || continue
        name=$([ "$where" = host ] && echo host || echo debian13)-$p
        peak_args=(--peak-f32 "${PEAK_F32:-0}" --peak-bf16 "${PEAK_BF16:-0}")
        [ "$where" = host ] || peak_args=(--peak-f32 "$ROOT_PEAK_F32" --peak-bf16 "$ROOT_PEAK_BF16")
        local onednn
        if ! profile_run "$name" "$p" "$where"; then
          echo "bench: $slug $name failed, see $dir/$name.verbose" >&2
          printf '\n## %s, %s\n\nfailed: see %s\n' "$slug" "$name" "$dir/$name.verbose" >> "$OUT/summary.md"
          continue
        fi
        onednn=$(sed -n 's/.*info,oneDNN v\([0-9][0-9.]*\).*/\1/p' "$dir/$name.verbose" | head -n 1)
        {
          printf '\n## %s, %s (oneDNN %s)\n\n' "$slug" "$p" "$onednn"
          "$PY" scripts/onednn_profile.py "$dir/$name.verbose" "$dir/$name" --warmup "$WARMUP" \
            "${peak_args[@]}" --json "$dir/$name.profile.json" ||
            echo "(no table: see the message above)"
        } >> "$OUT/summary.md"
      done
    done
  done
  echo
  cat "$OUT/summary.md"
  echo "runs, verbose logs, summary.md: $OUT"
}

if [ "${1:-}" = --decode ]; then
  shift
  [ -x build/bench_decode ] || scripts/setup.sh
  OMP_NUM_THREADS=1 exec build/bench_decode "$@"
fi

# plan_time [STEPS] [RECIPE...]: what `tally plan --time` predicts for a run against what the
# same run then measures (summary.json's train_seconds), recipe by recipe, one after the other.
# RECIPE is a file under configs/ without .ini; photos/NAME recipes train on the synthetic folder
# (bench-results/photos-64). The prediction is the probe's median pace times the steps, its range
# the probe's fastest and slowest step: a measured time outside the range is the finding.
plan_time() {
  local steps=${1:-40}
  shift || true
  local recipes=("$@")
  [ ${#recipes[@]} -gt 0 ] || recipes=(inbatch moco mae photos/moco photos/inbatch)
  [ -x build/tally ] || scripts/setup.sh
  local out
  out=bench-results/$(date +%Y%m%d-%H%M%S)-plan-time
  mkdir -p "$out"
  make_photos bench-results/photos-64 512 64
  echo "| recipe | steps | predicted s (range) | measured s | measured / predicted |"
  echo "| --- | --- | --- | --- | --- |"
  local r
  for r in "${recipes[@]}"; do
    local objective=${r#photos/} args=(--config "configs/$r.ini" --steps "$steps" --no-knn)
    objective=${objective%-vit}
    # An objective's recipe names it (the objectives are the ones Tally's keys list).
    if build/tally keys | grep -qF "(read by \`--objective=$objective\`)"; then
      args=(--objective="$objective" "${args[@]}")
    fi
    [[ $r == photos/* ]] && args+=(--data bench-results/photos-64)
    build/tally plan "${args[@]}" --time --json >"$out/${r//\//-}.plan.json" 2>"$out/${r//\//-}.err" &&
      build/tally train "${args[@]}" --out "$out/${r//\//-}" >"$out/${r//\//-}.log" 2>&1 ||
      { echo "| $r | $steps | failed: $(tail -1 "$out/${r//\//-}.err") | | |"; continue; }
    "$PY" - "$r" "$steps" "$out/${r//\//-}.plan.json" "$out/${r//\//-}/summary.json" <<'PY'
import json, sys
name, steps, plan_path, summary_path = sys.argv[1:]
plan = json.loads(open(plan_path).read().strip().splitlines()[-1])
measured = json.load(open(summary_path))["train_seconds"]
lo, hi = plan["timed_run_seconds_range"]
print(f"| {name} | {steps} | {plan['timed_run_seconds']:.1f} ({lo:.1f}-{hi:.1f}) | {measured:.1f} "
      f"| {measured / plan['timed_run_seconds']:.2f} |")
PY
  done
  echo "plans, logs and run folders: $out"
}

if [ "${1:-}" = --profile ]; then
  shift
  profile "$@"
  exit
fi

if [ "${1:-}" = --plan-time ]; then
  shift
  plan_time "$@"
  exit
fi

if [ "${1:-}" = --vs-pytorch ] || [ "${1:-}" = --stacks ]; then
  mode=$1
  shift
  export TUNABLES PEAK_REPS PEAK_N PEAK_ONEDNN PEAK_F32 PEAK_F32_IMPL PEAK_BF16 PEAK_BF16_IMPL WARMUP \
    STEPS REPEATS BATCH PHOTO_BATCH QUICK FLAGS LOAD_START LOAD_END
  if [ "$mode" = --vs-pytorch ]; then vs_pytorch "$@"; else stacks "$@"; fi
  exit
fi

steps=${1:-25}
shift || true
recipes=("$@")
[ ${#recipes[@]} -gt 0 ] || recipes=(inbatch moco mae inbatch-vit moco-vit)
warmup=5
[ "$steps" -gt $((warmup + 1)) ] || { echo "bench: need more than $((warmup + 1)) steps" >&2; exit 2; }
[ -x build/tally ] || scripts/setup.sh
# Batch 256 by default whatever the recipe says, so the numbers compare with the reference's.
extra=(--set "train.batch_size=${TALLY_BENCH_BATCH:-256}")
for kv in ${TALLY_BENCH_SET:-}; do extra+=(--set "$kv"); done

out=bench-results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
printf '%-12s %-8s %6s %10s %10s %12s %14s\n' recipe objective batch "images/s" "step ms" "GFLOP/step" "peak RSS MiB"
for recipe in "${recipes[@]}"; do
  case $recipe in
    *-vit) objective=${recipe%-vit} ;;
    *) objective=$recipe ;;
  esac
  run="$out/$recipe"
  build/tally train --objective="$objective" --config "configs/$recipe.ini" --steps "$steps" \
    --no-knn --quiet --out "$run" "${extra[@]}" > "$run.log" 2>&1 || {
    echo "bench: $recipe failed, see $run.log" >&2
    continue
  }
  # Median step time over the steps after warm-up, from the ledger (field: value pairs).
  field() { grep -o "\"$1\":[^,}]*" "$run/ledger.jsonl" | cut -d: -f2; }
  median=$(paste <(field step) <(field step_ms) | awk -v w=$warmup '$1 >= w { print $2 }' |
    sort -g | awk '{ t[NR] = $1 } END { print (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }')
  gflop=$(paste <(field flops_forward) <(field flops_backward) <(field replicas) | tail -n 1 |
    awk '{ print ($1 + $2) * $3 / 1e9 }')
  batch=$(grep -o '"batch_size": [0-9]*' "$run/summary.json" | grep -o '[0-9]*$')
  rss=$(grep -o '"peak_rss_bytes": [0-9]*' "$run/summary.json" | grep -o '[0-9]*$')
  awk -v r="$recipe" -v o="$objective" -v b="$batch" -v m="$median" -v g="$gflop" -v rss="$rss" \
    'BEGIN { printf "%-12s %-8s %6d %10.1f %10.1f %12.1f %14.0f\n", r, o, b, b * 1000 / m, m, g, rss / 1048576 }'
done
echo "runs and ledgers: $out"
