#!/usr/bin/env python3
"""Where a Tally training step's time goes, primitive by primitive, from oneDNN's own timings.

Reads the log of a run made with DNNL_VERBOSE=1 (oneDNN 2.x's and 3.x's formats) and the run's
ledger, and prints a Markdown table: for each kind of primitive (kind, implementation, pass,
data type) its milliseconds per step, its share of the step, the GFLOP it computes per step
(convolutions, inner products and matmuls, counted from the problem each line describes, as
Tally counts its own: a multiply-add is 2, a Winograd convolution the direct one's) and the
fraction of the measured peak (a large oneDNN matmul in the same data type) it reaches.

A step executes the same primitives in the same order, and a run with --no-knn executes nothing
after its steps and only a few kernels before them, so a step's executions are found as the
count whose last two steps are the same sequence (the script stops if there is none); the first
`--warmup` steps (primitive creation, first touch of memory) are left out.

    scripts/onednn_profile.py VERBOSE_LOG RUN_DIR [--warmup W] [--peak-f32 G] [--peak-bf16 G]
                              [--top N] [--json OUT]
"""

import argparse
import collections
import json
import re
import sys


def exec_lines(path):
    """(kind, impl, prop, mds, problem, ms) for each execution, in order."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith(("onednn_verbose,", "dnnl_verbose,")):
                continue
            fields = line.rstrip("\n").split(",")
            try:
                i = fields.index("exec")
            except ValueError:
                continue
            if len(fields) < i + 10:
                continue
            kind, impl, prop, mds = fields[i + 2], fields[i + 3], fields[i + 4], fields[i + 5]
            problem, ms = fields[i + 8], fields[-1]
            try:
                out.append((kind, impl, prop, mds, problem, float(ms)))
            except ValueError:
                continue
    return out


def md_types(mds):
    """{'src': 'f32', 'wei': 'bf16', ...} from a line's memory descriptors (2.x: src_f32::...,
    3.x: src:f32::...)."""
    types = {}
    for tok in mds.split():
        m = re.match(r"([a-z_]+?)[_:](f32|bf16|f16|s8|u8|s32|undef)\b", tok)
        if m and m.group(1) not in types:
            types[m.group(1)] = m.group(2)
    return types


def data_type(kind, types):
    """The type a primitive computes in: a weighted one's bf16 when any of its tensors is (its
    weight gradient or input gradient may be f32 beside bf16 operands); any other's its source
    (oneDNN 2.x calls a normalization's or eltwise's `data`), with its destination if another."""
    if kind in ("convolution", "deconvolution", "inner_product", "matmul", "gemm_api"):
        seen = [types.get(k) for k in ("src", "wei", "dst")]
        return "bf16" if "bf16" in seen else next((t for t in seen if t), "?")
    src = types.get("src") or types.get("data", "?")
    dst = types.get("dst", "?")
    return src if src == dst or dst in ("?", "undef") else f"{src}→{dst}"


def num(pattern, text, default=None):
    m = re.search(pattern, text)
    return int(m.group(1)) if m else default


def flops(kind, problem):
    """Analytic FLOPs of one execution (0 for primitives that only move or normalize data)."""
    if kind in ("convolution", "deconvolution"):
        mb, ic, oc = num(r"mb(\d+)", problem), num(r"ic(\d+)", problem), num(r"oc(\d+)", problem)
        if None in (mb, ic, oc):
            return 0.0
        g = num(r"(?:^|_)g(\d+)", problem, 1)
        sp = 1
        ksz = 1
        for d in ("d", "h", "w"):
            o = num(rf"o{d}(\d+)", problem)
            k = num(rf"k{d}(\d+)", problem)
            if o is not None:
                sp *= o
            if k is not None:
                ksz *= k
        return 2.0 * mb * oc * sp * (ic / g) * ksz
    if kind == "inner_product":
        mb, ic, oc = num(r"mb(\d+)", problem), num(r"ic(\d+)", problem), num(r"oc(\d+)", problem)
        if None in (mb, ic, oc):
            return 0.0
        sp = num(r"id(\d+)", problem, 1) * num(r"ih(\d+)", problem, 1) * num(r"iw(\d+)", problem, 1)
        return 2.0 * mb * ic * sp * oc
    if kind in ("matmul", "gemm_api"):
        parts = problem.split(":")
        if len(parts) < 2:
            return 0.0
        try:
            a = [int(x) for x in parts[0].split("x")]
            b = [int(x) for x in parts[1].split("x")]
        except ValueError:
            return 0.0
        if len(a) < 2 or len(b) < 2:
            return 0.0
        batch = 1
        for x, y in zip(a[:-2][::-1], b[:-2][::-1]):
            batch *= max(x, y)
        for x in (a[:-2] if len(a) > len(b) else b[:-2])[: abs(len(a) - len(b))]:
            batch *= x
        return 2.0 * batch * a[-2] * a[-1] * b[-1]
    return 0.0


def ledger_steps(run_dir):
    steps = []
    with open(f"{run_dir}/ledger.jsonl") as f:
        for line in f:
            line = line.strip()
            if line:
                steps.append(json.loads(line))
    return steps


def median(values):
    v = sorted(values)
    n = len(v)
    return (v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2) if n else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("run_dir")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-f32", type=float, default=0.0, help="measured f32 peak, GFLOP/s")
    p.add_argument("--peak-bf16", type=float, default=0.0, help="measured bf16 peak, GFLOP/s")
    p.add_argument("--top", type=int, default=16, help="rows before the rest are summed")
    p.add_argument("--json", help="also write the table here")
    a = p.parse_args()

    lines = exec_lines(a.log)
    ledger = ledger_steps(a.run_dir)
    steps = len(ledger)
    if steps <= a.warmup:
        sys.exit(f"onednn_profile: {a.run_dir} has {steps} steps, need more than --warmup {a.warmup}")
    # A few executions may come before the first step (kernels Tally builds at start): the
    # step's count is the one, of those the lines allow, whose last two steps match.
    per = 0
    for extra in range(len(lines) % steps, min(len(lines), 256), steps):
        p = (len(lines) - extra) // steps
        if p and [x[:3] + x[4:5] for x in lines[-p:]] == [x[:3] + x[4:5] for x in lines[-2 * p:-p]]:
            per = p
            break
    if not per:
        sys.exit(f"onednn_profile: the {len(lines)} executions in {a.log} do not repeat step by "
                 f"step over {steps} steps (was the run made with --no-knn and DNNL_VERBOSE=1?)")
    measured = lines[-(steps - a.warmup) * per:]
    n = steps - a.warmup
    step_ms = median([s["step_ms"] for s in ledger[a.warmup:]])

    groups = collections.OrderedDict()
    for kind, impl, prop, mds, problem, ms in measured:
        dt = data_type(kind, md_types(mds))
        key = (kind, impl, prop if prop not in ("undef", "") else "-", dt)
        g = groups.setdefault(key, {"ms": 0.0, "flop": 0.0, "calls": 0})
        g["ms"] += ms
        g["flop"] += flops(kind, problem)
        g["calls"] += 1
    onednn_ms = sum(g["ms"] for g in groups.values()) / n
    rows = []
    for (kind, impl, prop, dt), g in groups.items():
        ms = g["ms"] / n
        gflop = g["flop"] / n / 1e9
        rate = gflop / (ms / 1e3) if ms > 0 and gflop > 0 else 0.0
        peak = a.peak_bf16 if dt == "bf16" else a.peak_f32 if dt == "f32" else 0.0
        rows.append({"kind": kind, "implementation": impl, "pass": prop, "type": dt,
                     "calls_per_step": g["calls"] / n, "ms_per_step": ms,
                     "share_of_step": ms / step_ms if step_ms else 0.0, "gflop_per_step": gflop,
                     "gflops": rate, "fraction_of_peak": rate / peak if rate and peak else None})
    rows.sort(key=lambda r: -r["ms_per_step"])

    counted = sum(r["gflop_per_step"] for r in rows)
    last = ledger[-1]
    ledger_gflop = (last.get("flops_forward", 0) + last.get("flops_backward", 0)) / 1e9
    print(f"median step {step_ms:.1f} ms over steps {a.warmup}-{steps - 1}; oneDNN primitives "
          f"{onednn_ms:.1f} ms ({100 * onednn_ms / step_ms:.0f}%), the rest (data, losses, "
          f"optimizer, Tally's own loops) {step_ms - onednn_ms:.1f} ms. The convolutions, inner "
          f"products and matmuls compute {counted:.1f} GFLOP a step by their problem sizes; the "
          f"ledger counts {ledger_gflop:.1f} for the whole step.")
    print()
    print("| primitive | implementation | pass | type | calls | ms/step | share of step | "
          "GFLOP/step | GFLOP/s | of peak |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    shown = rows[: a.top]
    for r in shown:
        frac = f"{100 * r['fraction_of_peak']:.0f}%" if r["fraction_of_peak"] else ""
        gf = f"{r['gflop_per_step']:.1f}" if r["gflop_per_step"] else ""
        rate = f"{r['gflops']:.0f}" if r["gflops"] else ""
        print(f"| {r['kind']} | {r['implementation']} | {r['pass']} | {r['type']} | "
              f"{r['calls_per_step']:.0f} | {r['ms_per_step']:.1f} | "
              f"{100 * r['share_of_step']:.1f}% | {gf} | {rate} | {frac} |")
    rest = rows[a.top:]
    if rest:
        ms = sum(r["ms_per_step"] for r in rest)
        print(f"| {len(rest)} others | | | | | {ms:.1f} | {100 * ms / step_ms:.1f}% | | | |")
    print(f"| outside oneDNN | | | | | {step_ms - onednn_ms:.1f} | "
          f"{100 * (step_ms - onednn_ms) / step_ms:.1f}% | | | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"step_ms": step_ms, "onednn_ms": onednn_ms, "steps": steps,
                       "warmup": a.warmup, "peak_f32": a.peak_f32, "peak_bf16": a.peak_bf16,
                       "primitives": rows}, f, indent=1)


if __name__ == "__main__":
    main()
