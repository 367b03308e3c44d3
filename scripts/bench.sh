#!/usr/bin/env bash
# Throughput and memory per objective: trains each recipe for a few steps on Fashion-MNIST at
# batch 256 (TALLY_BENCH_BATCH to change it) and prints images/s (median step after warm-up),
# GFLOP per step and peak RSS.
#   scripts/bench.sh [STEPS] [RECIPE...]     e.g. scripts/bench.sh 25 inbatch moco mae
# Extra settings go through TALLY_BENCH_SET, e.g. TALLY_BENCH_SET="parallel.replicas=2".
#
# Tally against PyTorch on the same networks, both measured in one run, alternately:
#   scripts/bench.sh --vs-pytorch [--warmup W] [--steps N] [--repeats R] [--no-peak]
#                    [--peak-size N] [--any-blas] [--wait-quiet SECONDS] [--require-quiet]
#                    [OBJECTIVE/MODEL...]
# Rows (default): inbatch/resnet-small-32 moco/resnet-small-32 mae/vit-tiny inbatch/vit-tiny
# moco/vit-tiny inbatch/resnet18-small-images moco/resnet18-small-images; MODEL is a file in
# models/, the recipe configs/OBJECTIVE.ini (configs/OBJECTIVE-vit.ini for a vit model, except
# mae). The resnet18-small-images rows train on photo-sized input: 64x64 RGB at batch 64
# (TALLY_BENCH_PHOTO_BATCH), from a folder of 512 synthetic RGB images the benchmark writes once
# (bench-results/photos-64); PyTorch's side, as on every row, trains on random tensors. Each row
# runs R (default 2) pairs, Tally then PyTorch, then PyTorch then Tally, ..., each W (5) warm-up
# + N (20) measured steps;
# scripts/bench_torch.py is the PyTorch side (and measures both sides' processes). Before the
# rows and again after them, a oneDNN matmul of N×N×N (4096) in fp32 and, when the CPU has
# avx512_bf16, bf16 measures the peak (the best reading) the achieved GFLOP/s are a fraction
# of. Results, logs and every run folder go under bench-results/<timestamp>-vs-pytorch/;
# summary.md there is the Markdown table printed last.
# Final numbers need a quiet machine: the summary flags a run that started with a load average
# of 1.5 or more or during which other processes kept half a core busy (--wait-quiet S waits up
# to S seconds for the load to drop first; --require-quiet exits with 3 instead of measuring
# if it has not).
#
# The time `tally plan --time` predicts against the run's measured time, recipe by recipe:
#   scripts/bench.sh --plan-time [STEPS=40] [RECIPE...]    e.g. --plan-time 40 moco photos/moco
#
# Decoding on one core (tests/bench_decode.c): stb_image against libjpeg-turbo, full size and at
# the reduction a view allows, over the first N images of a folder:
#   scripts/bench.sh --decode DIR [N=500] [VIEW_SIZE=64] [CHANNELS=3] [REPEATS=3]
#
# How PyTorch is made fair (the conditions under which the reference numbers were measured):
# - Debian's python3-torch, run with /usr/bin/python3 (a python3 earlier on PATH may lack torch).
# - BLAS: Debian's torch calls whatever libblas.so.3 resolves to, the reference BLAS by default,
#   which makes every Linear and attention matmul many times slower. libopenblas0-openmp is
#   installed when missing (apt-get, which also makes it the system's libblas.so.3 alternative)
#   and its directory is put first on the PyTorch process's LD_LIBRARY_PATH whatever the
#   alternative says; the PyTorch process reports the BLAS it actually mapped, and the benchmark
#   stops if that is not OpenBLAS (--any-blas to go on anyway). Convolutions go through oneDNN
#   (the same libdnnl 2.6 Tally links) in both.
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

static int run(dnnl_engine_t eng, dnnl_stream_t s, dnnl_data_type_t dt, const char *name, int n,
               int reps) {
  dnnl_dims_t dims = {n, n};
  dnnl_memory_desc_t a_md, b_any, c_md, b_plain;
  CHECK(dnnl_memory_desc_init_by_tag(&a_md, 2, dims, dt, dnnl_ab));
  CHECK(dnnl_memory_desc_init_by_tag(&b_any, 2, dims, dt, dnnl_format_tag_any));
  CHECK(dnnl_memory_desc_init_by_tag(&b_plain, 2, dims, dt, dnnl_ab));
  CHECK(dnnl_memory_desc_init_by_tag(&c_md, 2, dims, dnnl_f32, dnnl_ab));
  dnnl_matmul_desc_t md;
  CHECK(dnnl_matmul_desc_init(&md, &a_md, &b_any, NULL, &c_md));
  dnnl_primitive_desc_t pd;
  if (dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success) {
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
  const dnnl_memory_desc_t *b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  dnnl_memory_t a, b, bp, c;
  CHECK(dnnl_memory_create(&a, &a_md, eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&bp, &b_plain, eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&b, b_md, eng, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&c, &c_md, eng, DNNL_MEMORY_ALLOCATE));
  fill(a, dt, (size_t)n * n);
  fill(bp, dt, (size_t)n * n);
  dnnl_primitive_desc_t rpd;
  CHECK(dnnl_reorder_primitive_desc_create(&rpd, &b_plain, eng, b_md, eng, NULL));
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

vs_pytorch() {
  local warmup=5 steps=20 repeats=2 peak=1 peak_n=4096 any_blas=0 wait_quiet=0 require_quiet=0
  local rows=()
  PEAK_REPS=8
  while [ $# -gt 0 ]; do
    case $1 in
      --warmup) warmup=${2:-}; shift 2 ;;
      --warmup=*) warmup=${1#*=}; shift ;;
      --steps) steps=${2:-}; shift 2 ;;
      --steps=*) steps=${1#*=}; shift ;;
      --repeats) repeats=${2:-}; shift 2 ;;
      --repeats=*) repeats=${1#*=}; shift ;;
      --no-peak) peak=0; shift ;;
      --peak-size) peak_n=${2:-}; shift 2 ;;
      --peak-size=*) peak_n=${1#*=}; shift ;;
      --any-blas) any_blas=1; shift ;;
      --wait-quiet) wait_quiet=${2:-}; shift 2 ;;
      --wait-quiet=*) wait_quiet=${1#*=}; shift ;;
      --require-quiet) require_quiet=1; shift ;;
      -h | --help) sed -n '8,28p' "$0" | sed 's/^# \{0,1\}//'; return 0 ;;
      */*) rows+=("$1"); shift ;;
      *) die "unknown argument '$1' (rows are OBJECTIVE/MODEL, e.g. moco/vit-tiny)" ;;
    esac
  done
  for v in "$warmup" "$steps" "$repeats" "$peak_n" "$wait_quiet"; do
    [[ $v =~ ^[0-9]+$ ]] || die "expected a number, got '$v'"
  done
  if [ "$steps" -lt 1 ] || [ "$repeats" -lt 1 ]; then die "need --steps >= 1 and --repeats >= 1"; fi
  [ ${#rows[@]} -gt 0 ] ||
    rows=(inbatch/resnet-small-32 moco/resnet-small-32 mae/vit-tiny inbatch/vit-tiny moco/vit-tiny
      inbatch/resnet18-small-images moco/resnet18-small-images)

  [ -x build/tally ] || scripts/setup.sh
  if ! "$PY" -c 'import torch' 2> /dev/null; then
    die "$PY cannot import torch: apt-get install python3-torch"
  fi
  ensure_openblas

  local batch=${TALLY_BENCH_BATCH:-256}
  local extra=(--set "train.batch_size=$batch")
  for kv in ${TALLY_BENCH_SET:-}; do extra+=(--set "$kv"); done
  local torch_env=(env "GLIBC_TUNABLES=$TUNABLES" OMP_NUM_THREADS=2
    "LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

  # --wait-quiet S: wait up to S seconds for the 1-minute load average to fall below 1.5.
  local waited=0
  while [ "$waited" -lt "$wait_quiet" ] && awk -v l="$(loadavg)" 'BEGIN { exit !(l >= 1.5) }'; do
    [ "$waited" -eq 0 ] && echo "bench: load average $(loadavg); waiting up to ${wait_quiet}s for it to fall below 1.5"
    sleep 15
    waited=$((waited + 15))
  done
  if [ "$require_quiet" -eq 1 ] && awk -v l="$(loadavg)" 'BEGIN { exit !(l >= 1.5) }'; then
    echo "bench: load average $(loadavg) is still 1.5 or more: not measuring (--require-quiet)" >&2
    exit 3
  fi

  local out
  out=bench-results/$(date +%Y%m%d-%H%M%S)-vs-pytorch
  mkdir -p "$out"
  local load_start
  load_start=$(loadavg)
  echo "bench: results in $out; load average $load_start$(awk -v l="$load_start" \
    'BEGIN { if (l >= 1.5) print " (loaded: numbers from this run are not final)" }')"

  PEAK_ONEDNN="" PEAK_F32="" PEAK_F32_IMPL="" PEAK_BF16="" PEAK_BF16_IMPL=""
  PEAK_DIR=""
  trap '[ -n "${PEAK_DIR:-}" ] && rm -rf "$PEAK_DIR"' EXIT
  [ "$peak" -eq 0 ] || measure_peak "$out" "$peak_n" start

  : > "$out/rows.tsv"
  local row objective model config slug dir params r side torch_version="" blas=""
  for row in "${rows[@]}"; do
    objective=${row%%/*}
    model=${row#*/}
    [ -f "models/$model.ini" ] || die "no model file models/$model.ini (row $row)"
    if [[ $model == vit* && $objective != mae ]]; then config=configs/$objective-vit.ini; else config=configs/$objective.ini; fi
    [ -f "$config" ] || die "no recipe $config (row $row)"
    slug=$objective-$model
    dir=$out/$slug
    mkdir -p "$dir"
    printf '%s\t%s\t%s\t%s\n' "$slug" "$objective" "models/$model.ini" "$config" >> "$out/rows.tsv"
    local set=(--set "model.file=models/$model.ini" "${extra[@]}")
    [ "$objective" = mae ] && set+=(--set mae.png_every=0)  # output, not training
    if [ "$model" = resnet18-small-images ]; then
      make_photos bench-results/photos-64 512 64
      set+=(--set data.format=imagefolder --set data.labels=none --set data.train=bench-results/photos-64
        --set data.test=bench-results/photos-64 --set data.image_size=64 --set data.channels=3
        --set "train.batch_size=${TALLY_BENCH_PHOTO_BATCH:-64}")
    fi
    params=$(build/tally plan --objective="$objective" --config "$config" "${set[@]}" 2> "$dir/plan.log" |
      awk '$1 == "parameters" { print $2 }') || true
    [ -n "$params" ] || { echo "bench: tally plan failed for $row, see $dir/plan.log" >&2; continue; }
    for ((r = 1; r <= repeats; r++)); do
      local order=(tally torch)
      [ $((r % 2)) -eq 0 ] && order=(torch tally)
      for side in "${order[@]}"; do
        if [ "$side" = tally ]; then
          echo "bench: $row repeat $r: Tally"
          "$PY" scripts/bench_torch.py exec --json "$dir/tally-rep$r.exec.json" --log "$dir/tally-rep$r.log" -- \
            env -u GLIBC_TUNABLES build/tally train --objective="$objective" --config "$config" --steps $((warmup + steps)) \
            --no-knn --quiet --out "$dir/tally-rep$r" "${set[@]}" ||
            echo "bench: Tally failed on $row, see $dir/tally-rep$r.log" >&2
        else
          if [ ! -f "$dir/tally-rep1/config.ini" ]; then
            echo "bench: no Tally config for $row (its first run failed): PyTorch skipped" >&2
            continue
          fi
          echo "bench: $row repeat $r: PyTorch"
          "$PY" scripts/bench_torch.py exec --json "$dir/torch-rep$r.exec.json" --log "$dir/torch-rep$r.log" -- \
            "${torch_env[@]}" "$PY" scripts/bench_torch.py run --config "$dir/tally-rep1/config.ini" \
            --objective "$objective" --warmup "$warmup" --steps "$steps" --expect-params "$params" \
            --json "$dir/torch-rep$r.json" || {
            echo "bench: PyTorch failed on $row, see $dir/torch-rep$r.log" >&2
            continue
          }
          if [ -z "$blas" ]; then
            blas=$("$PY" -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["blas"]))' "$dir/torch-rep$r.json")
            torch_version=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["torch"])' "$dir/torch-rep$r.json")
            echo "bench: PyTorch $torch_version uses BLAS ${blas:-(none mapped)}"
            if [[ $blas != *openblas* ]] && [ "$any_blas" -eq 0 ]; then
              die "PyTorch did not map OpenBLAS (got '${blas:-nothing}'): its numbers would not be fair; --any-blas to go on"
            fi
          fi
        fi
      done
    done
  done

  [ "$peak" -eq 0 ] || measure_peak "$out" "$peak_n" end
  WARMUP=$warmup STEPS=$steps REPEATS=$repeats BATCH=$batch TORCH=$torch_version BLAS=$blas \
    LOAD_START=$load_start LOAD_END=$(loadavg) PEAK_N=$peak_n \
    "$PY" -c '
import json, os, sys
e = os.environ
num = lambda k: float(e[k]) if e.get(k) else None
meta = {"warmup": int(e["WARMUP"]), "steps": int(e["STEPS"]), "repeats": int(e["REPEATS"]),
        "batch": int(e["BATCH"]), "torch": e["TORCH"], "blas": e["BLAS"], "tunables": e["TUNABLES"],
        "loadavg_start": num("LOAD_START"), "loadavg_end": num("LOAD_END"),
        "peak": {"n": int(e["PEAK_N"]), "reps": int(e["PEAK_REPS"]), "onednn": e["PEAK_ONEDNN"],
                 "f32": num("PEAK_F32"), "f32_impl": e["PEAK_F32_IMPL"],
                 "bf16": num("PEAK_BF16"), "bf16_impl": e["PEAK_BF16_IMPL"]}}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
' "$out/meta.json"
  echo
  "$PY" scripts/bench_torch.py summarize "$out"
  echo "runs, logs and summary.md: $out"
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
    case $objective in
      inbatch | moco | mae | byol | vicreg | dino) args=(--objective="$objective" "${args[@]}") ;;
    esac
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

if [ "${1:-}" = --plan-time ]; then
  shift
  plan_time "$@"
  exit
fi

if [ "${1:-}" = --vs-pytorch ]; then
  shift
  export TUNABLES PEAK_REPS PEAK_ONEDNN PEAK_F32 PEAK_F32_IMPL PEAK_BF16 PEAK_BF16_IMPL
  vs_pytorch "$@"
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
