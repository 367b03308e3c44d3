#!/usr/bin/env bash
# torchvision's own convnext_tiny is Tally's models/convnext_tiny.ini: it trains 12 steps with
# AdamW on 256 Fashion-MNIST images framed in black to 32 px (its four stages need 32 or more)
# and made RGB, `tally export`, `tally embed` 32 of the images, then
# tests/interop/torchvision_convnext.py loads the export into torchvision.models.convnext_tiny()
# with strict=False (only classifier.2, the Linear, missing) and requires Tally's features within
# 1e-4 (relative to the largest) with classifier.2 = Identity. AdamW's steps move the layer
# scales off their 1e-6, so every block's branch reaches the features.
#
# Needs python3-torch and python3-torchvision under /usr/bin/python3 (PYTHON overrides it):
# without them the test is skipped (exit 77) and says which is missing, unless CI is set.
set -euo pipefail

cd "$(dirname "$0")/.."
TALLY_BIN=${TALLY_BIN:-build/tally}
PYTHON=${PYTHON:-/usr/bin/python3}
SOURCE=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz

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

IMAGES=$TMP/framed-images-idx3-ubyte
"$PYTHON" tests/interop/torchvision_convnext.py frame "$SOURCE" "$IMAGES" 256
run=$TMP/convnext_tiny
"$TALLY_BIN" train --objective=inbatch --set model.file=models/convnext_tiny.ini --steps 12 \
  --set data.train="$IMAGES" --set data.image_size=32 \
  --set data.channels=3 --set train.batch_size=16 --set optim.name=adamw --set optim.lr=0.01 \
  --no-knn --quiet --out "$run"
"$TALLY_BIN" export "$run" --out "$run/encoder.safetensors"
"$TALLY_BIN" embed "$run" --data "$IMAGES" --limit 32 --out "$run/run.npy"
"$PYTHON" tests/interop/torchvision_convnext.py check "$run/encoder.safetensors" "$run/run.npy" \
  "$IMAGES"
echo "OK: torchvision's convnext_tiny and tally_torch.load_export load Tally's export and give its features"
