# shellcheck shell=bash
# Sourced by the shell tests that run Tally as a user would (tests/test_faults.sh,
# tests/test_multihost.sh): it moves to the project root, finds the binary, makes a temp dir that
# goes on any exit, and keeps the `ok - NAME` / `not ok - NAME: why` tally of the checks.
#
# Sets ROOT, TALLY_BIN (absolute; build/tally unless set), LIMIT and TMP. A script that holds more
# than TMP (mounts, namespaces, runs in the background) defines release(), which runs first on
# exit. Without an executable TALLY_BIN it fails the setup (exit 1) before anything is made.

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
TALLY_BIN=${TALLY_BIN:-build/tally}
case $TALLY_BIN in /*) ;; *) TALLY_BIN=$ROOT/$TALLY_BIN ;; esac
# shellcheck disable=SC2034  # used by the scripts that source this
LIMIT=120  # seconds for any one tally (or mpirun) call

# setup_fail WHY: the test cannot run here; a failure.
setup_fail() {
  echo "not ok - setup: $1"
  echo "0 passed, 1 failed"
  exit 1
}

# skip_or_fail WHY: what the test needs is missing: a skip (exit 77), unless CI is set, where a
# skip would hide the test and so is a failure.
skip_or_fail() {
  if [[ -n ${CI+set} ]]; then
    echo "not ok - setup: $1 (CI is set: a skip would hide the test)"
    echo "0 passed, 1 failed"
    exit 1
  fi
  echo "SKIPPED: $1"
  exit 77
}

[[ -x $TALLY_BIN ]] || setup_fail "TALLY_BIN=$TALLY_BIN is not an executable"

TMP=$(mktemp -d)
cleanup() {
  if declare -F release >/dev/null; then release; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

passed=0
failed=0
why=""

# bad WHY: the check under way fails, for this reason (among others).
bad() { why+="${why:+; }$*"; }

# finish NAME: reports the check from $why (empty: ok) and resets it.
finish() {
  if [[ -z $why ]]; then
    echo "ok - $1"
    passed=$((passed + 1))
  else
    echo "not ok - $1: $why"
    failed=$((failed + 1))
  fi
  why=""
}

# firstline FILE: the first non-empty line of FILE, shortened, for a failure message.
firstline() {
  local l
  l=$(grep -m1 -v '^[[:space:]-]*$' "$1" 2>/dev/null | cut -c1-160)
  printf '%s' "${l:-<no output>}"
}

# totals: prints the counts; as the script's last command, its exit code (1 if a check failed).
totals() {
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
