#!/usr/bin/env bash
# The whole suite on Debian 13 (trixie: oneDNN 3.7, Open MPI 5, gcc 14), installed as a user would
# install it: a minimal root made with debootstrap from Debian's packages, the checkout's tracked
# files copied in, then the project's own scripts/test.sh inside it (scripts/setup.sh --for-tests,
# the build, ctest). Needs root (debootstrap, chroot, mounts).
#
#   scripts/test-debian13.sh [CTEST ARGS...]      e.g. -L fast, or -R 'ops|vit'
#
# The root is cached outside the clone and reused: TALLY_DEBIAN13_ROOT, by default
# ~/.cache/tally/debian13. It is made in ROOT.partial and renamed only when debootstrap succeeds,
# so an interrupted run leaves nothing that passes for a root. Packages installed by setup.sh stay
# in it, and so does its build/ (the next run builds incrementally); delete ROOT to start over.
# Prints the time each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."

root=${TALLY_DEBIAN13_ROOT:-$HOME/.cache/tally/debian13}
mirror=${TALLY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
copy=/opt/tally # the checkout, inside the root (where every user can read it: tests run as nobody)

# Tests that cannot run in the root, as "NAME|why": printed, then excluded from ctest. None today:
# the network namespaces of test_multihost work once the root is a mount point (below).
skipped_in_root=()

if [ "$(id -u)" -ne 0 ]; then
  echo "test-debian13: needs root (debootstrap, chroot and mounts); try sudo $0" >&2
  exit 2
fi

phase_start=$SECONDS
phase_done() { echo "test-debian13: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

if [ ! -d "$root" ]; then
  if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get -q update
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y debootstrap
  fi
  rm -rf "$root.partial"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase trixie "$root.partial" "$mirror"
  mv "$root.partial" "$root"
  phase_done "debootstrap"
fi

# The root as a mount of its own (so that inside it / is a mount point, which `ip netns exec`
# needs to make it a slave before it remounts /sys), with /proc, /sys and /dev (with /dev/pts and
# /dev/shm, Open MPI's shared memory) under it; all of it unmounted on any exit. rslave: unmounts
# inside the root (and any mount a test makes there) never reach the host's /dev or /sys.
release() {
  if mountpoint -q "$root"; then umount -R "$root" || umount -lR "$root"; fi
}
trap release EXIT
release
mount --bind "$root" "$root"
mount --make-private "$root"
mount -t proc proc "$root/proc"
for dir in /sys /dev; do
  mount --rbind "$dir" "$root$dir"
  mount --make-rslave "$root$dir"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"

# The tracked files as they are in the work tree (not the host's build/); the root's own build/
# is kept between runs. Extracted with the time of extraction (-m), not the work tree's: a file
# older than an object the root built from another checkout would otherwise not be rebuilt.
mkdir -p "$root$copy"
find "$root$copy" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
git ls-files -z | tar --null --ignore-failed-read -T - -cf - | tar -C "$root$copy" -m -xf -

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${CI+CI="$CI"} \
    /bin/bash -c "cd $copy && $1" bash "${@:2}"
}

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
