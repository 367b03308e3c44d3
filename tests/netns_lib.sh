# shellcheck shell=bash
# Two "machines" on this box for Open MPI over real TCP, sourced by tests/test_multihost.sh and
# scripts/validate_scaling.sh: two network namespaces joined by a veth pair whose addresses exist
# only inside them, a hostfile of the two, and tests/netns_rsh.sh as mpirun's rsh agent (it
# enters the namespace of an address). Every namespace shares this machine's filesystem, so the
# binary, the data and the run folder have the same paths on both "hosts".
#
#   netns_create NAME NET HOSTFILE   e.g. netns_create "tally-mh$$" 10.77.0 "$TMP/hosts"
#       Creates namespaces NAME-a and NAME-b (NETNS_A, NETNS_B), the veth pair NETNS_IF between
#       them with NET.1 and NET.2 (NETNS_ADDR_A, NETNS_ADDR_B; NETNS_SUBNET is NET.0/24), writes
#       HOSTFILE (one slot per host), exports NETNS_RSH_MAP for the agent and sets NETNS_MPIRUN.
#       Returns 0; 1 when this machine cannot make namespaces or a veth pair (a test skips), or
#       2 when it made them but cannot configure them (a failure); NETNS_ERROR says why. What
#       it made is in NETNS_NAMESPACES, so netns_release removes it whatever happened.
#   "${NETNS_MPIRUN[@]}" [MPIRUN OPTIONS...] PROGRAM ARGS...
#       mpirun ($MPIRUN, set by the caller) started inside NETNS_A: one rank per host, TCP only
#       (btl tcp,self), MPI and mpirun's own traffic both restricted to the veth subnet (left to
#       itself Open MPI may pick any interface, and hang on one the other host cannot reach),
#       ranks not bound to cores (the hosts share this machine's); give each rank its threads.
#   netns_shape RATE      tbf at RATE (tc's units: 100mbit, 1gbit) on both ends of the pair, or
#                         none: no qdisc. Bursts of 1 ms of RATE (at least NETNS_TBF_BURST_MIN)
#                         pass at line rate; the queue holds NETNS_TBF_LATENCY of traffic before
#                         tbf drops packets.
#   netns_kill            kills every process left in the namespaces (a stray orted or tally).
#   netns_release         netns_kill, then deletes the namespaces; the veth pair and its qdiscs
#                         go with them.
# Every ip and tc command is bounded by NETNS_TIMEOUT seconds.
# shellcheck disable=SC2034  # NETNS_* are read by the scripts that source this

NETNS_TIMEOUT=${NETNS_TIMEOUT:-10}
NETNS_IF=tally0
# tbf hands out its tokens when its timer fires, so a bucket smaller than the rate's worth of a
# timer's lateness caps the rate: with 32 kB at 1gbit, TCP moved 740 Mbit/s of payload; with 1 ms
# of the rate (125 kB) 949, what 1448 payload bytes in each 1514-byte frame tbf counts allow. At
# 100mbit 32 kB (2.6 ms) is enough, and a small part of a step's megabytes.
NETNS_TBF_BURST_MIN=32768
NETNS_TBF_LATENCY=50ms
NETNS_NAMESPACES=()
NETNS_ERROR=""
NETNS_AGENT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netns_rsh.sh"

# netns_run ARGS...: ARGS under the timeout, stderr kept for NETNS_ERROR.
netns_run() {
  local err
  if ! err=$(timeout "$NETNS_TIMEOUT" "$@" 2>&1 >/dev/null); then
    NETNS_ERROR="$*: ${err:0:200}"
    return 1
  fi
}

netns_create() {
  local name=$1 net=$2 hostfile=$3 ns
  NETNS_A=$name-a
  NETNS_B=$name-b
  NETNS_ADDR_A=$net.1
  NETNS_ADDR_B=$net.2
  NETNS_SUBNET=$net.0/24
  for ns in "$NETNS_A" "$NETNS_B"; do
    netns_run ip netns add "$ns" || return 1
    NETNS_NAMESPACES+=("$ns")
  done
  # The pair is created with its ends already in the namespaces: nothing in the host's own.
  netns_run ip link add name "$NETNS_IF" netns "$NETNS_A" type veth peer name "$NETNS_IF" \
    netns "$NETNS_B" || return 1
  netns_run ip -n "$NETNS_A" addr add "$NETNS_ADDR_A/24" dev "$NETNS_IF" || return 2
  netns_run ip -n "$NETNS_B" addr add "$NETNS_ADDR_B/24" dev "$NETNS_IF" || return 2
  for ns in "$NETNS_A" "$NETNS_B"; do
    netns_run ip -n "$ns" link set lo up || return 2
    netns_run ip -n "$ns" link set "$NETNS_IF" up || return 2
  done
  printf '%s slots=1\n%s slots=1\n' "$NETNS_ADDR_A" "$NETNS_ADDR_B" >"$hostfile" || {
    NETNS_ERROR="cannot write $hostfile"
    return 2
  }
  export NETNS_RSH_MAP="$NETNS_ADDR_A=$NETNS_A $NETNS_ADDR_B=$NETNS_B"
  # shellcheck disable=SC2054  # tcp,self is one word
  # --bind-to none: each "host" would bind its rank to its own first core, and both firsts are
  # this machine's core 0 (two ranks on one core, every step twice as long). coll ^han: Open MPI
  # 5 chooses its hierarchical collectives by default, and with these two "hosts" (one machine,
  # one hostname) their MPI_Allreduce fails (MPI_ERR_TRUNCATE); 4.1 chose the flat ones.
  NETNS_MPIRUN=(ip netns exec "$NETNS_A" "$MPIRUN" --allow-run-as-root
    --hostfile "$hostfile" -np 2 --map-by node --bind-to none
    --mca plm_rsh_agent "bash $NETNS_AGENT"
    --mca btl tcp,self --mca btl_tcp_if_include "$NETNS_SUBNET"
    --mca oob_tcp_if_include "$NETNS_SUBNET" --mca coll ^han)
}

# netns_burst RATE: tbf's bucket for RATE (a number and kbit, mbit or gbit), bytes: 1 ms of it,
# at least NETNS_TBF_BURST_MIN. Returns 1 for any other unit.
netns_burst() {
  [[ ${1,,} =~ ^[0-9]+(\.[0-9]+)?[kmg]bit$ ]] || return 1
  awk -v rate="${1,,}" -v least="$NETNS_TBF_BURST_MIN" 'BEGIN {
    bits = rate + 0
    if (rate ~ /gbit$/) bits *= 1e9; else if (rate ~ /mbit$/) bits *= 1e6; else bits *= 1e3;
    b = int(bits / 8 / 1000); printf "%d", (b > least ? b : least) }'
}

netns_shape() {
  local ns burst
  for ns in "$NETNS_A" "$NETNS_B"; do
    timeout "$NETNS_TIMEOUT" tc -n "$ns" qdisc del dev "$NETNS_IF" root 2>/dev/null || true
    if [[ $1 != none ]]; then
      burst=$(netns_burst "$1") || {
        NETNS_ERROR="netns_shape $1: expected a rate in kbit, mbit or gbit"
        return 1
      }
      # overhead 24: a wire also carries each frame's preamble, gap and checksum, which tbf
      # would not count, so that RATE is a line rate like an Ethernet link's.
      netns_run tc -n "$ns" qdisc add dev "$NETNS_IF" root tbf rate "$1" \
        burst "$burst" latency "$NETNS_TBF_LATENCY" overhead 24 || return 1
    fi
  done
}

netns_kill() {
  local ns pids
  for ns in "${NETNS_NAMESPACES[@]}"; do
    pids=$(timeout "$NETNS_TIMEOUT" ip netns pids "$ns" 2>/dev/null)
    # shellcheck disable=SC2086  # one pid a word
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  done
}

netns_release() {
  local ns
  netns_kill
  for ns in "${NETNS_NAMESPACES[@]}"; do
    timeout "$NETNS_TIMEOUT" ip netns del "$ns" 2>/dev/null || true
  done
  NETNS_NAMESPACES=()
}
