#!/usr/bin/env bash
# An rsh agent for Open MPI that "logs in" to a host by entering its network namespace, so that
# network namespaces on one machine stand in for several machines (tests/test_multihost.sh).
#
#   NETNS_RSH_MAP="10.77.0.1=ns-a 10.77.0.2=ns-b" \
#     ip netns exec ns-a mpirun --mca plm_rsh_agent tests/netns_rsh.sh --hostfile hosts ...
#
# Open MPI calls the agent as ssh: `AGENT [options] HOST COMMAND...`, where COMMAND is a shell
# command line (it starts orted with its arguments quoted for a remote shell), so it runs under
# `sh -c` inside the namespace HOST maps to. Every namespace shares this machine's filesystem,
# so the binary, the data and the run folder have the same paths on every "host". A host that is
# not in NETNS_RSH_MAP is an error: this agent never reaches any other machine.
set -u

# ssh-style options before the host (Open MPI passes none by default; skip any that come).
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -l | -p | -o | -i | -F) shift 2 ;;
    *) shift ;;
  esac
done
if [[ $# -lt 2 ]]; then
  echo "netns_rsh: usage: netns_rsh.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift

ns=""
for pair in ${NETNS_RSH_MAP:-}; do
  if [[ ${pair%%=*} == "$host" ]]; then
    ns=${pair#*=}
    break
  fi
done
if [[ -z $ns ]]; then
  echo "netns_rsh: host '$host' is not in NETNS_RSH_MAP ('${NETNS_RSH_MAP:-}')" >&2
  exit 255
fi
exec ip netns exec "$ns" /bin/sh -c "$*"
