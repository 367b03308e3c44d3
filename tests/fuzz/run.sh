#!/usr/bin/env bash
# Fuzzes Tally's readers of untrusted files with libFuzzer (clang; AddressSanitizer, LeakSanitizer
# and UndefinedBehaviorSanitizer on), one harness per reader:
#   config       INI recipe + model file, config_load_text and config_validate (and write/read back)
#   idx          IDX images + labels, plain and gzip (dataset_load_idx)
#   image        PNG/JPEG/BMP in an ImageFolder tree, in memory and streamed (dataset_load_imagefolder,
#                augment_view, eval_view; libjpeg-turbo and stb_image)
#   safetensors  checkpoints and exports (st_parse, checkpoint_restore, checkpoint_config,
#                weights_find, export_checkpoint)
#   ledger       run folders (ledger_read_json, report_write, ledger_truncate_for_resume)
#
#   tests/fuzz/run.sh [HARNESS...]     all harnesses when none is named
#
# Builds the library with clang into build-fuzz/ (installs clang, its fuzzer runtime and libomp
# with apt-get when missing; scripts/setup.sh must have run), replays every input under
# regressions/HARNESS/ (each must pass, within 5 s), then fuzzes each harness for FUZZ_SECONDS
# (default 30; 0 replays the regressions only) from the seeds in corpus/HARNESS/. Inputs found on
# the way are kept in build-fuzz/corpus/, never in the source tree. Exits non-zero if any
# regression or fuzzing run crashes, leaks, runs out of memory or times out (FUZZ_TIMEOUT seconds
# for one input, default 20); the input that did is under build-fuzz/artifacts/HARNESS/. To turn
# it into a regression:
#   build-fuzz/fuzz_HARNESS -minimize_crash=1 -max_total_time=60 ARTIFACT
# and copy the smallest (minimized-from-*) file to tests/fuzz/regressions/HARNESS/.
set -euo pipefail
cd "$(dirname "$0")/../.."
fuzz_dir=tests/fuzz
build="build-fuzz"
seconds=${FUZZ_SECONDS:-30}
timeout_s=${FUZZ_TIMEOUT:-20}
all_harnesses=(config idx image safetensors ledger)
harnesses=("$@")
[ $# -gt 0 ] || harnesses=("${all_harnesses[@]}")
for h in "${harnesses[@]}"; do
  if [ ! -f "$fuzz_dir/fuzz_$h.c" ]; then
    echo "run.sh: no harness '$h' (${all_harnesses[*]})" >&2
    exit 2
  fi
done

# --- Toolchain: clang with libFuzzer's runtime, and LLVM's OpenMP (clang does not use libgomp).
packages=(clang libclang-rt-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "run.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
    "${missing[@]}"
fi

# --- Build: the library with coverage instrumentation and sanitizers, then one executable per
# harness linked with libFuzzer's main and the libraries tallylib links (CMakeLists.txt).
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cflags="-g -O1 $sanitize -D_GNU_SOURCE -Wall -Wextra $(pkg-config --cflags inih stb)"
log=$build/build.log
mkdir -p "$build"
if ! { cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
         -DCMAKE_C_FLAGS="-O1 $sanitize -fsanitize=fuzzer-no-link" &&
       cmake --build "$build" --target tallylib -j"$(nproc)"; } > "$log" 2>&1; then
  cat "$log" >&2
  echo "run.sh: building the library failed" >&2
  exit 1
fi
libs="-fopenmp=libomp -ldnnl -lz -ljpeg $(mpicc --showme:link) $(pkg-config --libs inih stb) -lm -lpthread"
for h in "${harnesses[@]}"; do
  # shellcheck disable=SC2086  # flags are word lists
  clang $cflags -fsanitize=fuzzer -Isrc -I"$fuzz_dir" "$fuzz_dir/fuzz_$h.c" "$build/libtallylib.a" \
    $libs -o "$build/fuzz_$h"
done

# --- Run. OpenMP loops (the ImageFolder decode) on one thread: CI machines are shared, and a
# failing input then fails the same way every time.
export OMP_NUM_THREADS=1
export UBSAN_OPTIONS=print_stacktrace=1
# The harnesses write each input to files here (/dev/shm when there is one: the readers fsync).
scratch_base=${TMPDIR:-/tmp}
[ -w /dev/shm ] && scratch_base=/dev/shm
scratch=$(mktemp -d "$scratch_base/tally-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
failed=()

# The sanitizer's report from a log: from the error to its summary, without libFuzzer's own frames
# and the shadow-memory dump.
show_failure() {
  sed -n '/ERROR: \|runtime error\|^fuzz_[a-z]*: /,/^SUMMARY/p' "$1" |
    grep -v ' in fuzzer::\|^  0x\|^=>0x\|^Shadow byte\|^  [A-Z][a-z].*: *[0-9a-f ]*$' |
    head -n 40 >&2
}

# Every regression input on its own, so one that still fails does not hide the others. They are
# small files that run in milliseconds once fixed: 5 s for one is a failure, and far from the
# 18 s and more that the slow ones (tiny images claiming 8000x8000 pixels) take under the
# sanitizers, so a slow input fails every time rather than by the clock.
for h in "${harnesses[@]}"; do
  for input in "$fuzz_dir/regressions/$h"/*; do
    [ -f "$input" ] || continue
    if "$build/fuzz_$h" -timeout=5 "$input" > "$scratch/replay.log" 2>&1; then
      echo "fuzz $h: regression $(basename "$input") passes"
    else
      show_failure "$scratch/replay.log"
      echo "fuzz $h: regression $(basename "$input") FAILS (above)" >&2
      failed+=("$h/$(basename "$input")")
    fi
  done
done

[ "$seconds" -gt 0 ] || harnesses=()
for h in "${harnesses[@]}"; do
  corpus=$build/corpus/$h
  artifacts=$build/artifacts/$h
  mkdir -p "$corpus" "$artifacts"
  run_log=$build/fuzz-$h.log
  if "$build/fuzz_$h" "$corpus" "$fuzz_dir/corpus/$h" -max_total_time="$seconds" \
      -timeout="$timeout_s" -artifact_prefix="$artifacts/" -print_final_stats=1 \
      > "$run_log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run_log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$run_log")
    features=$(grep -o 'ft: [0-9]*' "$run_log" | tail -n 1 | cut -d' ' -f2)
    echo "fuzz $h: ${seconds} s, ${execs:-?} inputs (${rate:-?}/s), ${features:-?} features," \
      "no failure"
  else
    show_failure "$run_log"
    echo "fuzz $h: FAILED (above; full log $run_log, input under $artifacts/)" >&2
    failed+=("$h")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "run.sh: failed: ${failed[*]}" >&2
  exit 1
fi
