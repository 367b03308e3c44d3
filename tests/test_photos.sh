#!/usr/bin/env bash
# The photo user's path, end to end, with the shipped photo recipes (configs/photos/*.ini, the
# data/photos.ini descriptor) on a folder of JPEG photos without labels: made here of smooth
# colour fields, shapes and sensor-like noise at several sizes and aspect ratios, some in
# subfolders that are not classes (2023/, 2024/trip/), one grayscale, one PNG.
#   1 tally plan of every photo recipe succeeds; --time states the run's expected time
#   2 tally train, tally eval RUN (label-free: rankme, embedding_std, no kNN), tally report,
#     tally export
#   3 tally eval with a labeled folder given on the command line scores kNN and the probe
#   4 tally compare of three objectives with --data the folder: each objective's photo recipe,
#     a compare.json whose accuracies are null and a verdict that says why
# Needs Python's PIL (python3-pil) to write the photos: skipped without it, unless CI is set.
source "$(dirname "$0")/lib.sh"

/usr/bin/python3 -c 'import PIL' 2>/dev/null || skip_or_fail "python3-pil is not installed"

PHOTOS=$TMP/photos
LABELED=$TMP/labeled
/usr/bin/python3 - "$PHOTOS" "$LABELED" <<'PY' || setup_fail "could not write the photos"
import os, random, sys
from PIL import Image, ImageDraw, ImageFilter
photos, labeled = sys.argv[1:]
rng = random.Random(7)
def photo(w, h, warm):
    base = [rng.randrange(60, 200) for _ in range(3)]
    if warm: base[0], base[2] = max(base), min(base)
    im = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    im = Image.blend(im, Image.new("RGB", (w, h), tuple(base)), 0.7)
    d = ImageDraw.Draw(im)
    for _ in range(rng.randrange(2, 6)):
        x, y = rng.randrange(w), rng.randrange(h)
        r = rng.randrange(8, max(9, min(w, h) // 2))
        c = tuple(rng.randrange(256) for _ in range(3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x - r, y - r, x + r, y + r], fill=c)
    im = im.filter(ImageFilter.GaussianBlur(1.2))
    noise = Image.effect_noise((w, h), 12).convert("RGB")
    return Image.blend(im, noise, 0.08)
sizes = [(160, 120), (120, 160), (128, 128), (200, 150), (96, 96), (150, 100)]
places = ["", "2023", os.path.join("2024", "trip")]
for i in range(36):
    folder = os.path.join(photos, places[i % 3])
    os.makedirs(folder, exist_ok=True)
    photo(*sizes[i % len(sizes)], i % 2).save(os.path.join(folder, f"IMG_{i:04d}.jpg"), quality=88)
photo(128, 96, 0).convert("L").save(os.path.join(photos, "IMG_gray.jpg"), quality=90)
photo(100, 100, 1).save(os.path.join(photos, "2023", "screenshot.png"))
# A labeled folder: warm and cool photos in class subfolders, for the labeled evaluation.
for split, n in (("train", 24), ("test", 12)):
    for i in range(n):
        cls = "warm" if i % 2 else "cool"
        folder = os.path.join(labeled, split, cls)
        os.makedirs(folder, exist_ok=True)
        photo(*sizes[i % len(sizes)], i % 2).save(os.path.join(folder, f"{i:03d}.jpg"), quality=88)
PY

# run LABEL ARGS...: tally under the timeout, output in $TMP/LABEL.out/.err; sets rc.
run() {
  local label=$1
  shift
  { timeout "$LIMIT" "$TALLY_BIN" "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"; rc=$?; } 2>/dev/null
}

# The recipes as shipped, made smaller only: 32x32 views, a small batch and two steps (a
# ResNet-18 step at 64x64 takes seconds on two cores).
SHORT=(--set data.image_size=32 --set train.batch_size=8 --set train.steps=2)

name="1 tally plan of every photo recipe; too few photos for a batch named; --time states the expected time"
run plan-small plan --objective=moco --config configs/photos/moco.ini --data "$PHOTOS"
[[ $rc == 1 ]] && grep -q "fewer than one batch of 64 (give a smaller batch" "$TMP/plan-small.err" ||
  bad "38 photos and a batch of 64: exit $rc, $(firstline "$TMP/plan-small.err")"
for recipe in configs/photos/*.ini; do
  o=$(basename "$recipe" .ini)
  run plan-$o plan --objective=$o --config configs/photos/$o.ini --data "$PHOTOS" --batch-size 16
  [[ $rc == 0 ]] || bad "plan $o exited $rc: $(firstline "$TMP/plan-$o.err")"
done
grep -qE "images \(train/test\) +38/0" "$TMP/plan-moco.out" ||
  bad "the plan does not count 38 photos: $(grep 'images' "$TMP/plan-moco.out")"
run plan-time plan --objective=moco --config configs/photos/moco.ini --data "$PHOTOS" "${SHORT[@]}" --time
[[ $rc == 0 ]] || bad "plan --time exited $rc: $(firstline "$TMP/plan-time.err")"
grep -qE "the run's steps at that pace +[0-9.]+ [a-z]+ \([0-9.]+ [a-z]+-[0-9.]+ [a-z]+\)" "$TMP/plan-time.out" ||
  bad "plan --time states no time for the run"
finish "$name"

name="2 train, eval (label-free), report, export"
R=$TMP/run
run train train --objective=moco --config configs/photos/moco.ini --data "$PHOTOS" --out "$R" "${SHORT[@]}"
[[ $rc == 0 ]] || bad "train exited $rc: $(firstline "$TMP/train.err")"
run eval eval "$R" --json --set eval.batch_size=8
[[ $rc == 0 ]] || bad "eval exited $rc: $(firstline "$TMP/eval.err")"
/usr/bin/python3 - "$TMP/eval.out" <<'PY' || bad "eval --json: $(tail -1 "$TMP/eval.check")"
import json, math, sys
e = json.loads(open(sys.argv[1]).read())
assert e["n_train"] == 38 and e["n_classes"] == 0, e
assert e["knn_top1"] is None and e["linear_top1"] is None, e
assert math.isfinite(e["rankme"]) and 1 <= e["rankme"] <= 512, e
assert math.isfinite(e["embedding_std"]) and e["collapsed"] in (True, False), e
PY
run report report "$R"
[[ $rc == 0 ]] || bad "report exited $rc: $(firstline "$TMP/report.err")"
[[ -s $R/report.html ]] || bad "no report.html"
run export export "$R" --out "$TMP/encoder.safetensors"
[[ $rc == 0 && -s $TMP/encoder.safetensors ]] || bad "export exited $rc: $(firstline "$TMP/export.err")"
finish "$name"

name="3 eval with a labeled folder on the command line: kNN and the probe"
run eval-labeled eval "$R" --json --set data.train="$LABELED/train" --set data.test="$LABELED/test"
[[ $rc == 0 ]] || bad "eval exited $rc: $(firstline "$TMP/eval-labeled.err")"
/usr/bin/python3 - "$TMP/eval-labeled.out" <<'PY' || bad "labeled eval --json"
import json, sys
e = json.loads(open(sys.argv[1]).read())
assert e["n_train"] == 24 and e["n_test"] == 12 and e["n_classes"] == 2, e
assert 0 <= e["knn_top1"] <= 1 and 0 <= e["linear_top1"] <= 1, e
assert e["knn_k"] == 12, e  # the smallest class has 12: it votes whole, not 200
PY
# A slip: the training set as the test set. Scored, with a warning that says why it reads high.
run eval-same eval "$R" --knn --no-baseline --set data.train="$LABELED/train" \
  --set data.test="$LABELED/train"
[[ $rc == 0 ]] && grep -q "warning: the test set is the training set" "$TMP/eval-same.err" ||
  bad "train = test: exit $rc, no warning: $(firstline "$TMP/eval-same.err")"
finish "$name"

name="4 compare of three objectives on the folder, each with its photo recipe"
C=$TMP/compare
LIMIT=600 run compare compare --objectives inbatch,moco,mae --data "$PHOTOS" --budget 1epochs \
  --seeds 1 --set data.limit=16 --set data.image_size=32 --set train.batch_size=8 --out "$C"
[[ $rc == 0 ]] || bad "compare exited $rc: $(firstline "$TMP/compare.err")"
grep -q "configs/photos/NAME.ini" "$TMP/compare.out" || bad "the compare does not say it took the photo recipes"
/usr/bin/python3 - "$C/compare.json" <<'PY' || bad "compare.json"
import json, sys
c = json.load(open(sys.argv[1]))
for o in ("inbatch", "moco", "mae"):
    cell = c["results"][o]["1epochs"]
    assert cell["knn_top1"]["mean"] is None and cell["linear_top1"]["mean"] is None, (o, cell)
    assert cell["rankme"]["n"] == 1, (o, cell["rankme"])
    assert cell["collapsed"]["n"] == 1, (o, cell["collapsed"])
assert "No run had labels" in c["verdict"][0], c["verdict"]
PY
grep -q "vit-tiny-photos" "$C"/mae-1epochs-seed0/summary.json 2>/dev/null ||
  grep -rq "vit-tiny-photos" "$C"/mae-1epochs-seed0/ || bad "mae did not train its photo recipe's ViT"
finish "$name"

totals
