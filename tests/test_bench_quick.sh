#!/usr/bin/env bash
# `scripts/bench.sh --vs-pytorch --quick` end to end on one ResNet row and one ViT row: Tally in
# fp32 and bf16, PyTorch 2.6 (natively, or in the Debian 13 root when the host's is older) in
# every setting. Checks the shape of summary.json, not speed: every setting has its numbers or
# the reason it has none (only torch.compile may have none), the settings of one precision
# train the same network (PyTorch's first loss, same seed and inputs, agrees with fp32's to
# the precision's arithmetic), Tally's images/s is its ledger's median step recomputed here, the
# best settings and ratios follow from the settings' numbers, and the versions are named.
#
# Without PyTorch 2.6 on the host it needs the Debian 13 root: skipped, with the reason, when it
# cannot exist here (not root; no root made and no network for debootstrap); made with
# scripts/test-debian13.sh when it can.
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ROWS=(inbatch/resnet-small-32 mae/vit-tiny)

host_torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) || host_torch=""
if ! "$PY" -c 'import re, sys; sys.exit(0 if [int(x) for x in re.findall(r"\d+", sys.argv[1])[:2]] >= [2, 6] else 1)' "${host_torch:-0}"; then
  root=${TALLY_DEBIAN13_ROOT:-$HOME/.cache/tally/debian13}
  [[ $(id -u) -eq 0 ]] ||
    skip_or_fail "the host's PyTorch is ${host_torch:-missing}, PyTorch 2.6 needs the Debian 13 root, and a root needs root (chroot)"
  if [[ ! -d $root ]]; then
    getent hosts deb.debian.org >/dev/null ||
      skip_or_fail "no Debian 13 root at $root and no network to debootstrap one"
    echo "# making the Debian 13 root (scripts/test-debian13.sh)"
    scripts/test-debian13.sh -R '^test_cli$' >"$TMP/make-root.log" 2>&1 ||
      setup_fail "scripts/test-debian13.sh could not make the root: $(tail -n 3 "$TMP/make-root.log")"
  fi
fi

LIMIT=3300  # four compiles of up to 600 s each on a busy machine, and the rest
if ! TALLY_BENCH_BIN=$TALLY_BIN timeout "$LIMIT" scripts/bench.sh --vs-pytorch --quick --compile-timeout 600 \
  "${ROWS[@]}" >"$TMP/bench.log" 2>&1; then
  tail -n 20 "$TMP/bench.log"
  setup_fail "scripts/bench.sh --vs-pytorch --quick failed"
fi
out=$(sed -n 's/^runs, logs, summary.md and summary.json: //p' "$TMP/bench.log")
[[ -n $out && -f $out/summary.json ]] || setup_fail "no summary.json (see the log: $(tail -n 3 "$TMP/bench.log"))"
# kept when a check fails, for a look
release() { if ((failed == 0)); then rm -rf "$out"; else echo "# results kept in $out"; fi; }

cat >"$TMP/checks.py" <<'PY'
import json, os, re, statistics, sys

out, name = sys.argv[1], sys.argv[2]
summary = json.load(open(os.path.join(out, "summary.json")))
rows = {r["slug"]: r for r in summary["rows"]}
fast = {"inbatch-resnet-small-32": "cl", "mae-vit-tiny": "sdpa"}


def expected(slug):
    f = fast[slug]
    return {"tally:fp32", "tally:bf16", "torch:fp32", f"torch:fp32-{f}",
            f"torch:fp32-{f}-compile", "torch:bf16", f"torch:bf16-{f}", f"torch:bf16-{f}-compile"}


def rows_and_settings():
    if set(rows) != set(fast):
        print(f"rows {sorted(rows)}, expected {sorted(fast)}")
    for slug, row in rows.items():
        if set(row["settings"]) != expected(slug):
            print(f"{slug}: settings {sorted(row['settings'])}")


def numbers_or_reason():
    for slug, row in rows.items():
        for run, s in row["settings"].items():
            if "unavailable" in s:
                if not run.endswith("-compile") or not s["unavailable"].startswith("does not compile"):
                    print(f"{slug} {run}: {s['unavailable']}")
            elif not (s.get("images_per_s", 0) > 0 and s.get("peak_rss_bytes", 0) > 2**20
                      and s.get("measured_steps") == 2):
                print(f"{slug} {run}: {s}")


def same_training():
    # Same seed, same inputs: fp32 settings agree with fp32 eager to rounding, bf16 to bf16's.
    for slug, row in rows.items():
        s = row["settings"]
        ref = s["torch:fp32"]["loss_first"]
        for run, v in s.items():
            if run.startswith("torch:") and "loss_first" in v:
                tol = 1e-3 if run.startswith("torch:fp32") else 5e-2
                if abs(v["loss_first"] - ref) > tol * abs(ref):
                    print(f"{slug} {run}: first loss {v['loss_first']}, fp32 {ref}")


def tally_rate_from_ledger():
    for slug, row in rows.items():
        for p in ("fp32", "bf16"):
            path = os.path.join(out, slug, f"tally-{p}-rep1", "ledger.jsonl")
            recs = [json.loads(line) for line in open(path) if line.strip()]
            ms = [r["step_ms"] for r in recs if r.get("step", -1) >= 1]  # --quick: warm-up 1
            want = 32 * 1000 / statistics.median(ms)  # --quick: batch 32
            got = row["settings"][f"tally:{p}"]["images_per_s"]
            if len(ms) != 2 or abs(got - want) > 1e-6 * want:
                print(f"{slug} tally:{p}: {got} images/s, the ledger says {want} ({len(ms)} steps)")


def bests_and_ratios():
    for slug, row in rows.items():
        s = row["settings"]

        def rate(r):
            return s[r].get("images_per_s", 0)

        for p in ("fp32", "bf16", "overall"):
            torch_runs = [r for r in s if r.startswith("torch:") and (p == "overall" or r[6:].startswith(p))]
            tally_runs = [r for r in s if r.startswith("tally:") and (p == "overall" or r.endswith(p))]
            bt, bq = max(tally_runs, key=rate), max(torch_runs, key=rate)
            if row["best"][p] != {"tally": bt, "pytorch": bq}:
                print(f"{slug} {p}: best {row['best'][p]}, expected {bt} and {bq}")
            ratio, want = row["tally_over_pytorch"][p], rate(bt) / max(rate(bq), 1e-300)
            if ratio is None or abs(ratio - want) > 1e-9 * want:
                print(f"{slug} {p}: ratio {ratio}, expected {want}")


def names_what_was_measured():
    meta, torch = summary["meta"], summary["pytorch"]
    md = open(os.path.join(out, "summary.md")).read()
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
               if line.startswith("model name"))
    tally_onednn, torch_onednn = meta.get("tally_onednn", ""), torch["onednn_version"] or ""
    for what, ok in [("CPU", cpu in md), ("date", re.search(r"\d{4}-\d\d-\d\dT", md)),
                     ("Tally's oneDNN", re.fullmatch(r"\d+\.\d+(\.\d+)?", tally_onednn)
                      and f"oneDNN {tally_onednn}" in md),
                     ("PyTorch 2.6", (torch["torch"] or "").startswith("2.6") and torch["torch"] in md),
                     ("PyTorch's oneDNN 3", torch_onednn.startswith("3.") and f"oneDNN {torch_onednn}" in md),
                     ("OpenBLAS", any("openblas" in b for b in torch["blas"] or [])),
                     ("flags", "--vs-pytorch --quick" in md),
                     ("quick warning", "not a measurement" in md)]:
        if not ok:
            print(f"summary.md/json lacks the {what}")


globals()[name]()
PY

check() {  # NAME FUNCTION: the function prints what is wrong, one line each; nothing is ok
  local what
  what=$("$PY" "$TMP/checks.py" "$out" "$2" 2>&1) || what+=" (the check itself failed)"
  [[ -z $what ]] || bad "$what"
  finish "$1"
}

check "both rows, every setting of each" rows_and_settings
check "a setting has its numbers, or (compiled only) the reason it has none" numbers_or_reason
check "PyTorch settings of a precision train the same network (first loss)" same_training
check "Tally's images/s is its ledger's median step after warm-up" tally_rate_from_ledger
check "best settings and ratios follow from the settings" bests_and_ratios
check "the summary names the CPU, date, versions and flags" names_what_was_measured

totals
