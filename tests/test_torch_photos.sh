#!/usr/bin/env bash
# The way out for a folder of photos: the tally_torch package (python/) installs offline, loads
# an export of the photo recipe and reproduces `tally embed` on image files.
#
# tests/interop/make_photos.py writes 12 files (7 JPEGs from 97 to 1030 px a side, decoded by
# Tally at 1/1 to 1/8; PNGs and a BMP, palette and alpha among them). For the photo recipe
# (configs/photos/moco.ini, ResNet-18 for small images, 64 px), at its own settings, in gray
# (data.channels = 1) and held in memory (data.stream = 0, the image squashed to the view):
# train a step, `tally export`, `tally embed` the folder, then tests/interop/photos.py loads the
# export with the package, has it decode and crop every file itself, and requires
# max |torch - tally| <= 1e-4 over every feature value. The RGB case also loads the export into
# torchvision's resnet18 (small-image stem) strictly and requires the same features, or, where
# python3-torchvision is not installed, holds the converted names to resnet18's.
#
# Then the package is installed as the README says (a venv over Debian's packages, pip with
# --no-build-isolation --no-deps, no index) and the RGB check runs again on the installed copy.
#
# Needs Debian's python3-torch, python3-numpy and python3-pil under /usr/bin/python3: without
# them the test is skipped (exit 77), unless CI is set, where they (and python3-torchvision and
# python3-venv) are required.
set -euo pipefail

cd "$(dirname "$0")/.."
TALLY_BIN=${TALLY_BIN:-build/tally}
PYTHON=/usr/bin/python3
REPO=$PWD

missing() {
  if [[ -n "${CI+set}" ]]; then
    echo "FAILED: $1 (CI is set: a skip would hide the test)" >&2
    exit 1
  fi
  echo "SKIPPED: $1"
  exit 77
}
"$PYTHON" -c 'import torch, numpy, PIL' >/dev/null 2>&1 ||
  missing "python3-torch, python3-numpy or python3-pil is not installed"
[[ -x "$TALLY_BIN" ]] || { echo "FAILED: TALLY_BIN=$TALLY_BIN is not an executable" >&2; exit 1; }
if "$PYTHON" -c 'import torchvision' >/dev/null 2>&1; then
  torchvision=--torchvision
elif [[ -n "${CI+set}" ]]; then
  echo "FAILED: python3-torchvision is not installed (CI is set)" >&2
  exit 1
else
  torchvision=--torchvision-names
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PHOTOS=$TMP/photos
"$PYTHON" tests/interop/make_photos.py "$PHOTOS"

# name | settings beside the photo recipe's | checks beside the features
CASES=(
  "rgb||$torchvision"
  "gray|--set data.channels=1|"
  "squash|--set data.stream=0|"
)

failures=0
for case in "${CASES[@]}"; do
  IFS='|' read -r name settings checks <<<"$case"
  echo "== $name (configs/photos/moco.ini $settings)"
  run=$TMP/$name
  # shellcheck disable=SC2086  # $settings is several options
  "$TALLY_BIN" train --objective=moco --config configs/photos/moco.ini --data "$PHOTOS" $settings \
    --steps 1 --set train.batch_size=8 --no-knn --quiet --out "$run"
  "$TALLY_BIN" export "$run" --out "$run/encoder.safetensors"
  "$TALLY_BIN" embed "$run/encoder.safetensors" --data "$PHOTOS" --out "$run/features.npy"
  # shellcheck disable=SC2086  # $checks is empty or one option
  if ! "$PYTHON" tests/interop/photos.py "$run/encoder.safetensors" "$run/features.npy" \
      "$PHOTOS" $checks; then
    echo "FAILED: $name" >&2
    failures=$((failures + 1))
  fi
done

echo "== installed: a venv over Debian's packages, pip install --no-build-isolation --no-deps"
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  [[ -n "${CI+set}" ]] && { echo "FAILED: python3-venv is not installed (CI is set)" >&2; exit 1; }
  echo "skipped: python3-venv is not installed"
else
  # A copy: pip's build leaves build/ and *.egg-info beside the sources it builds.
  cp -r python "$TMP/python"
  "$PYTHON" -m venv --system-site-packages "$TMP/venv"
  PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$TMP/venv/bin/pip" install --quiet \
    --no-build-isolation --no-deps "$TMP/python"
  where=$(cd "$TMP" && "$TMP/venv/bin/python" -c 'import tally_torch; print(tally_torch.__file__)')
  if [[ $where != "$TMP/venv/"* ]]; then
    echo "FAILED: the venv imports tally_torch from $where, not from its install" >&2
    failures=$((failures + 1))
  elif ! (cd "$TMP" && TALLY_TORCH_INSTALLED=1 "$TMP/venv/bin/python" \
      "$REPO/tests/interop/photos.py" "$TMP/rgb/encoder.safetensors" "$TMP/rgb/features.npy" \
      "$PHOTOS"); then
    echo "FAILED: the installed package" >&2
    failures=$((failures + 1))
  fi
fi

if ((failures)); then
  echo "FAILED: $failures photo check(s)" >&2
  exit 1
fi
echo "OK: tally_torch installs offline and reproduces tally embed on JPEG, PNG and BMP files within 1e-4"
