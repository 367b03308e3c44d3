#!/usr/bin/env bash
# Installs what Tally needs (Debian packages), then configures and builds it in ./build. Safe to
# run again: installed packages are skipped.
#
#   scripts/setup.sh              to build and train (scripts/train.sh)
#   scripts/setup.sh --for-tests  also what only tests need (scripts/test.sh): Chromium for the
#                                 report's browser test; PyTorch, NumPy, Pillow, torchvision and
#                                 venv for the interop tests (tally_torch, python/) and the photo
#                                 test; Valgrind for the memcheck test; iproute2 for the network
#                                 namespaces of the several-hosts test
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libdnnl-dev libstb-dev libcmocka-dev libinih-dev
          zlib1g-dev libjpeg62-turbo-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist)
test_packages=(chromium python3-torch python3-numpy python3-pil python3-torchvision python3-venv
               python3-setuptools valgrind iproute2)
for arg in "$@"; do
  case "$arg" in
    --for-tests) packages+=("${test_packages[@]}") ;;
    *)
      echo "usage: scripts/setup.sh [--for-tests]" >&2
      exit 2
      ;;
  esac
done

# Another package manager at work (unattended-upgrades on a fresh machine, a second setup) is
# waited for, up to this long, instead of failing at once.
lock_wait_s=600
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_get() {
  $SUDO env DEBIAN_FRONTEND=noninteractive LC_ALL=C \
    apt-get -q -o DPkg::Lock::Timeout="$lock_wait_s" "$@"
}

# DPkg::Lock::Timeout makes `install` wait for dpkg's lock, but apt (2.6, bookworm) ignores it
# for the package lists' lock that `update` takes: there, wait and try again.
update_package_lists() {
  local deadline=$((SECONDS + lock_wait_s)) err said=""
  until err=$(apt_get update 2>&1 >&3); do
    if [[ $err != *"Could not get lock"* ]] || ((SECONDS >= deadline)); then
      echo "$err" >&2
      return 1
    fi
    if [ -z "$said" ]; then
      echo "setup: waiting for another package manager to finish"
      said=1
    fi
    sleep 5
  done 3>&1
  [ -z "$err" ] || echo "$err" >&2
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  update_package_lists
  apt_get install -y "${missing[@]}"
fi

# The dataset's files are checked against data/fashion-mnist.sha256 the first time they are found
# (a stamp in build/ remembers it): a changed or damaged package is named, not trained on.
datasets=/usr/share/datasets/fashion-mnist
mkdir -p build
if [ -d "$datasets" ] && [ ! -e build/.fashion-mnist-verified ]; then
  if (cd "$datasets" && sha256sum --check --quiet "$OLDPWD/data/fashion-mnist.sha256"); then
    touch build/.fashion-mnist-verified
  else
    echo "setup: $datasets does not match data/fashion-mnist.sha256 (reinstall dataset-fashion-mnist)" >&2
    exit 1
  fi
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
