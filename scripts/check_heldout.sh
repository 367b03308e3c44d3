#!/usr/bin/env bash
# Do the shipped recipes leave an encoder better than they found it on data they were not chosen
# on? Trains each recipe on scikit-learn's handwritten digits (1,797 scans of 8×8, upscaled to
# 28×28 PNGs; a seeded split of 1,297 to train and 500 held out) and prints, per recipe, kNN
# top-1 (k = 20) on the held-out images before and after training and a linear probe after one
# step and after training, as a Markdown table.
#   scripts/check_heldout.sh [--epochs N] [--set S.K=V]... [RECIPE...]
# RECIPE: inbatch, moco, mae, byol, vicreg, dino, barlow (default all), each with configs/RECIPE.ini; --set
# applies to every run (e.g. --set augment.flip_prob=0). Default 40 epochs (200 steps at batch
# 256). Needs a built tally (scripts/setup.sh); installs python3-sklearn and python3-pil with
# apt-get when missing. Data, run folders and table go under bench-results/<timestamp>-heldout/.
# Takes 10-15 minutes for all five on 2 cores. Exit codes: 0 done, 1 a run failed, 2 usage.
set -euo pipefail
cd "$(dirname "$0")/.."
die() {
  echo "check_heldout: $*" >&2
  exit 1
}

epochs=40
sets=()
recipes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=${2:?--epochs needs a number}; shift 2 ;;
    --set) sets+=(--set "${2:?--set needs S.K=V}"); shift 2 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_heldout: unknown option $1" >&2; exit 2 ;;
    *) recipes+=("$1"); shift ;;
  esac
done
[ ${#recipes[@]} -gt 0 ] || recipes=(inbatch moco mae byol vicreg dino barlow)
[ -x build/tally ] || die "build/tally is missing: run scripts/setup.sh first"
PY=/usr/bin/python3

if ! "$PY" -c 'import sklearn, PIL' 2> /dev/null; then
  echo "check_heldout: installing python3-sklearn and python3-pil"
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -o DPkg::Lock::Timeout=600 python3-sklearn python3-pil > /dev/null ||
    die "could not install python3-sklearn and python3-pil"
fi

out="bench-results/$(date +%Y%m%d-%H%M%S)-heldout"
mkdir -p "$out"
echo "check_heldout: writing the digits to $out/digits"
"$PY" - "$out/digits" << 'EOF'
import os, sys
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

root = sys.argv[1]
d = load_digits()
order = np.random.RandomState(0).permutation(len(d.target))
for split, idx in (("train", order[:1297]), ("test", order[1297:])):
    for i in idx:
        folder = os.path.join(root, split, str(d.target[i]))
        os.makedirs(folder, exist_ok=True)
        pixels = (d.images[i] * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels).resize((28, 28), Image.BILINEAR).save(os.path.join(folder, f"{i}.png"))
EOF

data=(--set data.format=imagefolder --set "data.train=$out/digits/train"
  --set "data.test=$out/digits/test" --set data.image_size=28 --set data.channels=1
  --set eval.knn_k=20)
field() { "$PY" -c "import json, sys; print('%.3f' % json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
rows=()
for r in "${recipes[@]}"; do
  [ -f "configs/$r.ini" ] || die "no recipe configs/$r.ini"
  echo "check_heldout: $r, one step, then $epochs epochs"
  build/tally train --objective="$r" "${data[@]}" "${sets[@]}" --steps 1 --knn-at-start \
    --out "$out/$r-step1" --quiet > "$out/$r-step1.log" 2>&1 || die "$r: see $out/$r-step1.log"
  build/tally train --objective="$r" "${data[@]}" "${sets[@]}" --epochs "$epochs" --knn-at-start \
    --out "$out/$r" --quiet > "$out/$r.log" 2>&1 || die "$r: see $out/$r.log"
  build/tally eval "$out/$r-step1" --linear --json > "$out/$r-step1.eval.json" || die "$r: eval failed"
  build/tally eval "$out/$r" --json > "$out/$r.eval.json" || die "$r: eval failed"
  untrained=$(printf '%.3f' "$(grep -m1 'untrained encoder' "$out/$r.log" | sed 's/.*: *\([0-9.]*\).*/\1/')")
  rows+=("| $r | $untrained → $(field "$out/$r.eval.json" knn_top1_k20) | $(field "$out/$r-step1.eval.json" linear_top1) → $(field "$out/$r.eval.json" linear_top1) |")
done

{
  echo "Held-out digits: 1,297 train / 500 test, $epochs epochs, ${sets[*]:-recipes as shipped}; raw pixels: kNN $(field "$out/${recipes[0]}.eval.json" knn_top1_raw_pixels), linear $(field "$out/${recipes[0]}.eval.json" linear_top1_raw_pixels)"
  echo
  echo "| recipe | kNN (k = 20): untrained → trained | linear probe: after one step → trained |"
  echo "| --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
