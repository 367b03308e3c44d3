#!/usr/bin/env bash
# Fault injection: Tally run as a user would, with a fault injected, and what is left afterwards.
#
# Every case asserts the exit code (README, "Exit codes") and the run folder's state: which files
# exist, that no summary.json claims success, that the last good checkpoint is whole (it loads in
# `tally export` / `tally eval`) and that `--resume` continues from it. Every tally call runs under
# `timeout 120`; a timeout (exit 124) is reported as a hang. Runs are tiny (256 or 512 images,
# a few steps, --no-knn, also on --resume, which does not carry --no-knn over from the run).
#
#   1 full disk (tmpfs of 64 KiB, then 4 MiB)      6 MPI: rank 0 cannot create its folder, a killed
#   2 unwritable folder (read-only fs, uid 65534)    rank, more ranks than samples, moco shard of one,
#                                                    ranks that disagree, a stale resume, a SIGSTOP
#   3 two runs on one folder; reuse, --overwrite   7 the loss becomes NaN
#   4 SIGINT / SIGTERM / SIGHUP / a second SIGINT  8 corrupt and truncated checkpoints
#   5 kill -9 (during a step, during a write)      9 a step count beyond what Tally counts
#  10 poisoned state: a NaN weight, an edited or missing metadata checksum, a 10 GB non-checkpoint,
#     a weight turned NaN by an update, resuming over changed data
#  11 run-folder files that are not regular files; outputs over a device node or a run's own
#     state; a checkpoint of another run in the folder
#  12 budget edges (below one step, past what Tally counts); plan counts what train takes
#  13 --resume of a finished run, and of one whose end was cut short
#  14 inbatch at a batch of 1; the binary used from another folder (installed); a deep model;
#     an address-space limit (ulimit -v)
#  15 the run folder locked as a folder: its .lock removed, a symbolic link in its place, a run
#     file as a link, the folder moved away under a run
#  16 recipe lines Tally would not read as written: CR-only line ends, a key on a section's line, hex
#  17 a streamed image replaced during the run by another of the same size
#  18 a run resumed on another core count: the thread count recorded, a note
#  19 tally eval RUN that cannot write its record
#  20 tally compare's files read back: a cut-off, foreign or linked compare-eval.json, a cut-off
#     compare.settings, report/export/embed --out over a compare's files, a killed compare's
#     temporaries
#  21 a resume over another run's ledger.csv or eval.jsonl; a resume after the summary was lost
#     (one record of the last evaluation)
#  22 MPI: rank 0's evaluation longer than parallel.timeout; rank 0 stopped during it
#  23 a data path of 600 characters
#  24 a CMYK JPEG and a top-down BMP in a streamed photo folder; an undecodable JPEG refused at listing
#
# Prints `ok - NAME` or `not ok - NAME: why` per case, `SKIP: ...` for a case this machine cannot
# run, then `N passed, M failed`; exits 1 if any case failed. Needs root for the tmpfs mounts
# (without it the full-disk case falls back to RLIMIT_FSIZE). Run from anywhere; TALLY_BIN
# defaults to build/tally. TALLY_FAULTS_SECTIONS="6 20" runs only those sections.
set -u

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
MPIRUN=${MPIEXEC:-mpirun}
# mpirun with Open MPI's own allocations left out of LeakSanitizer's report (a sanitizer build):
# it leaks in its components at exit (ompi_op_base_op_select and dlopen'ed modules), which would
# turn every successful run under mpirun into exit 1. Tally's leaks are checked without MPI.
MPIRUN_CMD=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$MPIRUN" -x ASAN_OPTIONS)

MOUNTS=()
BG_PIDS=()
# On any exit (tests/lib.sh), before the temp dir goes.
release() {
  local p m
  for p in "${BG_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
}

# Small and quick: 256 images of 28x28, batches of 32 (8 steps per epoch), no kNN monitor.
SMALL=(--set data.limit=256 --set train.batch_size=32 --no-knn --quiet)
# 512 images: 16 steps per epoch, so an 8-step run has no epoch end (and no checkpoint) inside it.
SMALL512=(--set data.limit=512 --set train.batch_size=32 --no-knn --quiet)
# The files a run folder may hold (README, "Using it"); anything else is a stray file.
KNOWN_FILES=" .lock config.ini ledger.jsonl ledger.csv checkpoint.safetensors eval.jsonl summary.json report.html encoder.safetensors "

skip() { echo "SKIP: $*"; }

# t LABEL ARGS...: runs tally under the timeout, its output in $TMP/LABEL.out/.err; sets rc.
t() {
  local label=$1
  shift
  # (the braces keep bash's own "Killed" notice of a kill -9 out of the output)
  { timeout "$LIMIT" "$TALLY_BIN" "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"; rc=$?; } 2>/dev/null
  last=$TMP/$label
}

# expect_rc WANT WHAT: the last call ($rc, $last) exited with WANT; a timeout is a hang.
expect_rc() {
  if [[ $rc == 124 ]]; then
    bad "$2: hang (killed by timeout after ${LIMIT} s)"
    return 1
  fi
  if [[ $rc != "$1" ]]; then
    bad "$2: exit $rc, expected $1 (stderr: $(firstline "$last.err"))"
    return 1
  fi
}

# expect_nonzero WHAT: the last call failed, but not by the timeout.
expect_nonzero() {
  if [[ $rc == 124 ]]; then
    bad "$1: hang (killed by timeout after ${LIMIT} s)"
    return 1
  fi
  if [[ $rc == 0 ]]; then
    bad "$1: exit 0, expected a failure"
    return 1
  fi
}

# said FILE REGEX WHAT: FILE (output of the last call) has a line matching REGEX (grep -E -i).
said() {
  grep -Eqi -- "$2" "$1" || bad "$3: no line matching /$2/ (stderr: $(firstline "${1%.*}.err"))"
}

# one_line_error FILE REGEX WHAT: FILE (stderr) is exactly one line, and it matches REGEX.
one_line_error() {
  local n
  n=$(grep -c . "$1")
  if [[ $n != 1 ]]; then
    bad "$3: stderr has $n lines, expected one ($(firstline "$1"))"
  fi
  said "$1" "$2" "$3"
}

no_summary() {
  [[ ! -e $1/summary.json ]] || bad "$1/summary.json exists after a failed or interrupted run"
}

has_summary() {
  [[ -s $1/summary.json ]] || bad "no summary.json in $1 after a finished run"
}

# no_stray DIR: DIR holds only the files a run folder may hold (no temporary checkpoint left).
no_stray() {
  local f name
  for f in "$1"/* "$1"/.[!.]*; do
    [[ -e $f ]] || continue
    name=${f##*/}
    [[ $KNOWN_FILES == *" $name "* ]] || bad "stray file $name in the run folder"
  done
}

# loads DIR: DIR's checkpoint exists and `tally export` reads it.
loads() {
  local saved_rc=$rc saved_last=$last
  if [[ ! -s $1/checkpoint.safetensors ]]; then
    bad "no checkpoint.safetensors in $1"
  else
    t load-check export "$1" --out "$TMP/export-check.safetensors"
    expect_rc 0 "tally export of the checkpoint (does not load)"
    rm -f "$TMP/export-check.safetensors"
  fi
  rc=$saved_rc
  last=$saved_last
}

# ckpt_step DIR: sets step to the step of DIR's checkpoint as `tally eval` reports it (empty if
# eval fails).
ckpt_step() {
  local saved_rc=$rc saved_last=$last
  step=""
  t eval-check eval "$1" --knn --set data.limit=256 --set data.test_limit=100
  if expect_rc 0 "tally eval of the checkpoint (does not load)"; then
    step=$(cat "$TMP/eval-check.out" "$TMP/eval-check.err" | grep -o 'step [0-9]*)' | head -1 |
      grep -o '[0-9]*')
    [[ -n $step ]] || bad "tally eval did not name the checkpoint's step"
  fi
  rc=$saved_rc
  last=$saved_last
}

# ledger_steps DIR: the "step" fields of DIR/ledger.jsonl, space-separated.
ledger_steps() {
  grep -o '"step":[0-9]*' "$1/ledger.jsonl" 2>/dev/null | cut -d: -f2 | tr '\n' ' ' | sed 's/ $//'
}

# ledger_is DIR N: ledger.jsonl holds steps 0..N-1, each once, in order.
ledger_is() {
  local want got
  want=$(seq 0 $(($2 - 1)) | tr '\n' ' ' | sed 's/ $//')
  got=$(ledger_steps "$1")
  [[ $got == "$want" ]] || bad "ledger.jsonl steps are [$got], expected 0..$(($2 - 1))"
}

summary_steps() {
  grep -o '"steps": *[0-9]*' "$1/summary.json" 2>/dev/null | grep -o '[0-9]*$'
}

# start LABEL ARGS...: tally in the background under the timeout; sets tpid (timeout's pid).
start() {
  local label=$1
  shift
  timeout "$LIMIT" "$TALLY_BIN" "$@" >"$TMP/$label.out" 2>"$TMP/$label.err" &
  tpid=$!
  BG_PIDS+=("$tpid")
  last=$TMP/$label
}

# child_of PID: the tally process under timeout PID. Signals go to it, not to timeout: timeout
# passes a signal on to the child and again to its process group, which would be two SIGINTs.
child_of() {
  local c="" _
  for _ in $(seq 1 50); do
    c=$(pgrep -P "$1" 2>/dev/null | head -1)
    [[ -n $c ]] && break
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  printf '%s' "$c"
}

# wait_lines FILE N PID: waits (up to 60 s) until FILE has N lines; 1 if PID ended first.
wait_lines() {
  local _
  for _ in $(seq 1 600); do
    [[ -f $1 && $(grep -c . "$1") -ge $2 ]] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# finish_bg: waits for the background run; sets rc.
finish_bg() {
  { wait "$tpid"; rc=$?; } 2>/dev/null
}

# want N: section N runs (TALLY_FAULTS_SECTIONS="6 20" runs only those; unset, all of them).
want() { [[ -z ${TALLY_FAULTS_SECTIONS:-} || " ${TALLY_FAULTS_SECTIONS//,/ } " == *" $1 "* ]]; }

# TALLY_FAULTS_NO_MOUNT=1 takes the path of a machine where mount is refused.
can_mount=0
mkdir -p "$TMP/probe-mount"
if [[ ${TALLY_FAULTS_NO_MOUNT:-0} != 1 ]] &&
  mount -t tmpfs -o size=64k tmpfs "$TMP/probe-mount" 2>/dev/null; then
  umount "$TMP/probe-mount"
  can_mount=1
fi

# mount_tmpfs DIR OPTIONS
mount_tmpfs() {
  mkdir -p "$1" && mount -t tmpfs -o "$2" tmpfs "$1" && MOUNTS+=("$1")
}

# mpi LABEL NP ARGS...: tally under mpirun, one thread per rank; sets rc.
mpi() {
  local label=$1 np=$2
  shift 2
  timeout "$LIMIT" "${MPIRUN_CMD[@]}" --allow-run-as-root --oversubscribe -np "$np" -x OMP_NUM_THREADS=1 \
    "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"
  rc=$?
  last=$TMP/$label
}

# st_edit FILE MODE: rewrites a safetensors file with valid checksums for what MODE changes:
#   nan      the first float of the first params.* tensor becomes NaN (its data CRC redone)
#   lr       the stored configuration's optim.lr is edited (checksums left as they were)
#   swap     two tensors of one shape trade names (checksums left as they were)
#   nometa   the metadata checksum is dropped
st_edit() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys, zlib
path, mode = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
meta = header.pop("__metadata__")
if mode == "nan":
    name = next(k for k in header if k.startswith("params.") and header[k]["dtype"] == "F32")
    begin = header[name]["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<f", float("nan"))
    meta["crc32"] = "%08x" % zlib.crc32(bytes(data))
elif mode == "lr":
    meta["config"] = meta["config"].replace("\nlr = ", "\nlr = 9", 1)
elif mode == "swap":
    a = next(k for k in header if k.endswith(".gamma"))
    b = a[: -len("gamma")] + "beta"
    header = {(b if k == a else a if k == b else k): v for k, v in header.items()}
elif mode == "nometa":
    del meta["crc32_metadata"]
text = json.dumps(dict([("__metadata__", meta)] + list(header.items())), separators=(",", ":"))
text += " " * ((8 - (len(text) + 8) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text.encode() + bytes(data))
PY
}

# png_classes ROOT [SPARE]: 8x8 gray PNGs, 8 in each of ROOT/a and ROOT/b (distinct patterns); with
# SPARE, one more of the same size, SPARE/other.png, that is none of them.
png_classes() {
  mkdir -p "$1/a" "$1/b" ${2:+"$2"}
  python3 - "$1" "${2:-}" <<'PY'
import struct, sys, zlib
def png(path, value):
    raw = b"".join(b"\0" + bytes([(value + 7 * x + 13 * y) % 256 for x in range(8)]) for y in range(8))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
for c in "ab":
    for i in range(8):
        png(f"{sys.argv[1]}/{c}/{i}.png", ord(c) * 10 + i)
if sys.argv[2]:
    png(f"{sys.argv[2]}/other.png", 77)
PY
}

# ---------------------------------------------------------------------------------------------
if want 1; then
# 1. Full disk.
name="1a full disk: 64 KiB for --out"
run=$TMP/disk64/run
if ((can_mount)); then
  mount_tmpfs "$TMP/disk64" size=64k
  t disk64 train "${SMALL[@]}" --steps 4 --out "$run"
else
  # No mount here: RLIMIT_FSIZE of 64 KiB, SIGXFSZ ignored so that writes fail with EFBIG.
  mkdir -p "$TMP/disk64"
  (
    trap '' XFSZ
    ulimit -f 64
    exec timeout "$LIMIT" "$TALLY_BIN" train "${SMALL[@]}" --steps 4 --out "$run"
  ) >"$TMP/disk64.out" 2>"$TMP/disk64.err"
  rc=$?
  last=$TMP/disk64
  name+=" (ulimit -f: mount failed)"
fi
expect_rc 1 "train"
one_line_error "$last.err" "$run/" "the error names no file in the run folder"
no_summary "$run"
[[ -d $run ]] && no_stray "$run"
finish "$name"

name="1b full disk: 4 MiB for --out, a checkpoint every step (room for one)"
run=$TMP/disk4m/run
if ((can_mount)); then
  mount_tmpfs "$TMP/disk4m" size=4m
  t disk4m train "${SMALL[@]}" --steps 6 --set train.checkpoint_every=1 --out "$run"
  expect_rc 1 "train"
  one_line_error "$last.err" "$run/" "the error names no file in the run folder"
  no_summary "$run"
  no_stray "$run"
  loads "$run"
  ckpt_step "$run"
  [[ -z $step ]] || ((step >= 1 && step < 6)) || bad "the checkpoint kept is of step $step"
  finish "$name"
else
  skip "$name: tmpfs cannot be mounted here (RLIMIT_FSIZE cannot fill a disk part way)"
fi

fi

# ---------------------------------------------------------------------------------------------
if want 2; then
# 2. Unwritable folder. Root ignores permission bits: a read-only tmpfs, and uid 65534.
if ((can_mount)); then
  mount_tmpfs "$TMP/ro" ro,size=64k

  name="2a unwritable: --out inside a read-only filesystem"
  t ro-new train "${SMALL[@]}" --steps 2 --out "$TMP/ro/run"
  expect_rc 1 "train"
  one_line_error "$last.err" "$TMP/ro/run.*(read-only|permission|cannot)" "no clear message"
  [[ ! -e $TMP/ro/run ]] || bad "$TMP/ro/run exists"
  finish "$name"

  name="2b unwritable: --out is a read-only filesystem's root"
  t ro-root train "${SMALL[@]}" --steps 2 --out "$TMP/ro"
  expect_rc 1 "train"
  one_line_error "$last.err" "$TMP/ro.*(read-only|permission|cannot)" "no clear message"
  finish "$name"
else
  skip "2a/2b unwritable on a read-only filesystem: tmpfs cannot be mounted here"
fi

name="2c unwritable: chmod 555 parent, run as uid 65534"
if command -v setpriv >/dev/null && [[ $(id -u) == 0 ]]; then
  chmod 755 "$TMP"
  mkdir -p "$TMP/r555"
  chmod 555 "$TMP/r555"
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    timeout "$LIMIT" "$TALLY_BIN" train "${SMALL[@]}" --steps 2 --out "$TMP/r555/run" \
    >"$TMP/r555.out" 2>"$TMP/r555.err"
  rc=$?
  last=$TMP/r555
  expect_rc 1 "train"
  one_line_error "$last.err" "$TMP/r555/run.*(permission|cannot)" "no clear message"
  [[ ! -e $TMP/r555/run ]] || bad "$TMP/r555/run exists"
  finish "$name"
  chmod 700 "$TMP"
else
  skip "$name: needs root and setpriv"
fi

fi

# ---------------------------------------------------------------------------------------------
if want 3; then
# 3. Two runs on one folder.
name="3a two runs on one --out at once: one trains, one is refused"
run=$TMP/shared
start shared-a train "${SMALL[@]}" --steps 6 --out "$run"
pid_a=$tpid
start shared-b train "${SMALL[@]}" --steps 5 --out "$run"
pid_b=$tpid
{ wait "$pid_a"; rc_a=$?; } 2>/dev/null
{ wait "$pid_b"; rc_b=$?; } 2>/dev/null
if [[ $rc_a == 124 || $rc_b == 124 ]]; then
  bad "hang (exits $rc_a and $rc_b)"
elif [[ $rc_a == 0 && $rc_b == 1 ]]; then
  winner=6
  loser=$TMP/shared-b
elif [[ $rc_a == 1 && $rc_b == 0 ]]; then
  winner=5
  loser=$TMP/shared-a
else
  bad "exits $rc_a (6 steps) and $rc_b (5 steps), expected one 0 and one 1"
  winner=""
fi
if [[ -n ${winner:-} ]]; then
  one_line_error "$loser.err" "another run is using this folder" "the refused run"
  has_summary "$run"
  [[ $(summary_steps "$run") == "$winner" ]] ||
    bad "summary.json says $(summary_steps "$run") steps, the run that trained had $winner"
  ledger_is "$run" "$winner"
  grep -q "^steps = $winner\$" "$run/config.ini" || bad "config.ini is not the trained run's"
  loads "$run"
fi
no_stray "$run"
finish "$name"

name="3b a run on a finished run's folder without --overwrite is refused"
cp "$run/summary.json" "$TMP/summary-before.json" 2>/dev/null
cp "$run/checkpoint.safetensors" "$TMP/ckpt-before.safetensors" 2>/dev/null
t reuse train "${SMALL[@]}" --steps 3 --out "$run"
expect_rc 1 "train"
one_line_error "$last.err" "holds a run already" "the refusal"
cmp -s "$run/summary.json" "$TMP/summary-before.json" || bad "summary.json changed"
cmp -s "$run/checkpoint.safetensors" "$TMP/ckpt-before.safetensors" || bad "checkpoint changed"
finish "$name"

name="3c the same with --overwrite replaces the run"
t overwrite train "${SMALL[@]}" --steps 3 --out "$run" --overwrite
expect_rc 0 "train --overwrite"
has_summary "$run"
[[ $(summary_steps "$run") == 3 ]] || bad "summary.json says $(summary_steps "$run") steps, not 3"
ledger_is "$run" 3
no_stray "$run"
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 4; then
# 4. SIGINT / SIGTERM during training, then --resume.
signal_case() {  # signal_case SIG CODE
  local sig=$1 code=$2 run=$TMP/sig-$1 child at
  start "sig-$sig" train "${SMALL512[@]}" --steps 8 --out "$run"
  if ! wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
    finish_bg
    bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
    return
  fi
  child=$(child_of "$tpid")
  [[ -n $child ]] || { bad "no tally process under timeout"; finish_bg; return; }
  kill -"$sig" "$child"
  finish_bg
  expect_rc "$code" "train stopped by SIG$sig"
  said "$last.out" "interrupted at step" "the stop message"
  at=$(cat "$last.out" "$last.err" | grep -o 'interrupted at step [0-9]*' | head -1 | grep -o '[0-9]*$')
  no_summary "$run"
  no_stray "$run"
  loads "$run"
  if [[ -n $at ]]; then
    [[ $(ledger_steps "$run" | wc -w) == "$at" ]] ||
      bad "stopped at step $at but ledger.jsonl holds [$(ledger_steps "$run")]"
  fi
  t "sig-$sig-report" report "$run"
  expect_rc 0 "tally report of the interrupted run"
  t "sig-$sig-resume" train --resume "$run" --no-knn --quiet
  expect_rc 0 "train --resume"
  has_summary "$run"
  [[ $(summary_steps "$run") == 8 ]] || bad "summary.json says $(summary_steps "$run") steps, not 8"
  ledger_is "$run" 8
}

name="4a SIGINT during training, then --resume"
signal_case INT 130
finish "$name"

name="4b SIGTERM during training, then --resume"
signal_case TERM 143
finish "$name"

name="4c a second SIGINT half a second after the first stops at once"
run=$TMP/sig-twice
# Steps of a second or more (batches of 512) so that finishing one would be seen.
start sig-twice train --set data.limit=1024 --set train.batch_size=512 --no-knn --quiet \
  --steps 8 --out "$run"
if wait_lines "$run/ledger.jsonl" 1 "$tpid"; then
  child=$(child_of "$tpid")
  kill -INT "$child"
  sleep 0.5
  kill -INT "$child" 2>/dev/null || bad "the run ended within 0.5 s of the first SIGINT"
  t0=$(date +%s%N)
  finish_bg
  ms=$((($(date +%s%N) - t0) / 1000000))
  expect_nonzero "train after two SIGINTs"
  ((ms <= 1000)) || bad "exited ${ms} ms after the second SIGINT (a step takes about a second)"
  no_summary "$run"
  [[ ! -e $run/checkpoint.safetensors ]] || loads "$run"
else
  finish_bg
  bad "the run ended (exit $rc) before a step was logged: $(firstline "$last.err")"
fi
finish "$name"

name="4d one SIGINT delivered twice at once (as timeout --foreground passes it on): a checkpoint"
run=$TMP/sig-dup
start sig-dup train "${SMALL512[@]}" --steps 8 --out "$run"
if wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
  child=$(child_of "$tpid")
  kill -INT "$child"
  kill -INT "$child"
  finish_bg
  expect_rc 130 "train after one SIGINT delivered twice"
  said "$last.out" "interrupted at step" "the stop message"
  loads "$run"
else
  finish_bg
  bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
fi
finish "$name"

name="4e SIGHUP (a closed terminal) during training, then --resume"
signal_case HUP 129
finish "$name"

name="4e2 SIGHUP under nohup: ignored, as nohup asks; the run trains on to its summary"
run=$TMP/sig-nohup
# (nohup after timeout: timeout handles SIGHUP itself, which would undo nohup for its child)
timeout "$LIMIT" nohup "$TALLY_BIN" train "${SMALL512[@]}" --steps 8 --out "$run" \
  >"$TMP/sig-nohup.out" 2>"$TMP/sig-nohup.err" &
tpid=$!
BG_PIDS+=("$tpid")
last=$TMP/sig-nohup
if wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
  kill -HUP "$(child_of "$tpid")"
  finish_bg
  expect_rc 0 "train under nohup after SIGHUP"
  has_summary "$run"
else
  finish_bg
  bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
fi
finish "$name"

name="4f stdout a pipe closed early (tally train | head -1): the run trains on to its summary"
run=$TMP/sig-pipe
{ timeout "$LIMIT" "$TALLY_BIN" train --set data.limit=256 --set train.batch_size=32 --no-knn \
  --set train.log_every=1 --steps 6 --out "$run" 2>"$TMP/sig-pipe.err" | head -1 >/dev/null; } \
  2>/dev/null
rc=${PIPESTATUS[0]}
last=$TMP/sig-pipe
expect_rc 0 "train | head -1"
has_summary "$run"
finish "$name"

name="4g SIGINT during the final kNN evaluation: exit 130, no summary; --resume evaluates"
run=$TMP/sig-eval
start sig-eval train --set data.limit=256 --set train.batch_size=32 --steps 2 --out "$run"
if wait_lines "$TMP/sig-eval.out" 0 "$tpid" && for _ in $(seq 1 600); do
  grep -q "encoding .* training and" "$TMP/sig-eval.out" && break
  kill -0 "$tpid" 2>/dev/null || break
  sleep 0.1
done && grep -q "encoding .* training and" "$TMP/sig-eval.out"; then
  kill -INT "$(child_of "$tpid")"
  finish_bg
  expect_rc 130 "train interrupted during its evaluation"
  no_summary "$run"
  t sig-eval-resume train --resume "$run" --quiet
  expect_rc 0 "train --resume"
  [[ $(summary_steps "$run") == 2 ]] || bad "summary.json says $(summary_steps "$run") steps, not 2"
  grep -q '"knn_top1": 0\.' "$run/summary.json" || bad "summary.json has no kNN result"
else
  finish_bg
  bad "the run ended (exit $rc) before its final evaluation began: $(firstline "$last.err")"
fi
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 5; then
# 5. kill -9, then --resume.
name="5a kill -9 during training, then --resume"
run=$TMP/kill9
start kill9 train "${SMALL512[@]}" --steps 8 --set train.checkpoint_every=2 --out "$run"
if wait_lines "$run/ledger.jsonl" 3 "$tpid"; then
  child=$(child_of "$tpid")
  kill -KILL "$child"
  finish_bg
  [[ $rc == 137 ]] || bad "train exited $rc before the kill -9 took it"
  no_summary "$run"
  loads "$run"
  t kill9-resume train --resume "$run" --no-knn --quiet
  expect_rc 0 "train --resume"
  has_summary "$run"
  [[ $(summary_steps "$run") == 8 ]] || bad "summary.json says $(summary_steps "$run") steps, not 8"
  ledger_is "$run" 8
else
  finish_bg
  bad "the run ended (exit $rc) before 3 steps were logged: $(firstline "$last.err")"
fi
finish "$name"

name="5b kill -9 half way through a checkpoint write, then --resume"
run=$TMP/kill-in-ckpt
TALLY_INJECT_KILL_IN_CHECKPOINT=4 t kill-in-ckpt train "${SMALL512[@]}" --steps 6 \
  --set train.checkpoint_every=2 --out "$run"
[[ $rc == 124 ]] && bad "hang"
[[ $rc == 137 ]] || bad "train exited $rc, expected 137 (killed in the write)"
no_summary "$run"
loads "$run"
ckpt_step "$run"
[[ -z $step || $step == 2 ]] || bad "the checkpoint left is of step $step, expected 2"
ls "$run"/checkpoint.safetensors.tmp.* >/dev/null 2>&1 ||
  bad "the killed write left no temporary file (the case tests nothing)"
t kill-in-ckpt-resume train --resume "$run" --no-knn --quiet
expect_rc 0 "train --resume"
has_summary "$run"
ledger_is "$run" 6
no_stray "$run"  # the killed write's temporary file is gone
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
# 6. MPI.
if want 6; then
if command -v "$MPIRUN" >/dev/null 2>&1; then
  name="6a mpi: rank 0 cannot create its folder"
  mpi mpi-nofolder 2 "$TALLY_BIN" train --set parallel.backend=mpi "${SMALL[@]}" --steps 2 \
    --out /etc/hostname/run
  expect_nonzero "mpirun"
  said "$last.err" "/etc/hostname/run" "no message naming the folder"
  finish "$name"

  name="6b mpi: rank 1 killed at step 2"
  run=$TMP/mpi-killed
  mpi mpi-killed 2 -x TALLY_INJECT_FAIL=1:2 "$TALLY_BIN" train --set parallel.backend=mpi \
    "${SMALL[@]}" --steps 4 --out "$run"
  expect_nonzero "mpirun"
  # The fault must hit a run under way: steps 0 and 1 are done (and logged by rank 0) first.
  [[ $(ledger_steps "$run" | wc -w) -ge 1 ]] ||
    bad "no step was logged before the kill (stderr: $(firstline "$last.err"))"
  no_summary "$run"
  [[ ! -d $run ]] || no_stray "$run"
  finish "$name"

  name="6c mpi: more ranks than the global batch"
  mpi mpi-shard0 2 "$TALLY_BIN" train --set parallel.backend=mpi --set data.limit=256 \
    --set train.batch_size=1 --steps 2 --no-knn --quiet --out "$TMP/mpi-shard0"
  expect_nonzero "mpirun"
  said "$last.err" "shard" "no message about the shard"
  no_summary "$TMP/mpi-shard0"
  finish "$name"

  name="6d mpi: moco with a shard of one sample"
  mpi mpi-moco1 2 "$TALLY_BIN" train --set parallel.backend=mpi --objective=moco \
    --set data.limit=256 --set train.batch_size=3 --steps 2 --no-knn --quiet \
    --out "$TMP/mpi-moco1"
  expect_rc 1 "mpirun"
  said "$last.err" "batchnorm" "no BatchNorm message"
  no_summary "$TMP/mpi-moco1"
  finish "$name"

  # Ranks of one job that disagree: each case ends within seconds, every rank stopped, with a
  # line naming the key and both values (MPMD: rank 0 as given, rank 1 with one difference).
  MPI_BASE=(train --set parallel.backend=mpi --set data.limit=256 --set train.batch_size=32
    --no-knn --quiet)
  disagree() {  # disagree LABEL REGEX RANK0_ARGS -- RANK1_ARGS
    local label=$1 regex=$2 a=() b=() t0 ms
    shift 2
    while [[ $1 != -- ]]; do a+=("$1"); shift; done
    shift
    b=("$@")
    # Each rank reads its own arguments (NUL-separated) rather than an MPMD command line
    # (-np 1 A : -np 1 B), on which Open MPI 5.0.7's mpirun (Debian 13) crashes.
    printf '%s\0' "${a[@]}" >"$TMP/$label.args0"
    printf '%s\0' "${b[@]}" >"$TMP/$label.args1"
    t0=$(date +%s%N)
    # shellcheck disable=SC2016  # expanded by each rank's bash
    timeout "$LIMIT" "${MPIRUN_CMD[@]}" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 2 \
      bash -c 'mapfile -d "" args <"$0.args$OMPI_COMM_WORLD_RANK" && exec "$1" "${args[@]}"' \
      "$TMP/$label" "$TALLY_BIN" >"$TMP/$label.out" 2>"$TMP/$label.err"
    rc=$?
    last=$TMP/$label
    ms=$((($(date +%s%N) - t0) / 1000000))
    expect_nonzero "mpirun"
    said "$last.err" "$regex" "no line naming the difference"
    ((ms < 30000)) || bad "took ${ms} ms to stop"
  }
  for c in "batch:train.batch_size: 32 on rank 0, 16 on rank 1:--set train.batch_size=16" \
    "objective:objective: inbatch on rank 0, moco on rank 1:--objective=moco" \
    "steps:steps: 3 on rank 0, 5 on rank 1:--steps 5" \
    "limit:data.limit: 256 on rank 0, 288 on rank 1:--set data.limit=288" \
    "lr:optim.lr: .* on rank 0, 0.5 on rank 1:--set optim.lr=0.5" \
    "seed:train.seed: 0 on rank 0, 7 on rank 1:--set train.seed=7"; do
    IFS=: read -r label regex1 regex2 extra <<<"$c"
    name="6f mpi: ranks that disagree on $label stop at once, naming it"
    # shellcheck disable=SC2086  # extra is a list of options
    disagree "mpi-disagree-$label" "$regex1:$regex2" "${MPI_BASE[@]}" --steps 3 \
      --out "$TMP/mpi-dis-$label" -- "${MPI_BASE[@]}" --steps 3 $extra --out "$TMP/mpi-dis-$label-1"
    finish "$name"
  done

  name="6g mpi: one rank resumes an older copy of the run folder"
  run=$TMP/mpi-stale
  mpi mpi-stale-setup 2 "$TALLY_BIN" "${MPI_BASE[@]}" --steps 6 --stop-at 2 --out "$run"
  cp -a "$run" "$run-old"
  mpi mpi-stale-more 2 "$TALLY_BIN" train --resume "$run" --stop-at 4 --no-knn --quiet
  disagree mpi-stale "start_step: 4 on rank 0, 2 on rank 1" train --resume "$run" --no-knn \
    --quiet -- train --resume "$run-old" --no-knn --quiet
  finish "$name"

  name="6h mpi: a peer stopped (SIGSTOP) mid-run: the job ends after parallel.timeout"
  run=$TMP/mpi-sigstop
  timeout "$LIMIT" "${MPIRUN_CMD[@]}" --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
    "$TALLY_BIN" "${MPI_BASE[@]}" --set data.limit=512 --steps 400 --set parallel.timeout=5 \
    --out "$run" >"$TMP/mpi-sigstop.out" 2>"$TMP/mpi-sigstop.err" &
  tpid=$!
  BG_PIDS+=("$tpid")
  last=$TMP/mpi-sigstop
  if wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
    # This run's own processes (its unique --out): another suite's run of the same case on this
    # machine (a sanitizer run, a Debian root) must not be the one stopped.
    peer=$(pgrep -f -- "train .*--out $run( |\$)" | tail -1)
    kill -STOP "$peer"
    t0=$(date +%s%N)
    finish_bg
    ms=$((($(date +%s%N) - t0) / 1000000))
    kill -KILL "$peer" 2>/dev/null
    expect_nonzero "mpirun"
    said "$last.err" "no answer from the other ranks for [0-9]+ s" "no watchdog message"
    ((ms < 40000)) || bad "took ${ms} ms after the stop"
  else
    finish_bg
    bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
  fi
  finish "$name"
else
  skip "6a-6h mpi: $MPIRUN is missing"
fi

name="6e local replicas: moco with a shard of one sample"
t local-moco1 train --set parallel.replicas=2 --objective=moco --set data.limit=256 \
  --set train.batch_size=3 --steps 2 --no-knn --quiet --out "$TMP/local-moco1"
expect_rc 1 "train"
said "$last.err" "batchnorm" "no BatchNorm message"
no_summary "$TMP/local-moco1"
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 7; then
# 7. The loss becomes NaN (ledger steps count from 0: step 2 is the third; 2 steps are done).
name="7 the loss becomes NaN at step 2"
run=$TMP/nan
TALLY_INJECT_NAN_AT_STEP=2 t nan train "${SMALL[@]}" --steps 4 --set train.checkpoint_every=1 \
  --out "$run"
expect_rc 3 "train"
said "$last.err" "step 2\b" "no message naming step 2"
no_summary "$run"
no_stray "$run"
loads "$run"
ckpt_step "$run"
[[ -z $step || $step == 2 ]] || bad "the checkpoint kept is of step $step, expected 2 (before the NaN)"
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 8; then
# 8. Corrupt and truncated checkpoints: --resume refuses them with one line, and leaves them.
run=$TMP/damaged
t damaged train "${SMALL[@]}" --steps 4 --stop-at 2 --out "$run"
if [[ $rc == 0 && -s $run/checkpoint.safetensors ]]; then
  cp "$run/checkpoint.safetensors" "$TMP/good.safetensors"
  size=$(stat -c %s "$TMP/good.safetensors")

  name="8a corrupt checkpoint (bytes flipped near the end)"
  printf '\xde\xad\xbe\xef' | dd of="$run/checkpoint.safetensors" bs=1 seek=$((size - 100)) \
    conv=notrunc status=none
  cp "$run/checkpoint.safetensors" "$TMP/corrupt.safetensors"
  t corrupt train --resume "$run" --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "corrupt" "the refusal"
  no_summary "$run"
  cmp -s "$run/checkpoint.safetensors" "$TMP/corrupt.safetensors" ||
    bad "the refused checkpoint was changed or removed"
  finish "$name"

  name="8b truncated checkpoint"
  cp "$TMP/good.safetensors" "$run/checkpoint.safetensors"
  truncate -s $((size / 2)) "$run/checkpoint.safetensors"
  cp "$run/checkpoint.safetensors" "$TMP/truncated.safetensors"
  t truncated train --resume "$run" --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "truncated" "the refusal"
  no_summary "$run"
  cmp -s "$run/checkpoint.safetensors" "$TMP/truncated.safetensors" ||
    bad "the refused checkpoint was changed or removed"
  finish "$name"
else
  why="setup: train --stop-at 2 exited $rc: $(firstline "$last.err")"
  finish "8a corrupt checkpoint (bytes flipped near the end)"
  why="setup failed (see 8a)"
  finish "8b truncated checkpoint"
fi

fi

# ---------------------------------------------------------------------------------------------
if want 9; then
# 9. Step counts. 1000000 epochs of the full training set (60000 images) in batches of 16 are
# 3.75e9 steps, more than an int holds: train must refuse (exit 1) rather than wrap to 0 steps,
# and plan must agree (refuse too, or give the count train would run).
name="9a 1000000 epochs of 3750 steps (past INT_MAX): train refuses, plan agrees"
OVER=(--epochs 1000000 --set train.batch_size=16)
t over train "${OVER[@]}" --no-knn --quiet --out "$TMP/over"
expect_rc 1 "train"
said "$last.err" "steps" "no message about the step count"
no_summary "$TMP/over"
t over-plan plan "${OVER[@]}" --json
if [[ $rc == 0 ]]; then
  count=$(grep -o '"total_steps":-*[0-9]*' "$TMP/over-plan.out" | head -1 | cut -d: -f2)
  bad "train refuses but plan exits 0 with total_steps ${count:-?} (plan must refuse as train does)"
elif [[ $rc == 124 ]]; then
  bad "plan: hang"
fi
finish "$name"

# The brief's own options: 256 images in batches of 16 are 16 steps per epoch, 16000000 steps in
# all (fits an int): train must count them (not 0) and plan must give the same count. --stop-at 1
# keeps the run to one step.
name="9b 1000000 epochs of 16 steps: train counts them (not 0), plan gives the same count"
MANY=(--epochs 1000000 --set train.batch_size=16 --set data.limit=256)
t many train "${MANY[@]}" --no-knn --quiet --stop-at 1 --out "$TMP/many"
train_count=""
if [[ $rc == 1 ]]; then
  said "$last.err" "steps" "no message about the step count"
else
  expect_rc 0 "train --stop-at 1"
  train_count=$(cat "$last.out" "$last.err" | grep -o '[0-9]* steps (' | head -1 | cut -d' ' -f1)
  [[ ${train_count:-0} -gt 0 ]] || bad "train announces ${train_count:-no} step count"
fi
t many-plan plan "${MANY[@]}" --json
plan_count=$(grep -o '"total_steps":-*[0-9]*' "$TMP/many-plan.out" | head -1 | cut -d: -f2)
if [[ -z $train_count ]]; then
  [[ $rc != 0 ]] || bad "train refuses but plan gives total_steps $plan_count"
else
  expect_rc 0 "plan"
  [[ $plan_count == "$train_count" ]] ||
    bad "train counts $train_count steps, plan $plan_count"
fi
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 11; then
# 11. Files in a run folder are read as files, and outputs never replace a device or a run's state.
TRAIN_IDX=$(sed -n 's/^train = //p' "$(dirname "$0")/../data/fashion-mnist.ini")
run=$TMP/files
t files train "${SMALL[@]}" --steps 3 --out "$run"
if [[ $rc == 0 && -s $run/checkpoint.safetensors ]]; then
  cp -a "$run" "$TMP/files-good"
  # restore: the run folder as it was after training
  restore() { rm -rf "$run" && cp -a "$TMP/files-good" "$run"; }

  name="11a --resume with ledger.jsonl a link to an endless device"
  ln -sf /dev/zero "$run/ledger.jsonl"
  t files-zero train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  # (a run's own file is never followed as a link: refused as one, before its target is looked at)
  one_line_error "$last.err" "ledger.jsonl.*symbolic link" "the refusal"
  [[ -L $run/ledger.jsonl ]] || bad "the link was replaced"
  finish "$name"

  name="11b --resume with eval.jsonl a FIFO (no hang, the folder's lock released)"
  restore
  mkfifo "$run/eval.jsonl"
  t files-fifo train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  said "$last.err" "eval.jsonl.*not a regular file" "the refusal"
  [[ -p $run/eval.jsonl ]] || bad "the FIFO was replaced"
  finish "$name"

  name="11c plan --from a run whose ledger.jsonl is a FIFO"
  restore
  rm "$run/ledger.jsonl" && mkfifo "$run/ledger.jsonl"
  t files-plan plan --from "$run" --nodes 2 --link 1Gbit
  expect_rc 1 "plan --from"
  said "$last.err" "not a regular file" "the refusal"
  finish "$name"

  name="11d export and embed --out a FIFO or a device node: refused, the node left as it is"
  restore
  mkfifo "$TMP/out.fifo"
  t files-exp-fifo export "$run" --out "$TMP/out.fifo"
  expect_rc 1 "export --out FIFO"
  said "$last.err" "not a regular file" "the refusal"
  [[ -p $TMP/out.fifo ]] || bad "the FIFO was replaced"
  t files-emb-fifo embed "$run" --data "$TRAIN_IDX" --limit 10 --out "$TMP/out.fifo"
  expect_rc 1 "embed --out FIFO"
  [[ -p $TMP/out.fifo ]] || bad "embed replaced the FIFO"
  if mknod "$TMP/null" c 1 3 2>/dev/null; then
    t files-exp-dev export "$run" --out "$TMP/null"
    expect_rc 1 "export --out a device node"
    [[ -c $TMP/null ]] || bad "the device node was replaced"
  else
    echo "# (mknod refused: the device-node target is checked through the FIFO only)"
  fi
  finish "$name"

  name="11e export/embed/report --out the run's own state files: refused, the files unchanged"
  for target in checkpoint.safetensors ledger.jsonl summary.json config.ini; do
    cp "$run/$target" "$TMP/before"
    t files-own-exp export "$run" --out "$run/$target"
    expect_rc 1 "export --out RUN/$target"
    said "$last.err" "run's own" "the refusal"
    t files-own-emb embed "$run" --data "$TRAIN_IDX" --limit 10 --out "$run/$target"
    expect_rc 1 "embed --out RUN/$target"
    t files-own-rep report "$run" --out "$run/$target"
    expect_rc 1 "report --out RUN/$target"
    cmp -s "$run/$target" "$TMP/before" || bad "$target was changed"
  done
  finish "$name"

  name="11f a checkpoint from another run copied into the folder: --resume refuses, nothing changes"
  t files-other train "${SMALL[@]}" --steps 3 --set train.seed=7 --out "$TMP/files-other"
  cp "$TMP/files-other/checkpoint.safetensors" "$run/checkpoint.safetensors"
  cp "$run/ledger.jsonl" "$TMP/ledger-before"
  t files-mixed train --resume "$run" --steps 5 --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "ledger.jsonl.*not the ledger of this checkpoint" "the refusal"
  cmp -s "$run/ledger.jsonl" "$TMP/ledger-before" || bad "ledger.jsonl was changed"
  finish "$name"
else
  why="setup: train exited $rc: $(firstline "$last.err")"
  finish "11 run-folder files"
fi

fi

# ---------------------------------------------------------------------------------------------
if want 12; then
# 12. Budgets: each fixes a length of at least one step Tally can count, or is refused before
# anything is written. A step of SMALL is about 1.4e10 FLOP.
PLAN_SMALL=(--set data.limit=256 --set train.batch_size=32 --no-knn)
for budget in 1GFLOP 1e30FLOP 1e20s; do
  name="12 --budget $budget: refused by train and by plan, no run folder"
  t budget-$budget train "${SMALL[@]}" --budget "$budget" --out "$TMP/budget-$budget"
  expect_rc 1 "train --budget $budget"
  one_line_error "$last.err" "budget" "the refusal"
  [[ ! -e $TMP/budget-$budget ]] || bad "a run folder was created"
  t budget-plan-$budget plan "${PLAN_SMALL[@]}" --budget "$budget" --json
  expect_rc 1 "plan --budget $budget"
  finish "$name"
done

name="12d --budget 4.5e10FLOP: plan counts the steps train takes (3)"
t budget-plan plan "${PLAN_SMALL[@]}" --budget 4.5e10FLOP --json
expect_rc 0 "plan"
planned=$(grep -o '"total_steps":[0-9]*' "$last.out" | cut -d: -f2)
t budget-train train "${SMALL[@]}" --budget 4.5e10FLOP --out "$TMP/budget-run"
expect_rc 0 "train"
[[ $(summary_steps "$TMP/budget-run") == 3 && $planned == 3 ]] ||
  bad "plan counts ${planned:-no} steps, train took $(summary_steps "$TMP/budget-run"), expected 3"
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 13; then
# 13. A finished run's record stays; a run whose end was cut short gets its summary.
run=$TMP/budget-run
name="13a --resume of a finished run: exit 0, nothing changed"
if [[ -s $run/summary.json ]]; then
  cp "$run/summary.json" "$TMP/summary-before"
  t finished train --resume "$run" --no-knn --quiet
  expect_rc 0 "train --resume"
  said "$last.out" "finished already" "no word that the run is finished"
  cmp -s "$run/summary.json" "$TMP/summary-before" || bad "summary.json was rewritten"
  name2="13b --resume of a run at its last step without summary.json: the run's own figures"
  rm "$run/summary.json"
  t unfinished train --resume "$run" --no-knn --quiet
  expect_rc 0 "train --resume"
  [[ $(summary_steps "$run") == 3 ]] || bad "summary.json says $(summary_steps "$run") steps, not 3"
  grep -q '"train_seconds": 0.000' "$run/summary.json" && bad "summary.json says 0 s of training"
  finish "$name"
  name=$name2
else
  why="setup failed (see 12d)"
fi
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
if want 14; then
# 14. Degenerate and installed use.
name="14a inbatch at a global batch of 1 (no negatives, a loss of 0): refused, by plan too"
t deg-inbatch train --set data.limit=64 --set train.batch_size=1 --steps 2 --no-knn --quiet \
  --out "$TMP/deg-inbatch"
expect_rc 1 "train"
said "$last.err" "at least 2" "no word of the smallest batch"
no_summary "$TMP/deg-inbatch"
t deg-inbatch-plan plan --set data.limit=64 --set train.batch_size=1 --no-knn
expect_rc 1 "plan"
finish "$name"

name="14b installed: export, eval, embed and --resume need no data/ beside the binary or here"
run=$TMP/installed
mkdir -p "$TMP/bin" "$TMP/elsewhere"
cp "$TALLY_BIN" "$TMP/bin/tally"
t installed-train train "${SMALL[@]}" --steps 2 --out "$run"
expect_rc 0 "train"
(
  cd "$TMP/elsewhere" || exit 1
  TALLY_BIN=$TMP/bin/tally
  t installed-export export "$run" --out "$TMP/elsewhere/e.safetensors"
  expect_rc 0 "installed export" || echo "$why" >"$TMP/installed.why"
  t installed-eval eval "$run" --set data.limit=256 --set data.test_limit=100
  expect_rc 0 "installed eval" || echo "$why" >>"$TMP/installed.why"
  t installed-embed embed "$run" --data "$TRAIN_IDX" --limit 10 --out "$TMP/elsewhere/x.npy"
  expect_rc 0 "installed embed" || echo "$why" >>"$TMP/installed.why"
  # Which image each row is: line i names row i's.
  [[ $(wc -l <"$TMP/elsewhere/x.rows.txt") == 10 && $(sed -n 3p "$TMP/elsewhere/x.rows.txt") == \
    "$TRAIN_IDX:2" ]] || echo "x.rows.txt does not list the 10 rows" >>"$TMP/installed.why"
  t installed-resume train --resume "$run" --steps 3 --no-knn --quiet
  expect_rc 0 "installed --resume" || echo "$why" >>"$TMP/installed.why"
)
[[ ! -s $TMP/installed.why ]] || bad "$(tr '\n' ' ' <"$TMP/installed.why")"
finish "$name"

name="14c a ResNet of 64 blocks a stage (inside the documented range): planned, not an internal error"
sed 's/^stage_blocks = .*/stage_blocks = 64,64,64/' "$(dirname "$0")/../models/resnet-small.ini" \
  >"$TMP/deep.ini"
t deep plan --set model.file="$TMP/deep.ini" --set data.limit=256 --set train.batch_size=8 --no-knn
expect_rc 0 "plan of a deep model"
finish "$name"

name="14d a 1.2 GB address-space limit (ulimit -v) and a run that needs about 150 MB: it trains"
if ldd "$TALLY_BIN" 2>/dev/null | grep -q libasan; then
  skip "14d: AddressSanitizer's shadow memory needs more address space than any such limit"
else
  (
    ulimit -v 1200000
    t ulimit train "${SMALL[@]}" --steps 2 --out "$TMP/ulimit"
    echo "$rc" >"$TMP/ulimit.rc"
  )
  rc=$(cat "$TMP/ulimit.rc")
  last=$TMP/ulimit
  expect_rc 0 "train under ulimit -v 1200000"
  finish "$name"
fi

name="14e eval --json of a run folder whose path holds a quote and a backslash: valid JSON"
odd=$TMP/'we"ird\run'
mkdir -p "$odd"
cp "$TMP/installed/checkpoint.safetensors" "$odd/"
t odd-json eval "$odd" --json --set data.limit=256 --set data.test_limit=100
expect_rc 0 "eval --json"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$last.out" 2>/dev/null ||
  bad "not valid JSON: $(firstline "$last.out")"
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
# 10. Poisoned state: non-finite values are refused wherever they are read or produced, and a
# checkpoint's metadata is checked as its tensors are.
if want 10; then
run=$TMP/poison
t poison train "${SMALL[@]}" --steps 3 --out "$run"
if [[ $rc == 0 && -s $run/checkpoint.safetensors ]]; then
  cp "$run/checkpoint.safetensors" "$TMP/poison-good.safetensors"
  cp "$run/summary.json" "$TMP/poison-summary.json"
  name="10a a NaN in one weight (checksums valid): resume, eval, embed, export and --init refuse it"
  st_edit "$run/checkpoint.safetensors" nan
  cp "$run/checkpoint.safetensors" "$TMP/poison-nan.safetensors"
  t poison-resume train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "params\..*NaN" "the refusal"
  t poison-eval eval "$run" --set data.limit=256 --set data.test_limit=100
  expect_rc 1 "eval"
  said "$last.err" "NaN" "eval's refusal"
  t poison-embed embed "$run" --data "$TRAIN_IDX" --limit 10 --out "$TMP/poison.npy"
  expect_rc 1 "embed"
  [[ ! -e $TMP/poison.npy ]] || bad "embed wrote embeddings of a poisoned encoder"
  t poison-export export "$run" --out "$TMP/poison-export.safetensors"
  expect_rc 1 "export"
  [[ ! -e $TMP/poison-export.safetensors ]] || bad "export wrote a poisoned encoder"
  t poison-init train "${SMALL[@]}" --steps 1 --init "$run/checkpoint.safetensors" \
    --out "$TMP/poison-init"
  expect_rc 1 "train --init"
  cmp -s "$run/checkpoint.safetensors" "$TMP/poison-nan.safetensors" ||
    bad "the refused checkpoint was changed"
  cmp -s "$run/summary.json" "$TMP/poison-summary.json" || bad "summary.json was changed"
  finish "$name"

  name="10b an edited learning rate in the stored configuration: refused as edited"
  cp "$TMP/poison-good.safetensors" "$run/checkpoint.safetensors"
  st_edit "$run/checkpoint.safetensors" lr
  t poison-lr train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "metadata checksum" "the refusal"
  finish "$name"

  name="10b2 two tensors' names swapped in the header (both checksums as they were): refused"
  cp "$TMP/poison-good.safetensors" "$run/checkpoint.safetensors"
  st_edit "$run/checkpoint.safetensors" swap
  t poison-swap train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "metadata checksum" "the refusal"
  finish "$name"

  name="10c a checkpoint without its metadata checksum: refused"
  cp "$TMP/poison-good.safetensors" "$run/checkpoint.safetensors"
  st_edit "$run/checkpoint.safetensors" nometa
  t poison-nometa train --resume "$run" --steps 4 --no-knn --quiet
  expect_rc 1 "train --resume"
  one_line_error "$last.err" "crc32_metadata" "the refusal"
  finish "$name"

  name="10d a 10 GB file of zeros where the checkpoint should be: refused at once (exit 1)"
  rm -f "$run/checkpoint.safetensors"
  truncate -s 10G "$run/checkpoint.safetensors"
  t0=$(date +%s%N)
  t poison-big train --resume "$run" --steps 4 --no-knn --quiet
  ms=$((($(date +%s%N) - t0) / 1000000))
  expect_rc 1 "train --resume"
  ((ms < 5000)) || bad "took ${ms} ms (read the whole file?)"
  rm -f "$run/checkpoint.safetensors"
  finish "$name"
else
  why="setup: train exited $rc: $(firstline "$last.err")"
  finish "10 poisoned state"
fi

name="10e a weight becomes NaN in an update (the loss still finite): exit 3, the last good checkpoint"
run=$TMP/nan-param
TALLY_INJECT_NAN_PARAM_AT_STEP=2 t nan-param train "${SMALL[@]}" --steps 4 \
  --set train.checkpoint_every=1 --out "$run"
expect_rc 3 "train"
said "$last.err" "step 2.*non-finite" "no message naming step 2"
no_summary "$run"
ckpt_step "$run"
[[ -z $step || $step == 2 ]] || bad "the checkpoint kept is of step $step, expected 2"
finish "$name"

name="10f resuming over changed training data: refused, naming the data"
png_classes "$TMP/photos"
run=$TMP/photo-run
t photo train --data "$TMP/photos" --set data.image_size=8 --batch-size 4 --steps 2 --no-knn \
  --quiet --out "$run"
expect_rc 0 "train on the folder"
python3 - "$TMP/photos/a/0.png" "$TMP/photos/b/7.png" <<'PY'
import shutil, sys
shutil.copyfile(sys.argv[2], sys.argv[1])  # one image replaced by another's pixels
PY
t photo-resume train --resume "$run" --steps 3 --no-knn --quiet
expect_rc 1 "train --resume over changed data"
one_line_error "$last.err" "other data" "the refusal"
finish "$name"

name="10g a streamed test image that no longer decodes: the kNN monitor stops the run, naming it"
# Its header reads (the folder is listed), its pixels are cut off: the baseline at the start is
# the first to decode it. Exit 1 and one line naming the file, not an abort.
mkdir -p "$TMP/tests"
cp -r "$TMP/photos/a" "$TMP/photos/b" "$TMP/tests/"
python3 - "$TMP/tests/b/3.png" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
open(sys.argv[1], "wb").write(data[:41])  # the signature and IHDR: the header, no pixels
PY
t photo-monitor train --data "$TMP/photos" --set data.test="$TMP/tests" --set data.image_size=8 \
  --batch-size 4 --steps 2 --quiet --out "$TMP/photo-monitor-run"
expect_rc 1 "train with a test image cut short"
one_line_error "$last.err" "kNN monitor: .*tests/b/3.png" "the error"
finish "$name"


fi

# ---------------------------------------------------------------------------------------------
if want 15; then
# 15. The run folder is locked as a folder, and its own files are never followed as links.
name="15a rm R/.lock while a run trains: a --resume of R is still refused, the run ends whole"
run=$TMP/lock-rm
start lock-rm train "${SMALL[@]}" --steps 10 --set train.checkpoint_every=1 --out "$run"
pid_a=$tpid
if wait_lines "$run/ledger.jsonl" 2 "$pid_a" && [[ -s $run/checkpoint.safetensors ]]; then
  rm -f "$run/.lock"
  t lock-rm-resume train --resume "$run" --steps 10 --no-knn --quiet
  expect_rc 1 "train --resume while the first run trains"
  one_line_error "$last.err" "another run is using this folder" "the refusal"
  tpid=$pid_a
  last=$TMP/lock-rm
  finish_bg
  expect_rc 0 "the first run"
  ledger_is "$run" 10
  has_summary "$run"
else
  tpid=$pid_a
  finish_bg
  bad "the run ended (exit $rc) before 2 steps and a checkpoint: $(firstline "$TMP/lock-rm.err")"
fi
finish "$name"

name="15b a dangling symbolic link as R/.lock: refused, nothing created where it points"
run=$TMP/lock-link
mkdir -p "$run"
ln -s "$TMP/lock-link-target" "$run/.lock"
t lock-link train "${SMALL[@]}" --steps 1 --out "$run"
expect_rc 1 "train"
one_line_error "$last.err" "\.lock.*symbolic link" "the refusal"
[[ ! -e $TMP/lock-link-target ]] || bad "the link's target was created outside the folder"
finish "$name"

name="15c a run folder's own file as a symbolic link: tally eval neither reads nor copies it"
run=$TMP/lock-run
t lock-run train "${SMALL[@]}" --steps 2 --out "$run"
if expect_rc 0 "train"; then
  printf '{"step":0,"what":"encoder","secret":1}\n' >"$TMP/outside-eval.jsonl"
  ln -s "$TMP/outside-eval.jsonl" "$run/eval.jsonl"
  t lock-run-eval eval "$run" --knn --no-baseline --set data.limit=256 --set data.test_limit=100
  said "$last.err" "eval.jsonl.*symbolic link" "the refusal to follow eval.jsonl"
  [[ -L $run/eval.jsonl ]] || ! grep -q secret "$run/eval.jsonl" ||
    bad "the link's target was copied into the run folder"
fi
finish "$name"

name="15d the run folder moved away and another put in its place: the run writes nothing there"
run=$TMP/lock-move
start lock-move train "${SMALL[@]}" --steps 10 --set train.checkpoint_every=1 --out "$run"
if wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
  mv "$run" "$TMP/lock-moved"
  mkdir "$run"
  finish_bg
  expect_nonzero "train after its folder was replaced"
  said "$last.err" "no longer the folder" "the error"
  [[ -z $(ls -A "$run") ]] || bad "files were written into the new folder: $(ls -A "$run" | tr '\n' ' ')"
else
  finish_bg
  bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
fi
finish "$name"


fi

# ---------------------------------------------------------------------------------------------
if want 16; then
# 16. Recipe text Tally would not read as written is refused with its file and line.
name="16a a recipe with CR-only line ends, a key on its section's line, a hex number: refused"
printf '; saved on an old Mac\r[optim]\rlr = 0.36\r' >"$TMP/cr-only.ini"
printf '[train] batch_size = 16\n' >"$TMP/section-line.ini"
printf '[optim]\nlr = 0x10\n' >"$TMP/hex.ini"
for recipe in cr-only:1:carriage section-line:1:section hex:2:0x10; do
  IFS=: read -r file line what <<<"$recipe"
  t "ini-$file" train --config "$TMP/$file.ini" "${SMALL[@]}" --steps 1 --out "$TMP/ini-$file"
  expect_rc 1 "train --config $file.ini"
  one_line_error "$last.err" "$file\.ini:$line:.*$what" "the refusal of $file.ini"
  [[ ! -e $TMP/ini-$file ]] || bad "a run folder was made from $file.ini"
done
finish "$name"


fi

# ---------------------------------------------------------------------------------------------
if want 17; then
# 17. A streamed image replaced under a run by another valid image of the same size.
name="17a a streamed image replaced by another of the same size during the run: exit 1, naming it"
png_classes "$TMP/same-size" "$TMP/same-size-spare"
run=$TMP/same-size-run
start same-size train --data "$TMP/same-size" --set data.image_size=8 --batch-size 4 --steps 400 \
  --no-knn --quiet --out "$run"
if wait_lines "$run/ledger.jsonl" 2 "$tpid"; then
  cat "$TMP/same-size-spare/other.png" >"$TMP/same-size/a/3.png"  # the same inode, new bytes
  finish_bg
  expect_rc 1 "train after an image was replaced"
  said "$last.err" "a/3.png: changed during the run" "the error naming the image"
  no_summary "$run"
else
  finish_bg
  bad "the run ended (exit $rc) before 2 steps were logged: $(firstline "$last.err")"
fi
finish "$name"


fi

# ---------------------------------------------------------------------------------------------
if want 18; then
# 18. Results depend on the core count (oneDNN splits its reductions by thread): the count is
# recorded, and a resume on another count says so.
name="18a a run on 1 core resumed on 2: threads_per_replica recorded, a note on the resume"
if command -v taskset >/dev/null && taskset -c 0,1 true 2>/dev/null; then
  run=$TMP/cores
  # (a pinned tally: `t` runs the binary itself)
  taskset -c 0 timeout "$LIMIT" "$TALLY_BIN" train "${SMALL[@]}" --steps 2 --out "$run" \
    >"$TMP/cores.out" 2>"$TMP/cores.err"
  rc=$?
  last=$TMP/cores
  expect_rc 0 "train on core 0"
  grep -q '"threads_per_replica": 1,' "$run/summary.json" || bad "summary.json does not say 1 thread"
  taskset -c 0,1 timeout "$LIMIT" "$TALLY_BIN" train --resume "$run" --steps 3 --quiet \
    >"$TMP/cores-resume.out" 2>"$TMP/cores-resume.err"
  rc=$?
  last=$TMP/cores-resume
  expect_rc 0 "train --resume on cores 0 and 1"
  said "$last.out" "note: the checkpoint was written with 1 thread per replica, this run has 2" \
    "the note"
  grep -q '"threads_per_replica": 2,' "$run/summary.json" || bad "summary.json does not say 2 threads"
  taskset -c 0,1 timeout "$LIMIT" "$TALLY_BIN" train --resume "$run" --steps 4 --quiet \
    >"$TMP/cores-same.out" 2>"$TMP/cores-same.err"
  rc=$?
  last=$TMP/cores-same
  expect_rc 0 "train --resume on the same cores"
  ! grep -q "note: the checkpoint" "$last.out" || bad "a note when the count did not change"
else
  skip "$name: needs taskset and two cores"
fi
finish "$name"


fi

# ---------------------------------------------------------------------------------------------
if want 19; then
# 19. tally eval RUN whose record cannot be written.
name="19a tally eval of a run on a read-only filesystem: exit 1, the record not written said"
if [[ ${TALLY_FAULTS_NO_MOUNT:-0} != 1 ]] && mount_tmpfs "$TMP/eval-ro" size=16m 2>/dev/null; then
  run=$TMP/eval-ro/run
  t eval-ro-train train "${SMALL[@]}" --steps 2 --out "$run"
  expect_rc 0 "train"
  mount -o remount,ro "$TMP/eval-ro"
  t eval-ro eval "$run" --knn --no-baseline --set data.limit=256 --set data.test_limit=100
  expect_rc 1 "eval of a run it cannot record in"
  said "$last.err" "not recorded in .*eval.jsonl" "the message"
else
  skip "$name: tmpfs cannot be mounted here"
fi
finish "$name"

fi

# ---------------------------------------------------------------------------------------------
# 20. The files `tally compare` reads back are whole and its runs' own, and its own files are
# outputs no command overwrites.
if want 20; then
CMP_ARGS=(--objectives inbatch --budget 1epochs --seeds 2 --set data.dataset=stripes
  --set train.batch_size=8 --set eval.knn_k=4 --set eval.batch_size=8 --quiet)
# cmp_case LABEL DIR: tally compare of the two-seed compare above into DIR.
cmp_case() { t "$1" compare "${CMP_ARGS[@]}" --out "$2"; }
cdir=$TMP/cmp
cmp_case cmp-setup "$cdir"
if expect_rc 0 "the compare"; then
  name="20a compare-eval.json cut off, an HTML page, another seed's: exit 1, naming it"
  seed1=inbatch-1epochs-seed1
  for how in cut html other; do
    rm -rf "$cdir-$how" && cp -a "$cdir" "$cdir-$how"
    f=$cdir-$how/$seed1/compare-eval.json
    case $how in
      cut) head -c 120 "$cdir/$seed1/compare-eval.json" >"$f" ;;
      html) printf '<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n' >"$f" ;;
      other) cp "$cdir/inbatch-1epochs-seed0/compare-eval.json" "$f" ;;
    esac
    cp "$f" "$TMP/cmp-eval-$how"
    cmp_case "cmp-$how" "$cdir-$how"
    expect_rc 1 "compare over a compare-eval.json ($how)"
    one_line_error "$last.err" "$seed1/compare-eval.json: " "the refusal ($how)"
    cmp -s "$f" "$TMP/cmp-eval-$how" || bad "the $how compare-eval.json was changed"
  done
  finish "$name"

  name="20b compare.settings cut off: exit 1, naming it, not \"other settings\" (2)"
  rm -rf "$cdir-set" && cp -a "$cdir" "$cdir-set"
  head -c 20 "$cdir/compare.settings" >"$cdir-set/compare.settings"
  cmp_case cmp-set "$cdir-set"
  expect_rc 1 "compare over a cut-off compare.settings"
  one_line_error "$last.err" "compare.settings: line 1 " "the refusal"
  finish "$name"

  name="20c report, export and embed --out over a compare's own files: refused, files unchanged"
  cp "$cdir/compare.settings" "$TMP/cmp-settings" && cp "$cdir/compare.json" "$TMP/cmp-json"
  cp "$cdir/$seed1/compare-eval.json" "$TMP/cmp-eval"
  t cmp-report report "$cdir/$seed1" --out "$cdir/$seed1/compare-eval.json"
  expect_rc 1 "report --out RUN/compare-eval.json"
  said "$last.err" "compare-eval.json: is the run's own" "the report's refusal"
  t cmp-export export "$cdir/$seed1" --out "$cdir/compare.settings"
  expect_rc 1 "export --out CMP/compare.settings"
  said "$last.err" "compare.settings: is the compare's own" "the export's refusal"
  t cmp-embed embed "$cdir/$seed1" --data "$ROOT/data/samples" --out "$cdir/compare.json"
  expect_nonzero "embed --out CMP/compare.json"
  said "$last.err" "compare.json: is the compare's own" "embed's refusal"
  cmp -s "$cdir/compare.settings" "$TMP/cmp-settings" || bad "compare.settings was changed"
  cmp -s "$cdir/compare.json" "$TMP/cmp-json" || bad "compare.json was changed"
  cmp -s "$cdir/$seed1/compare-eval.json" "$TMP/cmp-eval" || bad "compare-eval.json was changed"
  cmp_case cmp-after "$cdir"
  expect_rc 0 "the compare again"
  finish "$name"

  name="20d a killed compare's temporaries: removed by the next compare of the folder"
  touch "$cdir/compare.json.tmp.999999.0" "$cdir/$seed1/compare-eval.json.tmp.999999.1"
  cmp_case cmp-stale "$cdir"
  expect_rc 0 "the compare again"
  for f in "$cdir/compare.json.tmp.999999.0" "$cdir/$seed1/compare-eval.json.tmp.999999.1"; do
    [[ ! -e $f ]] || bad "${f#"$cdir"/} is left"
  done
  finish "$name"

  name="20e compare-eval.json as a symbolic link: not followed"
  rm -rf "$cdir-link" && cp -a "$cdir" "$cdir-link"
  mv "$cdir-link/$seed1/compare-eval.json" "$TMP/cmp-link-target.json"
  ln -s "$TMP/cmp-link-target.json" "$cdir-link/$seed1/compare-eval.json"
  cmp_case cmp-link "$cdir-link"
  expect_rc 1 "compare over a linked compare-eval.json"
  one_line_error "$last.err" "compare-eval.json: is a symbolic link" "the refusal"
  finish "$name"
else
  finish "20 compare's files: the compare to start from failed"
fi

fi

# ---------------------------------------------------------------------------------------------
# 21. A resumed run's ledger.csv is its checkpoint's; its last evaluation is recorded once.
if want 21; then
name="21a --resume over another run's ledger.csv: exit 1 naming it, every ledger file untouched"
run=$TMP/csv-a
t csv-a train "${SMALL512[@]}" --steps 4 --stop-at 2 --out "$run"
expect_rc 0 "train --stop-at 2"
t csv-b train "${SMALL512[@]}" --steps 3 --set train.seed=5 --out "$TMP/csv-b"
expect_rc 0 "the other run"
cp "$run/ledger.csv" "$TMP/csv-a-own.csv"
cp "$TMP/csv-b/ledger.csv" "$run/ledger.csv"
cp "$run/ledger.jsonl" "$TMP/csv-a-own.jsonl"
t csv-resume train --resume "$run" --no-knn --quiet
expect_rc 1 "train --resume over another ledger.csv"
one_line_error "$last.err" "$run/ledger.csv: is not the ledger of this checkpoint's run" "the refusal"
cmp -s "$run/ledger.csv" "$TMP/csv-b/ledger.csv" || bad "ledger.csv was changed"
cmp -s "$run/ledger.jsonl" "$TMP/csv-a-own.jsonl" || bad "ledger.jsonl was changed"
cp "$TMP/csv-a-own.csv" "$run/ledger.csv"
t csv-resume-own train --resume "$run" --no-knn --quiet
expect_rc 0 "train --resume over its own ledger.csv"
# The header and one row per step, 0..3, each once.
[[ $(cut -d, -f1 "$run/ledger.csv" | tr '\n' ' ') == "step 0 1 2 3 " ]] ||
  bad "ledger.csv's first column is [$(cut -d, -f1 "$run/ledger.csv" | tr '\n' ' ')]"
finish "$name"

name="21b a finished run whose summary was lost, resumed: its last evaluation recorded once"
run=$TMP/final-eval
t final-eval train --set data.limit=256 --set train.batch_size=32 --set data.test_limit=100 \
  --steps 2 --quiet --out "$run"
expect_rc 0 "train"
rm -f "$run/summary.json"  # as a full disk at the summary leaves it
t final-eval-resume train --resume "$run" --quiet
expect_rc 0 "train --resume"
has_summary "$run"
n=$(grep -c '"step":2,"what":"encoder"' "$run/eval.jsonl")
[[ $n == 1 ]] || bad "eval.jsonl holds $n records of the evaluation after step 2"
finish "$name"

name="21c --resume over another run's eval.jsonl: exit 1 naming it, untouched; tally eval's kept"
EVAL_RUN=(--set data.limit=256 --set train.batch_size=32 --set data.test_limit=100
  --set eval.every_steps=2 --quiet)
run=$TMP/evals-a
t evals-a train "${EVAL_RUN[@]}" --steps 6 --stop-at 2 --out "$run"
expect_rc 0 "train --stop-at 2"
# (another test set: its raw-pixel baseline, its first line, cannot equal this run's 74/100)
t evals-b train "${EVAL_RUN[@]}" --steps 6 --stop-at 2 --set data.test_limit=70 --out "$TMP/evals-b"
expect_rc 0 "the other run"
t evals-eval eval "$run" --knn --no-baseline --set data.limit=256 --set data.test_limit=100
expect_rc 0 "tally eval of the run"
cp "$run/eval.jsonl" "$TMP/evals-a-own.jsonl"
cp "$TMP/evals-b/eval.jsonl" "$run/eval.jsonl"
t evals-resume train --resume "$run" --quiet
expect_rc 1 "train --resume over another eval.jsonl"
one_line_error "$last.err" "$run/eval.jsonl: is not the record of this checkpoint's run" "the refusal"
cmp -s "$run/eval.jsonl" "$TMP/evals-b/eval.jsonl" || bad "eval.jsonl was changed"
cp "$TMP/evals-a-own.jsonl" "$run/eval.jsonl"
t evals-resume-own train --resume "$run" --quiet
expect_rc 0 "train --resume over its own eval.jsonl (and tally eval's record)"
grep -q '"source":"tally eval"' "$run/eval.jsonl" || bad "tally eval's record was dropped"
finish "$name"
fi

# ---------------------------------------------------------------------------------------------
# 22. MPI: rank 0 evaluates alone for longer than parallel.timeout (a large labeled folder).
if want 22; then
if command -v "$MPIRUN" >/dev/null 2>&1; then
  SOLO=(train --set parallel.backend=mpi --set data.limit=256 --set train.batch_size=32
    --set data.test_limit=100 --steps 3 --set parallel.timeout=2 --quiet)
  name="22a mpi: rank 0's evaluation outlasts parallel.timeout (2 s): the run goes on"
  run=$TMP/mpi-solo
  mpi mpi-solo 2 -x TALLY_INJECT_SLOW_EVAL=6000 "$TALLY_BIN" "${SOLO[@]}" --out "$run"
  expect_rc 0 "mpirun"
  has_summary "$run"
  grep -q '"step":3,"what":"encoder"' "$run/eval.jsonl" 2>/dev/null || bad "no evaluation recorded"
  finish "$name"

  name="22b mpi: rank 0 stopped (SIGSTOP) in its evaluation: rank 1 names rank 0 and the phase"
  run=$TMP/mpi-solo-stop
  timeout "$LIMIT" "${MPIRUN_CMD[@]}" --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
    -x TALLY_INJECT_SLOW_EVAL=60000 "$TALLY_BIN" "${SOLO[@]}" --set parallel.timeout=3 \
    --out "$run" >"$TMP/mpi-solo-stop.out" 2>"$TMP/mpi-solo-stop.err" &
  tpid=$!
  BG_PIDS+=("$tpid")
  last=$TMP/mpi-solo-stop
  # The 3 steps are logged, then rank 0 checkpoints and evaluates (60 s, stretched).
  if wait_lines "$run/ledger.jsonl" 3 "$tpid"; then
    sleep 1
    root=""
    for p in $(pgrep -f -- "train .*--out $run( |\$)"); do  # this run's own (see 6h)
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && root=$p
    done
    [[ -n $root ]] && kill -STOP "$root"
    t0=$(date +%s%N)
    finish_bg
    ms=$((($(date +%s%N) - t0) / 1000000))
    [[ -n $root ]] && kill -KILL "$root" 2>/dev/null
    [[ -n $root ]] || bad "rank 0's process was not found"
    expect_nonzero "mpirun"
    said "$last.err" "rank 1: no word from rank 0 for [0-9]+ s while it was in its checkpoint and \
the monitor's evaluation after step 3" "the watchdog's message"
    ((ms < 40000)) || bad "took ${ms} ms after the stop"
  else
    finish_bg
    bad "the run ended (exit $rc) before 3 steps were logged: $(firstline "$last.err")"
  fi
  finish "$name"
else
  skip "22a/22b mpi: $MPIRUN is missing"
fi
fi

# ---------------------------------------------------------------------------------------------
# 23. A data path of any length a file name may have: read back from config.ini and checkpoints.
if want 23; then
name="23a a data path of 600 characters: trained and resumed"
long=$TMP/long/$(printf 'd%.0s' {1..190})/$(printf 'e%.0s' {1..190})/$(printf 'f%.0s' {1..190})
png_classes "$long"
run=$TMP/long-run
t long train --data "$long" --set data.image_size=8 --batch-size 4 --steps 4 --stop-at 2 --no-knn \
  --quiet --out "$run"
expect_rc 0 "train --data (a path of ${#long} characters)"
grep -qF "train = $long" "$run/config.ini" 2>/dev/null || bad "config.ini does not hold the whole path"
t long-resume train --resume "$run" --quiet
expect_rc 0 "train --resume"
ledger_is "$run" 4
finish "$name"
fi

# ---------------------------------------------------------------------------------------------
# 24. Photos as cameras and editors write them: a CMYK JPEG (Adobe's inverted form, as PIL writes
# it) and a top-down BMP (negative height) in a streamed photo folder are trained on to the end,
# each read as PIL reads it; a file the decoder cannot read is refused when the folder is listed,
# before the first step, not when a step reaches it.
if want 24; then
name="24a a CMYK JPEG and a top-down BMP in a streamed photo folder: trained on to the end"
photos=$TMP/cmyk-photos
mkdir -p "$photos/2019" "$photos/2020"
if /usr/bin/python3 - "$photos" <<'PY'; then
import struct, sys
from PIL import Image
d = sys.argv[1]
def picture(i):
    im = Image.new("RGB", (12, 10))
    im.putdata([((40 * i + 7 * x) % 256, (90 + 11 * y) % 256, (13 * x * y + i) % 256)
                for y in range(10) for x in range(12)])
    return im
for i in range(9):
    picture(i).save(f"{d}/2019/{i}.jpg", quality=95)
picture(20).convert("CMYK").save(f"{d}/2020/cmyk.jpg", quality=95)
# A top-down BMP: PIL writes bottom-up rows; reverse them and negate the height.
picture(21).save(f"{d}/2020/bottom-up.bmp")
raw = bytearray(open(f"{d}/2020/bottom-up.bmp", "rb").read())
offset, = struct.unpack_from("<I", raw, 10)
width, height = struct.unpack_from("<ii", raw, 18)
stride = (width * 3 + 3) // 4 * 4
rows = [raw[offset + r * stride: offset + (r + 1) * stride] for r in range(height)]
raw[offset:] = b"".join(reversed(rows))
struct.pack_into("<i", raw, 22, -height)
open(f"{d}/2020/top-down.bmp", "wb").write(bytes(raw))
PY
  run=$TMP/cmyk-run
  # 12 photos in batches of 4, 2 epochs: every photo is decoded in every epoch.
  t cmyk train --data "$photos" --set data.labels=none --set data.image_size=8 --set data.channels=3 \
    --batch-size 4 --epochs 2 --no-knn --quiet --out "$run"
  expect_rc 0 "train on a folder with a CMYK JPEG and a top-down BMP"
  [[ -s $run/summary.json ]] || bad "no summary.json"
else
  bad "could not write the photos with PIL (scripts/setup.sh --for-tests installs python3-pil)"
fi
finish "$name"

name="24b a JPEG the decoder cannot read: refused at the listing, naming it, before step 0"
bad_photos=$TMP/bad-photos
mkdir -p "$bad_photos"
cp "$photos"/2019/*.jpg "$bad_photos"/
# A JPEG whose frame header says 2 components (no colour space a photo has), and nothing after.
printf '\xff\xd8\xff\xc0\x00\x0e\x08\x00\x0a\x00\x0c\x02\x01\x11\x00\x02\x11\x00\xff\xd9' \
  >"$bad_photos/two-components.jpg"
run=$TMP/bad-photos-run
t bad-photos train --data "$bad_photos" --set data.labels=none --set data.image_size=8 \
  --set data.channels=3 --batch-size 4 --epochs 2 --no-knn --quiet --out "$run"
expect_rc 1 "train on a folder with an undecodable JPEG"
said "$last.err" "two-components.jpg" "the error naming the file"
[[ ! -s $run/ledger.jsonl ]] || bad "a step ran before the file was refused"
finish "$name"
fi

totals
