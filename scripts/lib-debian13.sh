# shellcheck shell=bash
# Sourced by the scripts that work in the Debian 13 (trixie) root: scripts/test-debian13.sh (the
# suite there) and scripts/bench.sh (PyTorch 2.6 as the anchor, Tally on both stacks).
#
# The root is a minimal debootstrap of Debian's packages, cached outside the clone and reused:
# TALLY_DEBIAN13_ROOT, by default ~/.cache/tally/debian13. It is made in ROOT.partial and renamed
# only when debootstrap succeeds, so an interrupted run leaves nothing that passes for a root.
#
#   debian13_make_root          debootstrap the root if it does not exist (needs root, network)
#   debian13_mount              the root as a mount of its own with /proc, /sys and /dev under it;
#                               if it is a mount point already (another script holds it), it is
#                               used as it is and left mounted
#   debian13_release            unmounts what debian13_mount mounted, and nothing else
#   debian13_copy_tree DIR      the tracked files as they are in the work tree into ROOT/DIR
#                               (its build/ is kept: the next build there is incremental)
#   debian13_run DIR CMD ARGS   runs the bash command CMD (with ARGS as $1...) in the root, in DIR,
#                               with a clean environment
#   "${DEBIAN13_CHROOT[@]}" [VAR=value...] COMMAND...
#                               the same clean environment as a command line, for a program that
#                               runs a command itself (the benchmark's measuring wrapper)

DEBIAN13_ROOT=${TALLY_DEBIAN13_ROOT:-$HOME/.cache/tally/debian13}
DEBIAN13_MIRROR=${TALLY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN13_MOUNTED_HERE=0
DEBIAN13_CHROOT=(chroot "$DEBIAN13_ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}"
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${CI+CI="$CI"})

debian13_make_root() {
  [ -d "$DEBIAN13_ROOT" ] && return 0
  if ! command -v debootstrap > /dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get -q update
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y debootstrap
  fi
  rm -rf "$DEBIAN13_ROOT.partial"
  mkdir -p "$(dirname "$DEBIAN13_ROOT")"
  debootstrap --variant=minbase trixie "$DEBIAN13_ROOT.partial" "$DEBIAN13_MIRROR"
  mv "$DEBIAN13_ROOT.partial" "$DEBIAN13_ROOT"
}

# The root as a mount of its own (so that inside it / is a mount point, which `ip netns exec`
# needs to make it a slave before it remounts /sys), with /proc, /sys and /dev (with /dev/pts and
# /dev/shm, Open MPI's shared memory) under it. rslave: unmounts inside the root (and any mount a
# test makes there) never reach the host's /dev or /sys. A root already mounted belongs to whoever
# mounted it: it is used, and debian13_release leaves it alone.
debian13_mount() {
  if mountpoint -q "$DEBIAN13_ROOT"; then
    [ -r "$DEBIAN13_ROOT/proc/self/status" ] ||
      echo "debian13: $DEBIAN13_ROOT is mounted but has no /proc under it" >&2
  else
    DEBIAN13_MOUNTED_HERE=1
    mount --bind "$DEBIAN13_ROOT" "$DEBIAN13_ROOT"
    mount --make-private "$DEBIAN13_ROOT"
    mount -t proc proc "$DEBIAN13_ROOT/proc"
    local dir
    for dir in /sys /dev; do
      mount --rbind "$dir" "$DEBIAN13_ROOT$dir"
      mount --make-rslave "$DEBIAN13_ROOT$dir"
    done
  fi
  cp /etc/resolv.conf "$DEBIAN13_ROOT/etc/resolv.conf"
}

debian13_release() {
  [ "$DEBIAN13_MOUNTED_HERE" -eq 1 ] || return 0
  if mountpoint -q "$DEBIAN13_ROOT"; then
    umount -R "$DEBIAN13_ROOT" || umount -lR "$DEBIAN13_ROOT"
  fi
  DEBIAN13_MOUNTED_HERE=0
}

# Extracted with the time of extraction (-m), not the work tree's: a file older than an object
# the root built from another checkout would otherwise not be rebuilt.
debian13_copy_tree() {
  local dest=$DEBIAN13_ROOT$1
  mkdir -p "$dest"
  find "$dest" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
  git ls-files -z | tar --null --ignore-failed-read -T - -cf - | tar -C "$dest" -m -xf -
}

debian13_run() {
  local dir=$1 cmd=$2
  shift 2
  "${DEBIAN13_CHROOT[@]}" /bin/bash -c "cd $dir && $cmd" bash "$@"
}
