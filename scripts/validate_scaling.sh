#!/usr/bin/env bash
# Checks `tally plan --nodes 2 --link RATE` against two machines on a real, rate-limited link:
# two network namespaces on this box joined by a veth pair (tests/netns_lib.sh), one MPI rank in
# each, the link shaped by `tc ... tbf` on both ends of the pair.
#
#   scripts/validate_scaling.sh [OBJECTIVE...]     default: inbatch moco mae
#
# For each objective (its recipe in configs/: resnet-small for inbatch and moco, vit-tiny for
# mae; batch 256, no kNN) and each link (unlimited, 1 Gbit/s, 100 Mbit/s; the last two again
# with Open MPI's ring for the gradient allreduce instead of its own choice, binomial):
#   1. two reference runs of two local replicas (`--set parallel.replicas=2`: threads of one
#      process, one core each, as each namespace rank has one core here), one right before and
#      one right after the measured run, so that together they see the load the measured run
#      saw on a shared machine (a machine whose speed drifts by 20% within minutes otherwise
#      decides the error);
#   2. the prediction from each, `tally plan --from REF --nodes 2 --link RATE --allreduce ALG
#      --json` (ALG ring for the ring rows, else auto), and the mean of the two: RATE is the
#      rate tbf is given, a line rate of which the plan takes TCP's payload at MTU 1500; the
#      unshaped pair, which moves
#      bytes as fast as the CPU copies them, is predicted at the payload rate measured on it
#      (`--link RATE --mtu 0`);
#   3. the same run over the two namespaces (`--set parallel.backend=mpi`, mpirun over TCP only),
#      tbf at the rate on both ends of the veth pair (no qdisc for unlimited);
#   4. a table row: the median step_ms and comm_ms of the measured run's ledger (steps from
#      WARMUP on) against the predicted ones; the error is (predicted − measured) / measured.
# Before the runs, each link's TCP payload rate is measured with a bulk transfer between the
# namespaces (2 s, python3), against what the plan takes (links.md).
# The table is printed last and written with every run folder and log under
# bench-results/<timestamp>-scaling/, next to diagnosis.md: per row, the load average when the
# row started, compute (step_ms − comm_ms) of the references (their mean) and of the measured
# run, the references' comm_ms (local replicas exchange in memory, so that is waiting for the
# slower replica: the prediction's wait), the predicted link time (all of it, and the part
# backward does not hide), the measured run's comm_ms above the same objective's at unlimited,
# and its step_ms above the references'.
#
# The ranks wait with `--mca mpi_yield_when_idle 1`: two ranks on two cores that other work
# shares are oversubscribed, and a rank that busy-polls keeps the CPU its peer needs to answer
# (each blocking exchange then waits out a time slice). MPI_MCA adds mpirun options to every
# 2-host run.
#
# Environment: TALLY_BIN (default build/tally), MPIEXEC (mpirun), MPI_MCA, STEPS (20),
# WARMUP (2), LATENCY (--latency of the prediction, 50us). Needs root, `ip netns`, `tc` and
# Open MPI. The namespaces (with them the veth pair and its qdiscs) and any process left in them
# are removed on any exit. About 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TALLY_BIN=${TALLY_BIN:-build/tally}
case $TALLY_BIN in /*) ;; *) TALLY_BIN=$ROOT/$TALLY_BIN ;; esac
read -ra MPI_MCA <<<"${MPI_MCA:-}"
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-2}
LATENCY=${LATENCY:-50us}
LIMIT=600  # seconds for any one run
OBJECTIVES=("$@")
((${#OBJECTIVES[@]})) || OBJECTIVES=(inbatch moco mae)

# Links: the label in the table, the rate `tally plan` is given (none for unlimited: the measured
# payload rate), the rate tbf is given (none: no qdisc), and "ring" to force the ring allreduce;
# unlimited first, as the others' link share is measured against it.
LINKS=("unlimited||none|" "1 Gbit/s|1Gbit|1gbit|" "100 Mbit/s|100Mbit|100mbit|"
  "1 Gbit/s, ring|1Gbit|1gbit|ring" "100 Mbit/s, ring|100Mbit|100mbit|ring")
RING=(--mca coll_libnbc_iallreduce_algorithm 1)

die() {
  echo "validate_scaling: $*" >&2
  exit 1
}

MPIRUN=$(command -v "${MPIEXEC:-mpirun}") || die "${MPIEXEC:-mpirun} is not installed"
[[ -x $TALLY_BIN ]] || die "TALLY_BIN=$TALLY_BIN is not an executable"
[[ $EUID -eq 0 ]] || die "needs root (network namespaces and tc)"
command -v ip >/dev/null || die "needs iproute2 (ip)"
command -v tc >/dev/null || die "needs iproute2 (tc)"
command -v python3 >/dev/null || die "needs python3 (to measure the links)"

# shellcheck source=../tests/netns_lib.sh source-path=SCRIPTDIR
source "$ROOT/tests/netns_lib.sh"
trap netns_release EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

OUT=$ROOT/bench-results/$(date +%Y%m%d-%H%M%S)-scaling
mkdir -p "$OUT"

# The two hosts: namespaces unique to this run, a private subnet that exists only inside them.
netns_create "tally-val$$" 10.78.0 "$OUT/hosts" || die "cannot make the two hosts: $NETNS_ERROR"

# payload_rate: bytes/s of TCP payload from the first namespace to the second as the link is
# shaped now: the sender writes for 2 s, the receiver counts from its first byte to the last.
payload_rate() {
  local result
  result=$(ip netns exec "$NETNS_B" timeout 30 python3 -c '
import socket, sys, time
server = socket.create_server((sys.argv[1], 5201))
server.settimeout(20)
conn, _ = server.accept()
first, last, n = None, None, 0
while True:
    b = conn.recv(1 << 20)
    if not b:
        break
    last = time.monotonic()
    first = first or last
    n += len(b)
print("%.0f" % (n / (last - first)) if n and last > first else "0")
' "$NETNS_ADDR_B" &
    ip netns exec "$NETNS_A" timeout 30 python3 -c '
import socket, sys, time
for attempt in range(100):  # until the receiver listens
    try:
        s = socket.create_connection((sys.argv[1], 5201), timeout=10)
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
else:
    sys.exit("nothing listens on %s" % sys.argv[1])
block, end = bytes(1 << 20), time.monotonic() + 2
while time.monotonic() < end:
    s.sendall(block)
s.close()
' "$NETNS_ADDR_B" >/dev/null
    wait)
  [[ $result =~ ^[0-9]+$ && $result != 0 ]] || die "could not measure the link's payload rate"
  echo "$result"
}

# recipe OBJECTIVE: the training arguments every run of OBJECTIVE shares, absolute paths (a
# rank's working directory is wherever its namespace's shell starts).
recipe() {
  local model=resnet-small
  [[ $1 == mae ]] && model=vit-tiny
  echo "--objective=$1 --config $ROOT/configs/$1.ini --set model.file=$ROOT/models/$model.ini" \
    "--steps $STEPS --no-knn --quiet"
}

# reference OBJECTIVE RUN: two local replicas, one core each (the trainer splits the cores).
reference() {
  local args
  read -ra args <<<"$(recipe "$1")"
  timeout -k 5 "$LIMIT" "$TALLY_BIN" train "${args[@]}" --set parallel.replicas=2 \
    --out "$OUT/$2" >"$OUT/$2.log" 2>&1 || die "the reference run of $1 failed: see $OUT/$2.log"
}

# hosts OBJECTIVE RUN [MPIRUN OPTIONS...]: one rank in each namespace, mpirun in the first, TCP
# over the veth only; the trainer gives each rank this machine's cores / 2 threads.
hosts() {
  local args objective=$1 run=$2
  shift 2
  read -ra args <<<"$(recipe "$objective")"
  timeout -k 5 "$LIMIT" "${NETNS_MPIRUN[@]}" --mca mpi_yield_when_idle 1 "${MPI_MCA[@]}" "$@" \
    "$TALLY_BIN" train "${args[@]}" --set parallel.backend=mpi --out "$OUT/$run" \
    >"$OUT/$run.log" 2>&1 || die "the 2-host run $run failed: see $OUT/$run.log"
}

# median RUN FIELD: the median of FIELD over RUN's ledger, steps WARMUP and later.
median() {
  grep -o "\"step\":[0-9]*\|\"$2\":[-0-9.e+]*" "$OUT/$1/ledger.jsonl" |
    awk -F: -v warmup="$WARMUP" '$1 == "\"step\"" { keep = $2 >= warmup; next } keep { print $2 }' |
    sort -g |
    awk '{ v[NR] = $1 }
         END { printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# predicted FIELD JSON...: the mean of FIELD over `tally plan --json` lines.
predicted() {
  local field=$1
  shift
  printf '%s\n' "$@" | grep -o "\"$field\":[-0-9.e+]*" | cut -d: -f2 |
    awk '{ s += $1 } END { printf "%.1f", NR ? s / NR : 0 }'
}

# error PREDICTED MEASURED: the prediction's error in % of the measurement, signed.
error() { awk -v p="$1" -v m="$2" 'BEGIN { printf "%+.0f%%", (m > 0 ? 100 * (p - m) / m : 0) }'; }

# mean A B: (A + B) / 2, one decimal.
mean() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (a + b) / 2 }'; }

# minus A B: A − B, one decimal.
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

TABLE=$OUT/table.md
{
  echo "| objective | link | step ms predicted / measured | error |" \
    "no overlap: predicted | error | comm ms predicted / measured | error |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
} >"$TABLE"
DIAG=$OUT/diagnosis.md
{
  echo "| objective | link | load | compute ms reference / measured | reference comm ms |" \
    "link ms predicted: all / not hidden | measured: comm − comm at unlimited |" \
    "step − reference step |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
} >"$DIAG"

echo "validate_scaling: $STEPS steps a run (medians from step $WARMUP), load average" \
  "$(cut -d' ' -f1-3 /proc/loadavg) at the start; results in $OUT"

# Each link's payload rate, measured, against the plan's (MTU 1500 of the line rate).
declare -A PAYLOAD
LINKS_MD=$OUT/links.md
{
  echo "| link | tbf rate, burst | TCP payload measured | plan's payload (MTU 1500) |"
  echo "|---|---|---:|---:|"
} >"$LINKS_MD"
for link in "${LINKS[@]}"; do
  IFS='|' read -r label plan_rate tbf_rate algorithm <<<"$link"
  [[ -n ${PAYLOAD[$tbf_rate]:-} ]] && continue
  netns_shape "$tbf_rate" || die "cannot shape the link: $NETNS_ERROR"
  PAYLOAD[$tbf_rate]=$(payload_rate)
  shaping=none modelled="(the measured rate)"
  if [[ $tbf_rate != none ]]; then
    shaping="$tbf_rate, burst $(netns_burst "$tbf_rate") B"
    modelled=$(awk -v r="$plan_rate" 'BEGIN { v = r + 0; if (r ~ /Gbit/) v *= 1000;
      printf "%.1f Mbit/s", v * 1448 / 1538 }')
  fi
  measured=$(awk -v b="${PAYLOAD[$tbf_rate]}" 'BEGIN { printf "%.1f Mbit/s", b * 8e-6 }')
  echo "| $label | $shaping | $measured | $modelled |" >>"$LINKS_MD"
done
netns_shape none || die "cannot remove the link's qdisc: $NETNS_ERROR"
cat "$LINKS_MD"
for objective in "${OBJECTIVES[@]}"; do
  for link in "${LINKS[@]}"; do
    IFS='|' read -r label plan_rate tbf_rate algorithm <<<"$link"
    run=$objective-$tbf_rate${algorithm:+-$algorithm}
    options=()
    [[ $algorithm == ring ]] && options=("${RING[@]}")
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "$objective at $label (load average $load): two local replicas, two hosts, two local" \
      "replicas again"
    reference "$objective" "$run-reference-before"
    netns_shape "$tbf_rate" || die "cannot shape the link: $NETNS_ERROR"
    hosts "$objective" "$run" "${options[@]}"
    netns_shape none || die "cannot remove the link's qdisc: $NETNS_ERROR"
    reference "$objective" "$run-reference-after"
    link_args=(--link "$plan_rate")
    [[ $tbf_rate == none ]] && link_args=(--link "${PAYLOAD[none]}B/s" --mtu 0)
    plans=()
    for when in before after; do
      plans+=("$("$TALLY_BIN" plan --from "$OUT/$run-reference-$when" --nodes 2 \
        "${link_args[@]}" --latency "$LATENCY" --allreduce "${algorithm:-auto}" --json)")
      echo "${plans[-1]}" >"$OUT/$run.plan-$when.json"
    done
    step_p=$(predicted predicted_step_ms "${plans[@]}")
    serial_p=$(predicted predicted_step_ms_no_overlap "${plans[@]}")
    comm_p=$(predicted predicted_comm_ms "${plans[@]}")
    wait_p=$(predicted predicted_wait_ms "${plans[@]}")
    link_p=$(predicted predicted_link_ms "${plans[@]}")
    step_m=$(median "$run" step_ms)
    comm_m=$(median "$run" comm_ms)
    echo "| $objective | $label | $step_p / $step_m | $(error "$step_p" "$step_m") |" \
      "$serial_p | $(error "$serial_p" "$step_m") |" \
      "$comm_p / $comm_m | $(error "$comm_p" "$comm_m") |" >>"$TABLE"
    [[ $tbf_rate == none ]] && comm_m_unlimited=$comm_m
    ref_step=$(mean "$(median "$run-reference-before" step_ms)" \
      "$(median "$run-reference-after" step_ms)")
    ref_comm=$(mean "$(median "$run-reference-before" comm_ms)" \
      "$(median "$run-reference-after" comm_ms)")
    echo "| $objective | $label | $load | $(minus "$ref_step" "$ref_comm") /" \
      "$(minus "$step_m" "$comm_m") | $ref_comm | $link_p / $(minus "$comm_p" "$wait_p") |" \
      "$(minus "$comm_m" "$comm_m_unlimited") | $(minus "$step_m" "$ref_step") |" >>"$DIAG"
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
cat "$LINKS_MD"
echo
cat "$DIAG"
echo
cat "$TABLE"
