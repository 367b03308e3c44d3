#!/usr/bin/env bash
# The whole suite on Debian 13 (trixie: oneDNN 3.7, Open MPI 5, gcc 14), installed as a user would
# install it: a minimal root made with debootstrap from Debian's packages, the checkout's tracked
# files copied in, then the project's own scripts/test.sh inside it (scripts/setup.sh --for-tests,
# the build, ctest). Needs root (debootstrap, chroot, mounts).
#
#   scripts/test-debian13.sh [CTEST ARGS...]      e.g. -L fast, or -R 'ops|vit'
#
# The root is cached outside the clone and reused: TALLY_DEBIAN13_ROOT, by default
# ~/.cache/tally/debian13 (made and mounted by scripts/lib-debian13.sh, which scripts/bench.sh
# shares; a root that is already mounted is used and left mounted). Packages installed by setup.sh
# stay in it, and so does its build/ (the next run builds incrementally); delete ROOT to start over.
# Prints the time each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."

copy=/opt/tally # the checkout, inside the root (where every user can read it: tests run as nobody)

# Tests left out in the root, as "NAME|why": printed, then excluded from ctest. Every test can run
# here (the network namespaces of test_multihost work once the root is a mount point, below); the
# benchmark's check is left out because the host's suite runs it with PyTorch 2.6 in this root.
skipped_in_root=(
  "test_bench_quick|the host's suite runs it with PyTorch 2.6 in this very root; here it would repeat its four torch.compile builds (10 minutes or more) for no new check"
)

if [ "$(id -u)" -ne 0 ]; then
  echo "test-debian13: needs root (debootstrap, chroot and mounts); try sudo $0" >&2
  exit 2
fi

# shellcheck source=scripts/lib-debian13.sh
. scripts/lib-debian13.sh

phase_start=$SECONDS
phase_done() { echo "test-debian13: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

if [ ! -d "$DEBIAN13_ROOT" ]; then
  debian13_make_root
  phase_done "debootstrap"
fi

# Mounted for the run (or used as it is when already mounted) and released on any exit.
trap debian13_release EXIT
debian13_mount

# The tracked files as they are in the work tree (not the host's build/); the root's own build/
# is kept between runs.
debian13_copy_tree "$copy"

in_root() { debian13_run "$copy" "$@"; }

in_root "scripts/setup.sh --for-tests"
phase_done "setup (packages and build)"

exclude="" ctest_args=()
for entry in "${skipped_in_root[@]}"; do
  echo "test-debian13: SKIPPED ${entry%%|*}: ${entry#*|}"
  exclude+="${exclude:+|}^${entry%%|*}\$"
done
[ -z "$exclude" ] || ctest_args=(-E "$exclude")
status=0
in_root 'scripts/test.sh "$@"' "${ctest_args[@]}" "$@" || status=$?
phase_done "tests"
exit "$status"
