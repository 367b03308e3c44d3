#!/usr/bin/env bash
# Open MPI over real TCP between several "machines": two network namespaces on this box, joined
# by a veth pair (10.77.0.1/24 and 10.77.0.2/24, addresses that exist only inside the namespaces
# this script creates; tests/netns_lib.sh). mpirun starts inside the first namespace with a
# hostfile of the two addresses and tests/netns_rsh.sh as its rsh agent (it enters the namespace
# of an address), one rank per namespace, TCP only (btl tcp,self; btl and oob restricted to the
# veth subnet).
#
#   1 mae (no BatchNorm): the ledger losses of the 2-host run equal a 1-replica run's with the
#     same global batch at every step, within 1e-4 relative (tests/test_parallel.c's rule: the
#     reductions add the same numbers in another order); each rank ran in its own namespace and
#     the traffic went over the veth.
#   2 only rank 0 writes: each rank's cwd and HOME is a private empty dir that stays empty, and
#     the run folder holds exactly one ledger.
#   3 rank 1 exits at step 2 (TALLY_INJECT_FAIL=1:2): mpirun ends the job on both hosts, non-zero
#     and not by the timeout, with an error naming the failed process, no summary.json, and no
#     tally or orted left in either namespace.
#   4 inbatch and moco on a ResNet with model.sync_bn = 1: the 2-host losses equal a 1-replica
#     run's (step 0 to 1e-5; later steps to 2e-3, as the net amplifies rounding).
#
# Prints `ok - NAME` or `not ok - NAME: why` per check, then `N passed, M failed`; exits 1 if a
# check failed. Needs root and `ip netns`: without them (or if a namespace cannot be created) it
# prints `SKIPPED: why` and exits 77, unless CI is set, where that is a failure (exit 1). Every
# command is bounded by `timeout`; the namespaces, their processes and temp dirs are removed on
# any exit. Run from anywhere; TALLY_BIN defaults to build/tally, MPIEXEC to mpirun.
set -u

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
# shellcheck source=netns_lib.sh source-path=SCRIPTDIR
source "$ROOT/tests/netns_lib.sh"

SHORT=10  # seconds for any one ip / setup command
STEPS=4

MPIRUN=$(command -v "${MPIEXEC:-mpirun}") || setup_fail "${MPIEXEC:-mpirun} is not installed"
[[ $EUID -eq 0 ]] || skip_or_fail "not root (network namespaces need CAP_SYS_ADMIN)"
command -v ip >/dev/null 2>&1 || skip_or_fail "iproute2 (ip) is not installed"
timeout "$SHORT" ip netns list >/dev/null 2>&1 || skip_or_fail "'ip netns' is unavailable"

BG=""  # the bounded command under way, if any

# bounded ARGS...: runs ARGS under the timeout, in the background so that a signal to this
# script is handled at once (not only when the command ends); the exit code is the command's.
bounded() {
  timeout -k 5 "$LIMIT" "$@" &
  BG=$!
  wait "$BG"
  local r=$?
  BG=""
  return "$r"
}

# On any exit (tests/lib.sh), before the temp dir goes.
release() {
  # timeout passes the TERM on to its command, and kills it 5 s later if it is still there.
  if [[ -n $BG ]]; then
    kill -TERM "$BG" 2>/dev/null
    wait "$BG" 2>/dev/null
  fi
  netns_release
}

# --- The two hosts: namespace names unique to this run (two runs of the test may overlap) and a
# private subnet that only exists inside them.
netns_create "tally-mh$$" 10.77.0 "$TMP/hosts"
case $? in
  1) skip_or_fail "cannot create the two hosts: $NETNS_ERROR" ;;
  2) setup_fail "cannot configure the veth pair: $NETNS_ERROR" ;;
esac
NS_A=$NETNS_A
NS_B=$NETNS_B

# Small runs with absolute paths (each rank's cwd is a private empty dir, so nothing relative).
SMALL=(--set data.limit=256 --set train.batch_size=32 --steps "$STEPS" --no-knn --quiet)
MAE=(--objective=mae --config "$ROOT/configs/mae.ini" --set "model.file=$ROOT/models/vit-tiny.ini")
RESNET=(--set "model.file=$ROOT/models/resnet-small.ini")

# one LABEL ARGS...: one replica, in the host's namespace; output in $TMP/LABEL.out/.err; sets rc.
one() {
  local label=$1
  shift
  OMP_NUM_THREADS=1 bounded "$TALLY_BIN" train "$@" "${SMALL[@]}" \
    --out "$TMP/runs/$label" >"$TMP/$label.out" 2>"$TMP/$label.err"
  rc=$?
}

# hosts LABEL [MPIRUN OPTIONS...] -- ARGS...: tally train with the MPI backend, one rank in each
# namespace, mpirun started inside the first; rank R runs with cwd and HOME $TMP/LABEL.priv/rankR
# (created empty) and records its namespace in $TMP/LABEL.priv/netns.R. Sets rc and seconds.
hosts() {
  local label=$1 priv=$TMP/$1.priv start
  shift
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  mkdir -p "$priv/rank0" "$priv/rank1"
  start=$SECONDS
  # shellcheck disable=SC2016  # expanded by each rank's bash
  bounded "${NETNS_MPIRUN[@]}" -x OMP_NUM_THREADS=1 "${opts[@]}" \
    bash -c 'r=$OMPI_COMM_WORLD_RANK; ip netns identify >"$0/netns.$r"; cd "$0/rank$r" &&
             HOME=$0/rank$r exec "$@"' "$priv" \
    "$TALLY_BIN" train --set parallel.backend=mpi "$@" "${SMALL[@]}" --out "$TMP/runs/$label" \
    >"$TMP/$label.out" 2>"$TMP/$label.err"
  rc=$?
  seconds=$((SECONDS - start))
}

# losses RUN: the ledger's losses, one a line.
losses() { grep -o '"loss":[^,}]*' "$TMP/runs/$1/ledger.jsonl" 2>/dev/null | cut -d: -f2; }

# veth_bytes: bytes through the first host's end of the veth pair (received + sent).
veth_bytes() {
  local rx tx stats=/sys/class/net/$NETNS_IF/statistics
  rx=$(timeout "$SHORT" ip netns exec "$NS_A" cat "$stats/rx_bytes" 2>/dev/null)
  tx=$(timeout "$SHORT" ip netns exec "$NS_A" cat "$stats/tx_bytes" 2>/dev/null)
  echo $((${rx:-0} + ${tx:-0}))
}

# expect_rc0 WHAT: the last call exited 0.
expect_rc0() {
  if [[ $rc == 124 ]]; then
    bad "$1: hang (killed by timeout after ${LIMIT} s)"
  elif [[ $rc != 0 ]]; then
    bad "$1: exit $rc (stderr: $(firstline "$2"))"
  fi
  [[ $rc == 0 ]]
}

# placed LABEL: rank 0 ran in the first namespace and rank 1 in the second.
placed() {
  local p=$TMP/$1.priv
  [[ $(cat "$p/netns.0" 2>/dev/null) == "$NS_A" && $(cat "$p/netns.1" 2>/dev/null) == "$NS_B" ]] ||
    bad "ranks ran in namespaces '$(cat "$p/netns.0" 2>/dev/null)' and '$(cat "$p/netns.1" \
      2>/dev/null)', expected $NS_A and $NS_B"
}

# ---------------------------------------------------------------------------------------------
# 1. mae over two hosts takes the steps of one replica.
name="1 mae: 2 hosts over TCP have one replica's losses"
one mae-one "${MAE[@]}"
expect_rc0 "1 replica" "$TMP/mae-one.err"
before=$(veth_bytes)
hosts mae-hosts -- "${MAE[@]}"
mae_rc=$rc
through=$(($(veth_bytes) - before))
if expect_rc0 "mpirun" "$TMP/mae-hosts.err"; then
  placed mae-hosts
  mapfile -t la < <(losses mae-one)
  mapfile -t lb < <(losses mae-hosts)
  if [[ ${#la[@]} != "$STEPS" || ${#lb[@]} != "$STEPS" ]]; then
    bad "ledger steps: ${#la[@]} (1 replica) and ${#lb[@]} (2 hosts), expected $STEPS"
  else
    for ((i = 0; i < STEPS; i++)); do
      awk -v a="${la[i]}" -v b="${lb[i]}" \
        'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(d <= 1e-4 * m) }' ||
        bad "step $i: loss ${lb[i]} on 2 hosts, ${la[i]} on 1 replica (beyond 1e-4 relative)"
    done
    worst=$(paste <(printf '%s\n' "${la[@]}") <(printf '%s\n' "${lb[@]}") |
      awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.2g", w }')
  fi
  # The gradients (~3.4 MB a step for vit-tiny) must have crossed the veth, not another path.
  sent=$(grep -o '"comm_bytes":[0-9.e+]*' "$TMP/runs/mae-hosts/ledger.jsonl" | cut -d: -f2 |
    awk '{ s += $1 } END { printf "%d", s }')
  ((through >= sent / 2)) ||
    bad "only $through bytes crossed the veth, the ledger counts $sent bytes of communication"
fi
[[ -z $why ]] && name+=" ($STEPS steps, largest relative difference ${worst:-?}; $((through / 1000000)) MB over the veth)"
finish "$name"

# 2. Only rank 0 writes.
name="2 only rank 0 writes the run folder"
if [[ $mae_rc == 0 ]]; then
  for r in 0 1; do
    leftover=$(find "$TMP/mae-hosts.priv/rank$r" -mindepth 1 -printf '%P ' 2>/dev/null)
    [[ -z $leftover ]] || bad "rank $r wrote into its cwd/HOME: $leftover"
  done
  n=$(find "$TMP/runs" -name ledger.jsonl -path "*mae-hosts*" | wc -l)
  [[ $n == 1 ]] || bad "$n ledgers under the run folder, expected 1"
  [[ -f $TMP/runs/mae-hosts/summary.json ]] || bad "no summary.json in the run folder"
  others=$(find "$TMP/runs" -mindepth 1 -maxdepth 1 ! -name mae-one ! -name mae-hosts -printf '%P ')
  [[ -z $others ]] || bad "other run folders appeared: $others"
else
  bad "the 2-host mae run failed (check 1)"
fi
finish "$name"

# 3. A rank that dies on one host ends the job on the other.
name="3 rank 1 killed at step 2 ends the job on both hosts"
hosts fail -x TALLY_INJECT_FAIL=1:2 -- "${MAE[@]}"
if [[ $rc == 124 ]]; then
  bad "hang (killed by timeout after ${LIMIT} s)"
elif [[ $rc == 0 ]]; then
  bad "mpirun exited 0"
fi
# Open MPI 4.1 names the rank that exited. Open MPI 5 (PRRTE) names the rank that aborted first,
# which here is rank 0 losing its peer's socket ("prterun has exited due to process rank 0 ...
# calling abort"), and writes NUL bytes into the stream (-a).
named='exited with non-zero status|returned a non-zero exit code|process.*(killed|exited)'
grep -Eqai "$named|exited due to process rank [0-9]+" "$TMP/fail.err" ||
  bad "no error naming the failed process (stderr: $(firstline "$TMP/fail.err"))"
[[ ! -e $TMP/runs/fail/summary.json ]] || bad "summary.json written"
grep -q '"step":' "$TMP/runs/fail/ledger.jsonl" 2>/dev/null ||
  bad "no step was logged before the kill (the fault did not hit a running job)"
left=""
for ((i = 0; i < 10; i++)); do
  left=""
  for ns in "$NS_A" "$NS_B"; do
    pids=$(timeout "$SHORT" ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -z $pids ]] || left+="$ns: $pids"
  done
  [[ -z $left ]] && break
  sleep 1
done
[[ -z $left ]] || bad "processes left 10 s after mpirun returned: $left"
netns_kill
[[ -z $why ]] && name+=" (exit $rc after ${seconds} s)"
finish "$name"

# 4. inbatch and moco (BatchNorm) over the two hosts, with synchronized BatchNorm, take one
# replica's steps: step 0 to 1e-5 (rounding only), later steps to 2e-3 (this ResNet amplifies
# rounding: one replica on 1 or 2 threads already differs by 1e-4 at this learning rate).
SYNCED=(--set model.sync_bn=1 --set optim.lr=0.01)
for numbered in 4a:inbatch 4b:moco; do
  objective=${numbered#*:}
  name="${numbered%%:*} $objective: 2 hosts with sync_bn have one replica's losses"
  one "$objective-one" --objective="$objective" "${RESNET[@]}" "${SYNCED[@]}"
  one_rc=$rc
  hosts "$objective-hosts" -- --objective="$objective" "${RESNET[@]}" "${SYNCED[@]}"
  if expect_rc0 "mpirun" "$TMP/$objective-hosts.err" && [[ $one_rc == 0 ]]; then
    placed "$objective-hosts"
    [[ -f $TMP/runs/$objective-hosts/summary.json ]] || bad "no summary.json"
    mapfile -t la < <(losses "$objective-one")
    mapfile -t lb < <(losses "$objective-hosts")
    if [[ ${#la[@]} != "$STEPS" || ${#lb[@]} != "$STEPS" ]]; then
      bad "ledger steps: ${#la[@]} (1 replica) and ${#lb[@]} (2 hosts), expected $STEPS"
    else
      for ((i = 0; i < STEPS; i++)); do
        awk -v a="${la[i]}" -v b="${lb[i]}" -v tol="$([[ $i == 0 ]] && echo 1e-5 || echo 2e-3)" \
          'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }' ||
          bad "step $i: loss ${lb[i]} on 2 hosts, ${la[i]} on 1 replica"
      done
    fi
  elif [[ $one_rc != 0 ]]; then
    bad "1 replica: exit $one_rc (stderr: $(firstline "$TMP/$objective-one.err"))"
  fi
  finish "$name"
done

totals
