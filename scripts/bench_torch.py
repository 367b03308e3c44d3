#!/usr/bin/python3
"""The PyTorch side of `scripts/bench.sh --vs-pytorch`, and the measuring around both sides.

    bench_torch.py run --config RUN/config.ini --objective OBJ [--warmup 5] [--steps 20]
                       [--expect-params N] [--json OUT.json]
        Trains Tally's network for that run (the resolved config.ini every Tally run folder
        holds: model file, batch, optimizer, objective settings) in PyTorch for warmup + steps
        steps on random inputs and writes per-step times, peak RSS and the BLAS library it used.
    bench_torch.py exec --json OUT.json -- COMMAND...
        Runs COMMAND and records its wall time, CPU time, peak RSS (wait4) and how busy the
        machine's other processes kept the CPUs meanwhile (/proc/stat minus COMMAND's CPU time).
    bench_torch.py summarize DIR
        The tables of a `bench.sh --vs-pytorch` results folder (DIR/summary.md is the Markdown one).

What the PyTorch side runs for each objective (one training step = everything timed):

  inbatch  SimCLR NT-Xent: both views (2B images) through encoder + projection head with
           backward, L2-normalized, (2B x 2B) similarities / temperature with the diagonal masked,
           cross-entropy against the other view; optimizer step.
  moco     MoCo v2: queries (view 0) through encoder + head with backward; keys (view 1) through
           a momentum copy in train mode (batch statistics, as Tally's key encoder) under
           no_grad; logits [q.k+, q.queue^T] / temperature over a (K x d) queue, cross-entropy
           with the positive first; optimizer step; EMA of the key parameters
           (k <- m k + (1 - m) q); the B new keys replace the oldest in the queue.
  mae      MAE: per-image random masking (rand + argsort, keep int(P (1 - r))), patch embedding
           + sin-cos positions, the visible patches gathered, cls token first, encoder blocks on
           cls + visible tokens only, decoder (Linear D -> Dd, mask token scattered at the masked
           positions, its own sin-cos positions, blocks, LayerNorm, Linear -> patch pixels),
           MSE on the masked patches against per-patch normalized pixels (norm_pix_loss, unbiased
           variance, eps 1e-6); optimizer step.

The networks are python/tally_torch/model.py's (the PyTorch mirror of src/nn/*.c that loads
`tally export` files): ResNet, ViT, ProjectionHead, MaeDecoder; `run` checks that the trainable
parameter count equals Tally's (`tally plan`'s "parameters" row, passed as --expect-params).
Optimizers as the config says: SGD (momentum, weight decay) or AdamW (betas, eps, weight
decay), PyTorch's default implementations; the learning-rate schedule is left out (a constant
lr costs the same). Inputs are random normal batches made before each step's timer starts, so
the PyTorch number has no data pipeline in it; Tally's step time includes waiting for its
loader, whose augmentation thread shares the same two cores. PyTorch's peak RSS has no dataset
in it either; Tally's holds the training set (about 50 MiB) and its loader's buffers.
"""

import argparse
import configparser
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def proc_status_bytes(key):
    """VmRSS / VmHWM of this process in bytes, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def loaded_libraries(*needles):
    """Real paths of the shared objects mapped into this process whose name has a needle."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith("/"):
                    base = os.path.basename(parts[5]).lower()
                    if any(n in base for n in needles):
                        found.add(os.path.realpath(parts[5]))
    except OSError:
        pass
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# run: the PyTorch training step


def read_tally_config(path):
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"),
                                       inline_comment_prefixes=None, strict=False)
    with open(path) as f:
        parser.read_string(f.read())
    return parser


def build_spec(config_path, cfg, tally_torch):
    """tally_torch.Spec from a run's resolved config.ini, as an export's metadata would give it
    (an export's `config` is that text; the MAE decoder keys are also copied to [objective],
    where older versions of tally_torch looked for them)."""
    model_file = cfg.get("model", "file")
    if not os.path.isabs(model_file) and not os.path.exists(model_file):
        model_file = os.path.join(ROOT, model_file)
    with open(model_file) as f:
        model_text = f.read()
    with open(config_path) as f:
        config_text = f.read()
    if cfg.has_section("mae") and not cfg.has_section("objective"):
        config_text += "\n[objective]\n" + "".join(
            f"{k} = {cfg.get('mae', k)}\n" for k in ("decoder_dim", "decoder_depth", "decoder_heads")
            if cfg.has_option("mae", k))
    channels = cfg.getint("data", "channels")
    metadata = {"config": config_text, "model": model_text,
                "input_mean": ",".join(["0"] * channels), "input_std": ",".join(["1"] * channels)}
    return tally_torch.Spec(metadata), model_file


def cmd_run(args):
    rss_before_import = proc_status_bytes("VmRSS")
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(ROOT, "python"))
    import tally_torch.model as tally_torch  # the networks: ResNet, ViT, the heads, frame

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(args.seed)
    rss_after_import = proc_status_bytes("VmRSS")

    cfg = read_tally_config(args.config)
    spec, model_file = build_spec(args.config, cfg, tally_torch)
    if cfg.getint("model", "bn_splits", fallback=1) != 1:
        sys.exit("bench_torch: model.bn_splits != 1 (BatchNorm over groups) is not mirrored here")
    objective = args.objective
    B = cfg.getint("train", "batch_size")
    S, C = spec.image_size, spec.channels

    # The trainable network, built as Tally builds it for this objective.
    if spec.backbone == "resnet":
        encoder = tally_torch.ResNet(spec)
    elif spec.backbone == "vit":
        encoder = tally_torch.ViT(spec)
    else:
        sys.exit(f"bench_torch: unknown backbone {spec.backbone!r}")
    if objective in ("inbatch", "moco"):
        head = tally_torch.ProjectionHead(encoder.feature_dim, spec.head_hidden_dim,
                                          spec.head_out_dim)
    elif objective == "mae":
        if spec.backbone != "vit":
            sys.exit("bench_torch: mae needs a vit backbone")
        head = tally_torch.MaeDecoder(spec)
    else:
        sys.exit(f"bench_torch: objective {objective!r} has no PyTorch mirror here")
    online = torch.nn.ModuleDict({"encoder": encoder, "head": head})
    online.train()
    params = [p for p in online.parameters() if p.requires_grad]
    # Tally's "parameters" count includes BatchNorm running statistics (its parameter set holds
    # them as buffers), so add those to PyTorch's trainable count before comparing.
    n_params = sum(p.numel() for p in params) + sum(
        b.numel() for name, b in online.named_buffers()
        if name.endswith("running_mean") or name.endswith("running_var"))
    if args.expect_params and n_params != args.expect_params:
        sys.exit(f"bench_torch: the PyTorch network has {n_params} parameters (with BatchNorm "
                 f"running statistics), Tally's {args.expect_params}: the architectures differ")
    if args.params_only:
        print(n_params)
        return 0

    opt_name = cfg.get("optim", "name")
    lr = cfg.getfloat("optim", "lr")
    wd = cfg.getfloat("optim", "weight_decay")
    if opt_name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=cfg.getfloat("optim", "momentum"),
                                    weight_decay=wd)
    elif opt_name == "adamw":
        optimizer = torch.optim.AdamW(params, lr=lr, betas=(cfg.getfloat("optim", "beta1"),
                                                            cfg.getfloat("optim", "beta2")),
                                      eps=cfg.getfloat("optim", "eps"), weight_decay=wd)
    else:
        sys.exit(f"bench_torch: optimizer {opt_name!r} has no PyTorch mirror here")

    n_views = 1 if objective == "mae" else 2

    if objective == "inbatch":
        T = cfg.getfloat("inbatch", "temperature")
        eye = torch.eye(2 * B, dtype=torch.bool)
        labels = torch.cat([torch.arange(B) + B, torch.arange(B)])

        def step(views):
            z = F.normalize(head(encoder(views.reshape(2 * B, C, S, S))), dim=1)
            logits = (z @ z.t() / T).masked_fill(eye, float("-inf"))
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

    elif objective == "moco":
        import copy

        T = cfg.getfloat("moco", "temperature")
        K = cfg.getint("moco", "queue_size")
        m = cfg.getfloat("moco", "momentum")
        if cfg.getint("moco", "symmetric", fallback=0):
            sys.exit("bench_torch: moco.symmetric = 1 is not mirrored here")
        key_net = copy.deepcopy(online)
        key_net.train()  # batch statistics, as Tally's key encoder
        for p in key_net.parameters():
            p.requires_grad_(False)
        key_params = list(key_net.parameters())
        online_params = list(online.parameters())
        queue = F.normalize(torch.randn(K, spec.head_out_dim), dim=1)
        zeros = torch.zeros(B, dtype=torch.long)
        ptr = [0]

        def step(views):
            with torch.no_grad():
                k = F.normalize(key_net["head"](key_net["encoder"](views[1])), dim=1)
            q = F.normalize(head(encoder(views[0])), dim=1)
            l_pos = (q * k).sum(dim=1, keepdim=True)
            l_neg = q @ queue.t()
            loss = F.cross_entropy(torch.cat([l_pos, l_neg], dim=1) / T, zeros)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for pk, pq in zip(key_params, online_params):
                    pk.mul_(m).add_(pq.detach(), alpha=1.0 - m)
                # FIFO: the B new keys replace the oldest (K need not be a multiple of B).
                idx = (torch.arange(B) + ptr[0]) % K
                queue[idx] = k
                ptr[0] = (ptr[0] + B) % K
            return loss

    else:  # mae
        r = cfg.getfloat("mae", "mask_ratio")
        norm_pix = cfg.getint("mae", "norm_pix_loss")
        Pp = spec.patch_size
        G = spec.pad_to // Pp
        L = G * G
        n_keep = max(1, int(L * (1.0 - r)))
        D = spec.dim

        def patchify(x):  # (N, C, H, W) -> (N, L, P*P*C), each patch (py, px, c), as vit_patchify
            N = x.shape[0]
            x = x.reshape(N, C, G, Pp, G, Pp).permute(0, 2, 4, 3, 5, 1)
            return x.reshape(N, L, Pp * Pp * C)

        def step(views):
            imgs = tally_torch.frame(views[0], encoder.pad_value, spec)
            N = imgs.shape[0]
            noise = torch.rand(N, L)
            keep = torch.argsort(noise, dim=1)[:, :n_keep]
            x = encoder.patch_embed(imgs) + encoder.pos_embed
            x = torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, D))
            if spec.pool == "cls":
                x = torch.cat([encoder.cls_token.expand(N, -1, -1), x], dim=1)
            for block in encoder.blocks:
                x = block(x)
            pred = head(encoder.norm(x), keep)  # (N, L, P*P*C)
            target = patchify(imgs)
            if norm_pix:
                mean = target.mean(dim=-1, keepdim=True)
                var = target.var(dim=-1, keepdim=True)
                target = (target - mean) / (var + 1e-6) ** 0.5
            mask = torch.ones(N, L)
            mask.scatter_(1, keep, 0.0)
            loss = (((pred - target) ** 2).mean(dim=-1) * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

    step_ms, losses = [], []
    total = args.warmup + args.steps
    faults_measured = 0  # minor page faults inside the measured steps' timers
    for i in range(total):
        views = torch.randn(n_views, B, C, S, S)
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        loss = step(views)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if i >= args.warmup:
            faults_measured += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        losses.append(float(loss))
        if i == 0:
            blas = loaded_libraries("blas")  # mapped by now: the first step ran matmuls
    if args.profile:  # where PyTorch's step goes, op by op (a few more steps, not in the result)
        with torch.autograd.profiler.profile() as prof:
            for _ in range(args.profile):
                step(torch.randn(n_views, B, C, S, S))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
              file=sys.stderr)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "side": "pytorch",
        "objective": objective,
        "model_file": os.path.relpath(model_file, ROOT),
        "backbone": spec.backbone,
        "batch_size": B,
        "input": f"{S}x{S}x{C} padded to {spec.pad_to}",
        "parameters": n_params,
        "optimizer": opt_name,
        "warmup": args.warmup,
        "steps": args.steps,
        "step_ms": step_ms,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "vm_hwm_bytes": proc_status_bytes("VmHWM"),
        "rss_before_import_bytes": rss_before_import,
        "rss_after_import_bytes": rss_after_import,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        # tens of thousands a step mean the allocator hands memory back and faults it in again:
        # the tunables did not take
        "minor_faults_per_step": faults_measured / max(args.steps, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas,
        "onednn": loaded_libraries("dnnl", "mkldnn"),
        "mkldnn_enabled": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
    }
    text = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    med = statistics.median(step_ms[args.warmup:]) if args.steps else float("nan")
    print(f"bench_torch: {objective} {os.path.basename(model_file)}: median {med:.1f} ms/step, "
          f"{B * 1000 / med:.1f} images/s, peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB, "
          f"blas {','.join(blas) or 'none mapped'}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# exec: one measured command


def cpu_jiffies():
    """(busy, total, steal) jiffies over all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait, steal


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def cmd_exec(args):
    command = args.command[1:] if args.command and args.command[0] == "--" else args.command
    if not command:
        sys.exit("bench_torch exec: no command")
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    load0 = loadavg()
    busy0, total0, steal0 = cpu_jiffies()
    t0 = time.monotonic()
    stdout = open(args.log, "w") if args.log else None
    proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT if stdout else None)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    busy1, total1, steal1 = cpu_jiffies()
    if stdout:
        stdout.close()
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
    own = usage.ru_utime + usage.ru_stime
    span = (total1 - total0) / hz / ncpu if total1 > total0 else wall  # seconds per CPU
    busy_cores = (busy1 - busy0) / hz / span if span > 0 else 0.0
    result = {
        "command": command,
        "exit_code": code,
        "wall_seconds": wall,
        "cpu_seconds": own,
        "max_rss_bytes": usage.ru_maxrss * 1024,
        # cores kept busy by everything else while the command ran (its own CPU time removed;
        # steal, the hypervisor's other guests, counts as busy)
        "other_load_cores": max(0.0, busy_cores - own / wall) if wall > 0 else None,
        "steal_cores": (steal1 - steal0) / hz / span if span > 0 else 0.0,
        "loadavg_before": load0,
        "loadavg_after": loadavg(),
        "cpus": ncpu,
    }
    with open(args.json, "w") as f:
        f.write(json.dumps(result) + "\n")
    return code


# ---------------------------------------------------------------------------------------------
# summarize: the tables


def percentile(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    x = (len(v) - 1) * q
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def read_json(path):
    try:
        with open(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def tally_run(folder, warmup):
    """Step times after warm-up, GFLOP per step, data wait and peak RSS from a Tally run folder."""
    records = []
    try:
        with open(os.path.join(folder, "ledger.jsonl")) as f:
            for line in f:
                line = line.strip()
                if line:
                    records.append(json.loads(line))
    except (OSError, ValueError):
        return None
    summary = read_json(os.path.join(folder, "summary.json")) or {}
    steps = [r for r in records if "step_ms" in r and r.get("step", -1) >= warmup]
    if not steps:
        return None
    last = records[-1]
    return {
        "step_ms": [r["step_ms"] for r in steps],
        "data_ms": [r.get("data_ms", 0.0) for r in steps],
        "gflop": (last["flops_forward"] + last["flops_backward"]) * last.get("replicas", 1) / 1e9,
        "peak_rss_bytes": summary.get("peak_rss_bytes") or max(r.get("peak_rss_bytes", 0)
                                                                for r in records),
        "batch_size": summary.get("batch_size"),
    }


BUSY = 0.25  # cores of other load above which a run counts as disturbed
FAULTS_WARN = 20000  # PyTorch minor page faults a step (80 MB faulted in) that mean malloc returns memory


def per_repeat(medians, batch):
    """Each repeat's median images/s with the other load during it."""
    return ", ".join(f"{batch * 1000 / m:.0f}" + (f" (other load {o:.2f})" if o is not None else "")
                     for m, o in medians)


def spread(median, low, high):
    return f"{median:.0f} ({low:.0f}–{high:.0f})" if median == median else "—"


def gib(n):
    return f"{n / 2**30:.2f} GiB" if n else "—"


def fmt_rate(v):
    return f"{v:.0f}" if v == v else "—"


def fmt(v, spec, suffix=""):
    return f"{v:{spec}}{suffix}" if v == v else "—"


def cmd_summarize(args):
    out = args.dir
    meta = read_json(os.path.join(out, "meta.json")) or {}
    warmup = int(meta.get("warmup", 5))
    peak = meta.get("peak", {})
    f32, bf16 = peak.get("f32"), peak.get("bf16")
    rows = []
    with open(os.path.join(out, "rows.tsv")) as f:
        for line in f:
            slug, objective, model, config = line.rstrip("\n").split("\t")
            rows.append((slug, objective, model, config))

    detail, table, all_other = [], [], []
    for slug, objective, model, config in rows:
        folder = os.path.join(out, slug)
        reps = range(1, int(meta.get("repeats", 1)) + 1)
        t_steps, t_data, t_rss, t_med, t_other, gflop, batch = [], [], [], [], [], None, 256
        p_steps, p_rss, p_med, p_other, p_base, p_blas, p_params = [], [], [], [], [], set(), None
        p_faults = []
        for rep in reps:
            t = tally_run(os.path.join(folder, f"tally-rep{rep}"), warmup)
            te = read_json(os.path.join(folder, f"tally-rep{rep}.exec.json")) or {}
            if t and te.get("exit_code", 1) == 0:
                t_steps += t["step_ms"]
                t_data += t["data_ms"]
                t_rss.append(t["peak_rss_bytes"])
                gflop, batch = t["gflop"], t["batch_size"] or batch
                t_med.append((statistics.median(t["step_ms"]), te.get("other_load_cores")))
                if te.get("other_load_cores") is not None:
                    t_other.append(te["other_load_cores"])
            p = read_json(os.path.join(folder, f"torch-rep{rep}.json"))
            pe = read_json(os.path.join(folder, f"torch-rep{rep}.exec.json")) or {}
            if p and pe.get("exit_code", 1) == 0:
                ms = p["step_ms"][p["warmup"]:]
                p_steps += ms
                p_rss.append(p["peak_rss_bytes"])
                p_base.append(p.get("rss_after_import_bytes") or 0)
                p_med.append((statistics.median(ms), pe.get("other_load_cores")))
                p_blas.update(p.get("blas", []))
                p_params = p.get("parameters")
                if p.get("minor_faults_per_step") is not None:
                    p_faults.append(p["minor_faults_per_step"])
                if pe.get("other_load_cores") is not None:
                    p_other.append(pe["other_load_cores"])

        def rates(steps):
            if not steps:
                return float("nan"), float("nan"), float("nan"), float("nan"), float("nan")
            med = statistics.median(steps)
            return (batch * 1000 / med, batch * 1000 / percentile(steps, 0.9),
                    batch * 1000 / percentile(steps, 0.1), batch * 1000 / max(steps),
                    batch * 1000 / min(steps))

        t_rate, t_p90, t_p10, t_min, t_max = rates(t_steps)
        p_rate, p_p90, p_p10, p_min, p_max = rates(p_steps)
        t_gfs = gflop * t_rate / batch if gflop and t_steps else float("nan")
        p_gfs = gflop * p_rate / batch if gflop and p_steps else float("nan")
        other = t_other + p_other
        backbone = os.path.splitext(os.path.basename(model))[0]
        ratio = t_rate / p_rate if p_steps and t_steps else float("nan")
        rss_ratio = max(t_rss) / max(p_rss) if t_rss and p_rss else float("nan")
        detail.append(
            f"{objective}/{backbone} ({config}, {len(reps)} repeats, {len(t_steps)} + "
            f"{len(p_steps)} measured steps)\n"
            f"  Tally   : {fmt_rate(t_rate)} images/s median, p10-p90 {fmt_rate(t_p90)}-"
            f"{fmt_rate(t_p10)}, min-max {fmt_rate(t_min)}-{fmt_rate(t_max)}; per repeat "
            f"{per_repeat(t_med, batch)}; data wait median "
            f"{statistics.median(t_data) if t_data else float('nan'):.1f} ms; peak RSS "
            f"{', '.join(gib(r) for r in t_rss)}\n"
            f"  PyTorch : {fmt_rate(p_rate)} images/s median, p10-p90 {fmt_rate(p_p90)}-"
            f"{fmt_rate(p_p10)}, min-max {fmt_rate(p_min)}-{fmt_rate(p_max)}; per repeat "
            f"{per_repeat(p_med, batch)}; peak RSS "
            f"{', '.join(gib(r) for r in p_rss)} (after import torch: "
            f"{gib(max(p_base) if p_base else 0)}); {p_params} parameters; "
            f"BLAS {', '.join(sorted(p_blas)) or '?'}; minor page faults a measured step "
            f"{', '.join(f'{f:.0f}' for f in p_faults) or '?'}"
            f"{' (the allocator tunables did not take: PyTorch is slowed)' if p_faults and max(p_faults) > FAULTS_WARN else ''}\n"
            f"  GFLOP/step {gflop or float('nan'):.1f}: Tally {t_gfs:.0f} GFLOP/s, PyTorch "
            f"{p_gfs:.0f} GFLOP/s; other processes kept "
            f"{max(other) if other else float('nan'):.2f} cores busy at most (mean "
            f"{statistics.mean(other) if other else float('nan'):.2f})")
        frac = ((f"{100 * t_gfs / f32:.0f}%" if f32 else "—") + " / " +
                (f"{100 * t_gfs / bf16:.0f}%" if bf16 else "—"))
        all_other += other
        busy = fmt(max(other) if other else float("nan"), ".2f")
        if other and max(other) > BUSY:
            busy = f"**{busy}**"
        table.append(
            f"| {objective} | {backbone} | {spread(t_rate, t_p90, t_p10)} "
            f"| {spread(p_rate, p_p90, p_p10)} | {fmt(ratio, '.2f', '×')} "
            f"| {gib(max(t_rss) if t_rss else 0)} | {gib(max(p_rss) if p_rss else 0)} "
            f"| {fmt(rss_ratio, '.2f', '×')} | {fmt(gflop or float('nan'), '.1f')} "
            f"| {fmt(t_gfs, '.0f')} | {frac} "
            f"| {busy} |")

    lines = []
    lines.append("\n".join(detail))
    lines.append("")
    blas = [b for b in meta.get("blas", "").split(",") if b]
    shown = [b for b in blas if "openblas" in os.path.basename(b)] or blas
    blas_text = ", ".join(os.path.basename(os.path.dirname(b)) + "/" + os.path.basename(b)
                          for b in shown[-1:]) or "?"
    head = (f"Batch {meta.get('batch', 256)}, 2 threads each, median step of "
            f"{meta.get('steps', '?')} after {warmup} warm-up, {meta.get('repeats', '?')} "
            f"alternating Tally/PyTorch pairs per row (steps pooled; brackets: images/s at the "
            f"p90–p10 step time). PyTorch {meta.get('torch', '?')} with BLAS "
            f"`{blas_text}`, GLIBC_TUNABLES={meta.get('tunables', '?')}; Tally as "
            f"built, default malloc.")
    lines.append(head)
    lines.append("")
    lines.append("| objective | backbone | Tally images/s | PyTorch images/s | Tally/PyTorch "
                 "| Tally peak RSS | PyTorch peak RSS | RSS Tally/PyTorch | GFLOP/step "
                 "| Tally GFLOP/s | of f32 / bf16 peak | other load (cores, max) |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines += table
    lines.append("")
    if f32:
        lines.append(f"Measured peak (oneDNN {peak.get('onednn', '?')} matmul "
                     f"{peak.get('n', '?')}³, best of {peak.get('reps', '?')} before and of "
                     f"{peak.get('reps', '?')} after the rows): f32 {f32:.0f} GFLOP/s"
                     f" ({peak.get('f32_impl', '?')}), bf16 "
                     + (f"{bf16:.0f} GFLOP/s ({peak.get('bf16_impl', '?')})" if bf16 else
                        "not available") + ".")
    else:
        lines.append("Peak not measured (--no-peak, or the peak program failed: see peak.txt).")
    load0, load1 = meta.get("loadavg_start"), meta.get("loadavg_end")
    # Loaded: a busy machine at the start, or other processes busy during any run.
    loaded = (load0 is not None and load0 >= 1.5) or any(o > BUSY for o in all_other)
    lines.append(f"Load average (1 min) {load0} at the start, {load1} at the end (this benchmark "
                 f"itself adds about 2). Other load: the most cores other processes kept busy "
                 f"during one of the row's runs (/proc/stat less the run's own CPU time); above "
                 f"{BUSY} (bold) that row's numbers are disturbed, PyTorch's far more than "
                 f"Tally's." + (" **The machine was loaded: these numbers are not final.**"
                                if loaded else ""))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="train Tally's network in PyTorch and time the steps")
    run.add_argument("--config", required=True, help="a Tally run's resolved config.ini")
    run.add_argument("--objective", required=True, choices=["inbatch", "moco", "mae"])
    run.add_argument("--warmup", type=int, default=5)
    run.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--expect-params", type=int, default=0)
    run.add_argument("--params-only", action="store_true", help="print the parameter count")
    run.add_argument("--profile", type=int, default=0, metavar="STEPS",
                     help="after the measured steps, profile this many more, print the top ops")
    run.add_argument("--json", help="write the result here (default: stdout)")
    ex = sub.add_parser("exec", help="run a command and record its resources")
    ex.add_argument("--json", required=True)
    ex.add_argument("--log", help="the command's stdout and stderr go here")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    sm = sub.add_parser("summarize", help="the tables of a --vs-pytorch results folder")
    sm.add_argument("dir")
    args = parser.parse_args()
    return {"run": cmd_run, "exec": cmd_exec, "summarize": cmd_summarize}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
