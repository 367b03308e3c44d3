#!/usr/bin/env bash
# Tally's exported encoders load in PyTorch and compute the same features.
#
# For each model file (resnet-small, resnet-small-32, vit-tiny, vit-tiny-mean): train 3 steps on
# 512 images, `tally export` the encoder (and again with --with-head), `tally embed` 64 test
# images (from the run and from the export), then tests/interop/roundtrip.py builds the network
# in PyTorch with the repository's tally_torch package (python/), loads each export with
# load_state_dict(strict=True) and requires
# max |torch - tally| <= 1e-4 over all 64 x D feature values.
#
# Needs Debian's python3-torch under /usr/bin/python3: without it the test is skipped (exit 77),
# unless CI is set, where a missing torch is a failure.
set -euo pipefail

cd "$(dirname "$0")/.."
TALLY_BIN=${TALLY_BIN:-build/tally}
PYTHON=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist
TEST_IMAGES=$DATA/t10k-images-idx3-ubyte.gz
N_IMAGES=64

if ! "$PYTHON" -c 'import torch, numpy' >/dev/null 2>&1; then
  if [[ -n "${CI+set}" ]]; then
    echo "FAILED: python3-torch is not installed (CI is set: a skip would hide the test)" >&2
    exit 1
  fi
  echo "SKIPPED: python3-torch is not installed"
  exit 77
fi
[[ -x "$TALLY_BIN" ]] || { echo "FAILED: TALLY_BIN=$TALLY_BIN is not an executable" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# name | model file | objective and recipe
CASES=(
  "resnet-small|models/resnet-small.ini|--objective=inbatch"
  "resnet-small-32|models/resnet-small-32.ini|--objective=inbatch"
  "vit-tiny|models/vit-tiny.ini|--objective=inbatch --config configs/inbatch-vit.ini"
  "vit-tiny-mean|models/vit-tiny-mean.ini|--objective=mae"
)

failures=0
for case in "${CASES[@]}"; do
  IFS='|' read -r name model objective <<<"$case"
  echo "== $name ($model, $objective)"
  run=$TMP/$name
  # shellcheck disable=SC2086  # $objective is several options
  "$TALLY_BIN" train $objective --set "model.file=$model" --steps 3 --set data.limit=512 \
    --set train.batch_size=64 --no-knn --quiet --out "$run"
  "$TALLY_BIN" export "$run" --out "$run/encoder.safetensors"
  "$TALLY_BIN" export "$run" --out "$run/with-head.safetensors" --with-head
  "$TALLY_BIN" embed "$run" --data "$TEST_IMAGES" --limit "$N_IMAGES" --out "$run/run.npy"
  "$TALLY_BIN" embed "$run/encoder.safetensors" --data "$TEST_IMAGES" --limit "$N_IMAGES" \
    --out "$run/export.npy"
  for check in "encoder.safetensors run.npy" "with-head.safetensors run.npy" \
               "encoder.safetensors export.npy"; do
    read -r export features <<<"$check"
    if ! "$PYTHON" tests/interop/roundtrip.py "$run/$export" "$run/$features" "$TEST_IMAGES"; then
      echo "FAILED: $name: $export against $features" >&2
      failures=$((failures + 1))
    fi
  done
done

if ((failures)); then
  echo "FAILED: $failures PyTorch round trip(s)" >&2
  exit 1
fi
echo "OK: every export loads strictly in PyTorch and matches Tally's features within 1e-4"
