#!/usr/bin/env bash
# torchvision's own resnet18 and resnet50 are Tally's models/resnet18.ini and models/resnet50.ini
# (the ImageNet stem, basic and bottleneck blocks): each trains 24 steps on 384 Fashion-MNIST
# images made RGB (at 28 px: the networks' geometry, not their intended image size; 24 steps
# bring BatchNorm's running statistics near the batches', which after 2 steps leave the
# evaluated features at 1e17), `tally export`, `tally embed` 32 test images, then
# tests/interop/torchvision_resnet.py loads the export into torchvision.models.NAME() with
# strict=False (only fc missing) and requires Tally's features
# within 1e-4 (relative to the largest) with fc = Identity.
#
# Needs python3-torch and python3-torchvision under /usr/bin/python3: without them the test is
# skipped (exit 77) and says which is missing, unless CI is set, where that is a failure.
set -euo pipefail

cd "$(dirname "$0")/.."
TALLY_BIN=${TALLY_BIN:-build/tally}
PYTHON=/usr/bin/python3
TEST_IMAGES=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz

for module in torch torchvision numpy; do
  if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then
    if [[ -n "${CI+set}" ]]; then
      echo "FAILED: $PYTHON cannot import $module (CI is set: a skip would hide the test)" >&2
      exit 1
    fi
    echo "SKIPPED: $PYTHON cannot import $module (python3-$module is not installed)"
    exit 77
  fi
done
[[ -x "$TALLY_BIN" ]] || { echo "FAILED: TALLY_BIN=$TALLY_BIN is not an executable" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

failures=0
for name in resnet18 resnet50; do
  echo "== $name (models/$name.ini)"
  run=$TMP/$name
  "$TALLY_BIN" train --objective=inbatch --set "model.file=models/$name.ini" --steps 24 \
    --set data.limit=384 --set data.channels=3 --set train.batch_size=16 --no-knn --quiet \
    --out "$run"
  "$TALLY_BIN" export "$run" --out "$run/encoder.safetensors"
  "$TALLY_BIN" embed "$run" --data "$TEST_IMAGES" --limit 32 --out "$run/run.npy"
  if ! "$PYTHON" tests/interop/torchvision_resnet.py "$name" "$run/encoder.safetensors" \
      "$run/run.npy" "$TEST_IMAGES"; then
    echo "FAILED: $name" >&2
    failures=$((failures + 1))
  fi
done

if ((failures)); then
  echo "FAILED: $failures torchvision model(s)" >&2
  exit 1
fi
echo "OK: torchvision's resnet18 and resnet50 load Tally's exports (only fc missing) and give its features"
