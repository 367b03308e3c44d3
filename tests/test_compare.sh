#!/usr/bin/env bash
# `tally compare` end to end on the repository's sample images (data/samples/stripes: 16 images,
# a run takes a second or two): inbatch and moco at two epoch budgets, two seeds each.
#   1 compare.json holds, per objective and budget, what each run's own files say (its summary,
#     its last ledger record, its `tally eval --json`, which a fresh `tally eval` repeats), the
#     planned FLOPs, and means and 95% intervals recomputed here: the t quantile found by
#     integrating Student's density, not read from a table
#   2 compare.html is self-contained; a browser's DOM holds a chart per accuracy and cost, an
#     error bar per point, the Pareto front, the baselines and the tables
#   3 a compare stopped by SIGINT mid-run, then killed with kill -9 mid-run, then run again ends
#     with the same compare.json as the compare done in one go (times and memory aside)
#   4 failures stop the compare with the exit code of the README, no compare.json: a NaN loss
#     (3), a budget below one step (1, before any run), other settings on the same folder (2)
#   5 an unlabeled folder: every run scored by what needs no labels
#   6 more seeds on a finished compare's folder train only the new seeds' runs; fewer seeds
#     summarize the first ones, training nothing
source "$(dirname "$0")/lib.sh"

BG_PIDS=()
release() {
  local p
  for p in "${BG_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

COMMON=(--objectives inbatch,moco --budget 4epochs,10epochs --seeds 2
  --set data.dataset=stripes --set train.batch_size=8 --set eval.knn_k=4 --set eval.batch_size=8
  --quiet)

# cmp_run LABEL ARGS...: tally compare under the timeout, output in $TMP/LABEL.out/.err; sets rc.
cmp_run() {
  local label=$1
  shift
  { timeout "$LIMIT" "$TALLY_BIN" compare "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"; rc=$?; } 2>/dev/null
}

# midrun DIR PID: waits until a run folder under DIR has trained two steps but not finished (or
# PID has exited); 0 when found.
midrun() {
  local dir=$1 pid=$2 run
  for _ in $(seq 1 1500); do
    for run in "$dir"/*-seed*; do
      [[ -f $run/ledger.jsonl && ! -e $run/summary.json ]] || continue
      (($(wc -l <"$run/ledger.jsonl") >= 2)) && return 0
    done
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}

# wait_output FILE PATTERN N PID: waits until FILE has N lines matching PATTERN (or PID exited).
wait_output() {
  for _ in $(seq 1 1500); do
    (($(grep -c "$2" "$1" 2>/dev/null) >= $3)) && return 0
    kill -0 "$4" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}

# 1. The reference compare, checked against its runs' own outputs.
name="1 compare.json: every run's own outputs, means and t intervals"
ref=$TMP/ref
t0=$(date +%s%N)
cmp_run ref "${COMMON[@]}" --out "$ref"
ms=$((($(date +%s%N) - t0) / 1000000))
echo "# the reference compare (8 runs and evaluations) took $ms ms"
[[ $rc == 0 ]] || bad "compare exited $rc: $(firstline "$TMP/ref.err")"
grep -q "^verdict:" "$TMP/ref.out" || bad "no verdict printed"
grep -q "4epochs: .*By the linear probe: [a-z]* scores best" "$TMP/ref.out" || bad "no best objective named"
grep -q "By kNN (cosine, k = 4)" "$TMP/ref.out" || bad "the verdict does not name kNN's k"
grep -q "fits" "$TMP/ref.out" || bad "the plan's memory column is missing"
# The planned FLOPs of one cell, from tally plan with the same options.
"$TALLY_BIN" plan --objective=moco --set data.dataset=stripes --set train.batch_size=8 \
  --budget 10epochs --no-knn --json >"$TMP/plan.json" 2>"$TMP/plan.err" || bad "tally plan failed"
"$TALLY_BIN" eval "$ref/moco-10epochs-seed1" --json >"$TMP/eval.json" 2>"$TMP/eval.err" ||
  bad "tally eval failed"
python3 - "$ref" "$TMP/plan.json" "$TMP/eval.json" >"$TMP/check1.txt" 2>&1 <<'EOF' || bad "$(head -3 "$TMP/check1.txt" | tr '\n' ' ')"
import json, math, os, sys
ref, plan_path, eval_path = sys.argv[1:]
c = json.load(open(os.path.join(ref, "compare.json")))
assert c["objectives"] == ["inbatch", "moco"], c["objectives"]
assert c["budgets"] == ["4epochs", "10epochs"], c["budgets"]
assert c["seeds"] == 2

def t_density(x, df):
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * \
        (1 + x * x / df) ** (-(df + 1) / 2)

def t_quantile_975(df):
    # P(0 < T < q) = 0.475, by Simpson's rule on [0, q] and bisection on q.
    def mass(q, n=4000):
        h = q / n
        s = t_density(0, df) + t_density(q, df)
        s += sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, n))
        return s * h / 3
    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mass(mid) < 0.475 else (lo, mid)
    return (lo + hi) / 2

FRACTIONS = ("knn_top1", "knn_top1_k20", "linear_top1")

def check_stats(st, values, what):
    assert st["values"] == values or all(
        (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(1, abs(b)))
        for a, b in zip(st["values"], values)), (what, st["values"], values)
    xs = [v for v in values if v is not None]
    assert st["n"] == len(xs), (what, st["n"], len(xs))
    if not xs:
        assert st["mean"] is None and st["ci95"] is None, what
        return
    mean = sum(xs) / len(xs)
    assert abs(st["mean"] - mean) <= 1e-9 * max(1, abs(mean)), (what, st["mean"], mean)
    if len(xs) < 2:
        assert st["ci95"] is None, (what, st["ci95"])
        return
    # An accuracy's interval is Student's on the logit scale (values clamped to [1e-4, 1 - 1e-4]),
    # mapped back and widened to hold the mean; the others' lower end is clipped at 0.
    fraction = what[-1] in FRACTIONS
    eps = 1e-4
    ts = [math.log(min(max(x, eps), 1 - eps) / (1 - min(max(x, eps), 1 - eps))) for x in xs] if fraction else xs
    mt = sum(ts) / len(ts)
    s = math.sqrt(sum((t - mt) ** 2 for t in ts) / (len(ts) - 1))
    half = t_quantile_975(len(ts) - 1) * s / math.sqrt(len(ts))
    if fraction:
        expit = lambda t: 1 / (1 + math.exp(-t))
        want = (min(expit(mt - half), mean), max(expit(mt + half), mean))
        assert 0 <= st["ci95"][0] <= st["ci95"][1] <= 1, (what, st["ci95"])
    else:
        want = (max(0, mt - half), mt + half)
    lo, hi = st["ci95"]
    # The program's table has 4 decimals of t: 5e-5 of t, relative.
    tol = 1e-4 * half + 1e-9 * max(1, abs(mean))
    assert abs(lo - want[0]) <= tol and abs(hi - want[1]) <= tol, (what, st["ci95"], want)

def last_record(run):
    rec = None
    for line in open(os.path.join(run, "ledger.jsonl")):
        if line.strip():
            rec = json.loads(line)
    return rec

checked = 0
for o in c["objectives"]:
    for b in c["budgets"]:
        cell = c["results"][o][b]
        runs = [os.path.join(ref, f"{o}-{b}-seed{s}") for s in range(2)]
        assert cell["runs"] == [os.path.basename(r) for r in runs], cell["runs"]
        evals = [json.load(open(os.path.join(r, "compare-eval.json"))) for r in runs]
        summaries = [json.load(open(os.path.join(r, "summary.json"))) for r in runs]
        records = [last_record(r) for r in runs]
        for m in ["knn_top1", "knn_top1_k20", "linear_top1", "rankme", "embedding_std", "knn_k"]:
            check_stats(cell[m], [e[m] for e in evals], (o, b, m))
        check_stats(cell["collapsed"], [1 if e["collapsed"] else 0 for e in evals], (o, b, "collapsed"))
        check_stats(cell["eval_seconds"], [e["seconds"] for e in evals], (o, b, "eval_seconds"))
        for m in ["train_seconds", "peak_rss_bytes"]:
            check_stats(cell[m], [s[m] for s in summaries], (o, b, m))
        # FLOPs: the ledger's count (9 digits), which summary.json rounds to 6.
        check_stats(cell["flops_total"], [r["flops_total"] for r in records], (o, b, "flops"))
        assert all(abs(v - s["flops_total"]) <= 1e-5 * v
                   for v, s in zip(cell["flops_total"]["values"], summaries)), (o, b, "flops")
        for m in ["views_grad", "views_nograd", "activation_bytes", "queue_vectors",
                  "encodings_next_new", "encodings_next_reused"]:
            # A field only some objectives write (moco's queue_vectors) counts 0 for the others.
            check_stats(cell["per_step"][m], [r.get(m, 0) for r in records], (o, b, m))
        # The baselines: the first seed's evaluation measures them (one value, no interval).
        check_stats(cell["raw_pixels"]["knn_top1"], [evals[0]["knn_top1_raw_pixels"]], (o, b, "raw knn"))
        check_stats(cell["raw_pixels"]["linear_top1"], [evals[0]["linear_top1_raw_pixels"]], (o, b, "raw linear"))
        assert evals[1]["knn_top1_raw_pixels"] is None, "the second seed measured the baseline again"
        # Two seeds of one recipe differ (else the seed is not passed on).
        assert cell["rankme"]["values"][0] != cell["rankme"]["values"][1], (o, b, "seeds agree")
        checked += 1
assert checked == 4
# Counts a person can check by hand: inbatch back-propagates both views of 8 images; moco one
# view with gradient, one through the key encoder, and reuses its 4096-key queue.
ps = c["results"]["inbatch"]["4epochs"]["per_step"]
assert ps["views_grad"]["mean"] == 16 and ps["views_nograd"]["mean"] == 0, ps
ps = c["results"]["moco"]["10epochs"]["per_step"]
assert ps["views_grad"]["mean"] == 8 and ps["views_nograd"]["mean"] == 8, ps
assert ps["encodings_next_reused"]["mean"] == 4096, ps
# The FLOPs are what tally plan planned for that budget, to the digits the ledger writes.
plan = json.loads(open(plan_path).readline())
assert c["results"]["moco"]["10epochs"]["flops_total"]["values"] == [plan["flops_total"]] * 2, \
    (c["results"]["moco"]["10epochs"]["flops_total"], plan["flops_total"])
# A fresh tally eval of a run says what compare-eval.json says.
fresh = json.load(open(eval_path))
kept = json.load(open(os.path.join(ref, "moco-10epochs-seed1", "compare-eval.json")))
for m in ["knn_top1", "linear_top1", "rankme", "embedding_std"]:
    assert fresh[m] == kept[m], (m, fresh[m], kept[m])
assert len(c["verdict"]) == 2 and c["verdict"][0].startswith("4epochs: "), c["verdict"]
print("ok")
EOF
finish "$name"

# 2. compare.html.
name="2 compare.html: self-contained; charts, error bars, Pareto front, tables in a browser"
html=$ref/compare.html
[[ -f $html ]] || bad "no compare.html"
grep -qiE "<script|https?://[^\"]*\.(js|css|woff)" "$html" 2>/dev/null && bad "compare.html fetches or runs something"
if command -v chromium >/dev/null 2>&1; then
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$TMP/chrome" --dump-dom "file://$html" >"$TMP/dom.html" 2>/dev/null ||
    bad "chromium could not load compare.html"
  count() { grep -o "$1" "$TMP/dom.html" | wc -l; }
  # Linear probe and kNN, each against FLOPs, seconds and peak memory; in each, a point and an
  # error bar per (objective, budget), and at least one point ringed as the Pareto front.
  (($(count "<svg") == 6)) || bad "$(count "<svg") charts, not 6"
  (($(count 'class="point"') == 24)) || bad "$(count 'class="point"') points, not 24"
  (($(count 'class="errbar"') == 24)) || bad "$(count 'class="errbar"') error bars, not 24"
  (($(count 'class="pareto"') >= 6)) || bad "no Pareto front marked in some chart"
  (($(count "raw pixels (baseline, dashed)") == 6)) || bad "a chart lacks the raw-pixel baseline"
  (($(count '<tr class="cell">') == 8)) || bad "$(count '<tr class="cell">') table rows, not 2 x 4"
  grep -q "Linear probe top-1 against training compute" "$TMP/dom.html" || bad "no accuracy-FLOPs chart"
  grep -q "against peak resident memory" "$TMP/dom.html" || bad "no accuracy-memory chart"
else
  [[ -n ${CI+set} ]] && bad "chromium is not installed (scripts/setup.sh --for-tests installs it)"
  echo "# chromium is not installed: the browser check is skipped"
fi
finish "$name"

# 3. Ctrl-C, then kill -9, then the same command again.
name="3 SIGINT and kill -9 mid-run, then the same command: the same compare.json"
out=$TMP/cut
"$TALLY_BIN" compare "${COMMON[@]}" --out "$out" >"$TMP/cut1.out" 2>"$TMP/cut1.err" &
pid=$!
BG_PIDS+=("$pid")
if midrun "$out" "$pid"; then
  kill -INT "$pid"
  wait "$pid"
  rc=$?
  [[ $rc == 130 ]] || bad "compare exited $rc after SIGINT, not 130"
  grep -q "run the same command again" "$TMP/cut1.err" || bad "no hint on how to continue"
  ls "$out"/*/checkpoint.safetensors >/dev/null 2>&1 || bad "the interrupted run kept no checkpoint"
  [[ ! -e $out/compare.json ]] || bad "compare.json written by an interrupted compare"
else
  bad "the compare finished or failed before a run was under way: $(firstline "$TMP/cut1.err")"
fi
"$TALLY_BIN" compare "${COMMON[@]}" --out "$out" >"$TMP/cut2.out" 2>"$TMP/cut2.err" &
pid=$!
BG_PIDS+=("$pid")
# The second one is killed once it has resumed the interrupted run and moved on to a new one.
if wait_output "$TMP/cut2.out" "training in" 2 "$pid" && midrun "$out" "$pid"; then
  { kill -KILL "$pid" && wait "$pid"; } 2>/dev/null
else
  bad "the second compare finished or failed before a run was under way"
fi
cmp_run cut3 "${COMMON[@]}" --out "$out"
[[ $rc == 0 ]] || bad "the compare run again exited $rc: $(firstline "$TMP/cut3.err")"
cat "$TMP/cut2.out" "$TMP/cut3.out" | grep -q "resuming the training in" ||
  bad "no run was resumed from its checkpoint"
grep -q "trained and scored already" "$TMP/cut3.out" || bad "finished runs were not skipped"
python3 - "$ref/compare.json" "$out/compare.json" >"$TMP/check3.txt" 2>&1 <<'EOF' || bad "$(head -3 "$TMP/check3.txt" | tr '\n' ' ')"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
measured = {"train_seconds", "peak_rss_bytes", "eval_seconds"}  # the machine's, not the run's
def strip(c):
    for o in c["results"].values():
        for cell in o.values():
            for m in measured:
                del cell[m]
    return c
a, b = strip(a), strip(b)
assert a["results"] == b["results"], "results differ"
print("ok")
EOF
finish "$name"

# 4. Failures stop the compare, with no compare.json.
name="4 a failed run, a budget below a step, other settings: exit 3, 1, 2; no compare.json"
out=$TMP/nan
TALLY_INJECT_NAN_AT_STEP=1 cmp_run nan "${COMMON[@]}" --out "$out"
[[ $rc == 3 ]] || bad "a NaN loss: compare exited $rc, not 3"
grep -q "training in .*inbatch-4epochs-seed0 failed (exit 3" "$TMP/nan.err" || bad "the failed run is not named: $(firstline "$TMP/nan.err")"
[[ ! -e $out/compare.json ]] || bad "compare.json written after a failed run"
cmp_run tiny --objectives inbatch --budget 1flop --seeds 1 --set data.dataset=stripes --out "$TMP/tiny"
[[ $rc == 1 ]] || bad "a budget below one step: exit $rc, not 1"
ls -d "$TMP"/tiny/*-seed* >/dev/null 2>&1 && bad "a run started although the plan refused the budget"
cmp_run other --objectives inbatch,moco --budget 4epochs --seeds 2 --set data.dataset=stripes --out "$ref"
[[ $rc == 2 ]] || bad "other settings on a compare's folder: exit $rc, not 2"
cmp_run usage --objectives inbatch --budget 4epochs
[[ $rc == 2 ]] || bad "no --out: exit $rc, not 2"
finish "$name"

# 5. An unlabeled folder: every run is scored by what needs no labels.
name="5 an unlabeled folder: rankme and embedding_std per run, accuracy null, a verdict that says so"
out=$TMP/unlabeled
cmp_run unlabeled --objectives inbatch,moco --budget 4epochs --seeds 2 \
  --set data.dataset=stripes-unlabeled --set train.batch_size=8 --quiet --out "$out"
[[ $rc == 0 ]] || bad "an unlabeled compare exited $rc: $(firstline "$TMP/unlabeled.err")"
/usr/bin/python3 - "$out" <<'EOF2' || bad "compare.json of the unlabeled compare"
import json, math, os, sys
out = sys.argv[1]
c = json.load(open(os.path.join(out, "compare.json")))
for o in ("inbatch", "moco"):
    cell = c["results"][o]["4epochs"]
    assert cell["knn_top1"]["n"] == 0 and cell["linear_top1"]["n"] == 0, cell["knn_top1"]
    values = []
    for s in range(2):
        e = json.load(open(os.path.join(out, f"{o}-4epochs-seed{s}", "compare-eval.json")))
        assert e["knn_top1"] is None and e["n_classes"] == 0, e
        assert e["collapsed"] in (True, False), e
        values.append(e["rankme"])
    assert cell["rankme"]["values"] == values and cell["rankme"]["n"] == 2, cell["rankme"]
    assert all(1 <= v <= 128 for v in values), values
assert any("no run had labels" in v.lower() for v in c["verdict"]), c["verdict"]
print("ok")
EOF2
finish "$name"

# 6. The number of seeds may change on a compare's folder; nothing else may (case 4).
name="6 --seeds 3 then 1 on a 2-seed compare: seed 2 trained, seeds 0 and 1 kept, compare.json follows"
before=$(stat -c %Y.%s "$out"/*-seed[01]/summary.json | tr '\n' ' ')
cp "$out/compare.json" "$TMP/two-seeds.json"
sleep 1.1  # a retrained run would show a later mtime
cmp_run more --objectives inbatch,moco --budget 4epochs --seeds 3 \
  --set data.dataset=stripes-unlabeled --set train.batch_size=8 --quiet --out "$out"
[[ $rc == 0 ]] || bad "--seeds 3 on a 2-seed folder exited $rc: $(firstline "$TMP/more.err")"
grep -q "now has 3 seeds; its finished runs are kept" "$TMP/more.out" || bad "no word that seeds were added"
[[ $(stat -c %Y.%s "$out"/*-seed[01]/summary.json | tr '\n' ' ') == "$before" ]] || bad "seeds 0 and 1 were trained again"
[[ -f $out/inbatch-4epochs-seed2/summary.json && -f $out/moco-4epochs-seed2/summary.json ]] || bad "seed 2 was not trained"
cmp_run fewer --objectives inbatch,moco --budget 4epochs --seeds 1 \
  --set data.dataset=stripes-unlabeled --set train.batch_size=8 --quiet --out "$out"
[[ $rc == 0 ]] || bad "--seeds 1 on a 3-seed folder exited $rc: $(firstline "$TMP/fewer.err")"
grep -q "training in" "$TMP/fewer.out" && bad "--seeds 1 trained a run: $(grep -m1 "training in" "$TMP/fewer.out")"
/usr/bin/python3 - "$TMP/two-seeds.json" "$out/compare.json" <<'EOF2' || bad "compare.json after --seeds 3 and 1"
import json, sys
two = json.load(open(sys.argv[1]))["results"]
one = json.load(open(sys.argv[2]))
assert one["seeds"] == 1, one["seeds"]
for o in ("inbatch", "moco"):
    r = one["results"][o]["4epochs"]["rankme"]
    assert r["n"] == 1 and r["values"] == two[o]["4epochs"]["rankme"]["values"][:1], (r, two[o])
print("ok")
EOF2
finish "$name"

totals
