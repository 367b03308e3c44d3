#!/usr/bin/env bash
# Valgrind memcheck over what a user runs: `tally train` for each objective (3 steps on the 16
# sample images of data/samples/stripes, batches of 8, a checkpoint every step, moco with a queue
# of 12 keys so that it wraps part way through a batch), then `tally eval` and `tally export` of
# the inbatch run and `tally plan` of every objective; mae writes its reconstruction PNGs. Each run
# must exit 0 with no memcheck error and no definitely lost block (still-reachable and possibly
# lost blocks are not errors: the OpenMP runtime's threads keep their thread-local storage until
# exit).
#
# Prints `ok - NAME` or `not ok - NAME: why` followed by valgrind's report, then
# `N passed, M failed`; exits 1 if a run failed. Without valgrind it prints `SKIPPED: why` and
# exits 77, unless CI is set, where that is a failure. TALLY_BIN defaults to build/tally_valgrind
# (CMakeLists.txt: tally built without AVX-512, which valgrind cannot decode). Run from anywhere.
set -euo pipefail

cd "$(dirname "$0")/.."
# Empty (not unset) when CMake found no valgrind to build tally_valgrind for.
TALLY_BIN=${TALLY_BIN-build/tally_valgrind}
case $TALLY_BIN in /* | "") ;; *) TALLY_BIN=$PWD/$TALLY_BIN ;; esac
LIMIT=300         # seconds for any one run under valgrind (each takes 3 to 40 s here)
VALGRIND_RC=99    # valgrind's exit code when it found errors; Tally never exits with it

skip_or_fail() {
  if [[ -n ${CI+set} ]]; then
    echo "not ok - setup: $1 (CI is set: a skip would hide the test)"
    exit 1
  fi
  echo "SKIPPED: $1"
  exit 77
}

if ! command -v valgrind >/dev/null; then
  skip_or_fail "valgrind is not installed (scripts/setup.sh --for-tests installs it)"
fi
if [[ ! -x $TALLY_BIN ]]; then
  echo "not ok - setup: TALLY_BIN='$TALLY_BIN' is not an executable (CMakeLists.txt builds" \
    "tally_valgrind only where it finds valgrind: configure again now that it is installed)"
  exit 1
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# One OpenMP thread where Tally takes the count from the environment. The trainer and the planner
# take theirs from the cores they may use instead, so a second thread may still run: valgrind
# runs one thread at a time, and an OpenMP thread spinning at a barrier would only take turns
# from the one it waits for.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# oneDNN picks its JIT kernels from CPUID. Valgrind decodes no AVX-512, and it emulates each FMA
# lane by lane in a helper call: oneDNN's AVX2 kernels (FMA) are so slow under it that 2 steps of
# inbatch take 58 s of CPU, against 10 s with its AVX kernels. AVX is the widest ISA valgrind runs
# at a usable speed.
export ONEDNN_MAX_CPU_ISA=AVX

# Valgrind's default --smc-check (all-non-file) already rechecks code written into anonymous
# memory, which is where oneDNN's JIT puts its kernels.
# No --track-origins: it makes every run half as slow again; add it by hand to find where an
# uninitialised value reported here comes from.
VALGRIND=(valgrind --error-exitcode="$VALGRIND_RC" --leak-check=full
  --errors-for-leak-kinds=definite --show-leak-kinds=definite --num-callers=40)

passed=0
failed=0

# run NAME ARGS...: tally ARGS under memcheck; `ok` when it exits 0 with no memcheck error,
# else `not ok` with Tally's stderr and valgrind's report.
run() {
  local name=$1 log=$TMP/${1// /-}.valgrind rc=0 start=$SECONDS
  shift
  timeout "$LIMIT" "${VALGRIND[@]}" --log-file="$log" "$TALLY_BIN" "$@" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
  local why=""
  case $rc in
    0) ;;
    "$VALGRIND_RC") why="memcheck errors" ;;
    124) why="no end after $LIMIT s (killed by timeout)" ;;
    *) why="exit $rc" ;;
  esac
  if [[ -z $why ]]; then
    echo "ok - $name ($((SECONDS - start)) s)"
    passed=$((passed + 1))
    return
  fi
  echo "not ok - $name: $why (tally $*)"
  sed 's/^/# stderr: /' "$TMP/err"
  sed 's/^/# /' "$log"
  failed=$((failed + 1))
}

# Every objective Tally has: the ones its keys list (a new objective is run here unlisted).
mapfile -t OBJECTIVES < <("$TALLY_BIN" keys | sed -n 's/.*(read by `--objective=\([a-z0-9_]*\)`).*/\1/p')
if [[ ${#OBJECTIVES[@]} -lt 7 ]]; then
  echo "not ok - setup: tally keys listed ${#OBJECTIVES[@]} objectives (${OBJECTIVES[*]}), fewer than the 7 it has"
  exit 1
fi

SMALL=(--set data.dataset=stripes --set train.batch_size=8 --steps 3
  --set train.checkpoint_every=1 --no-knn --quiet)
for objective in "${OBJECTIVES[@]}"; do
  case $objective in
    moco) extra=(--set moco.queue_size=12) ;;
    mae) extra=(--set mae.png_every=2) ;;
    *) extra=() ;;
  esac
  run "train $objective" train --objective="$objective" "${SMALL[@]}" "${extra[@]}" \
    --out "$TMP/$objective"
done

if [[ -s $TMP/inbatch/checkpoint.safetensors ]]; then
  run "eval inbatch" eval "$TMP/inbatch"
  run "export inbatch" export "$TMP/inbatch" --out "$TMP/encoder.safetensors"
else
  echo "not ok - eval and export inbatch: the inbatch run left no checkpoint"
  failed=$((failed + 1))
fi

objectives_csv=$(IFS=,; echo "${OBJECTIVES[*]}")
run "plan $objectives_csv" plan --objective="$objectives_csv" --set data.dataset=stripes \
  --set train.batch_size=8 --steps 3 --no-knn

echo "$passed passed, $failed failed"
((failed == 0))
