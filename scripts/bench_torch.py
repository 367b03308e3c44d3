#!/usr/bin/python3
"""The PyTorch side of `scripts/bench.sh --vs-pytorch`, and the measuring around both sides.

    bench_torch.py run --config RUN/config.ini --objective OBJ [--setting fp32] [--warmup 5]
                       [--steps 20] [--expect-params N] [--json OUT.json]
        Trains Tally's network for that run (the resolved config.ini every Tally run folder
        holds: model file, batch, optimizer, objective settings) in PyTorch for warmup + steps
        steps on random inputs and writes per-step times, peak RSS and the BLAS library it used.
        --setting is how PyTorch runs: fp32 or bf16 (torch.autocast on the CPU), then -cl
        (channels_last, ResNets) or -sdpa (F.scaled_dot_product_attention, ViTs), then -compile
        (torch.compile of the whole step); a setting that cannot run here writes its reason
        ("unavailable") instead of times, e.g. "does not compile: ...".
    bench_torch.py exec --json OUT.json -- COMMAND...
        Runs COMMAND and records its wall time, CPU time, peak RSS (wait4) and how busy the
        machine's other processes kept the CPUs meanwhile (/proc/stat minus COMMAND's CPU time).
    bench_torch.py summarize DIR
        The tables of a `bench.sh --vs-pytorch` results folder: DIR/summary.md and summary.json.
    bench_torch.py summarize-stacks DIR
        The table of a `bench.sh --stacks` results folder, the same two files.

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


def parse_setting(name):
    """A PyTorch setting's name -> (precision, fast path, compiled): fp32 or bf16 (autocast), then
    -cl (channels_last, ResNets) or -sdpa (F.scaled_dot_product_attention, ViTs), then -compile
    (torch.compile of the whole step), e.g. fp32, bf16-cl, bf16-sdpa-compile."""
    parts = name.split("-")
    compiled = parts[-1] == "compile"
    if compiled:
        parts = parts[:-1]
    if parts[0] not in ("fp32", "bf16") or parts[1:] not in ([], ["cl"], ["sdpa"]):
        raise argparse.ArgumentTypeError(f"unknown setting {name!r} (e.g. fp32, bf16-cl, "
                                         f"fp32-sdpa-compile)")
    return parts[0], (parts[1] if len(parts) > 1 else None), compiled


def setting_name(name):
    parse_setting(name)
    return name


def torch_onednn_version(torch):
    """The oneDNN PyTorch was built with, from torch.__config__.show() ("MKL-DNN v3.7.2")."""
    import re

    found = re.search(r"MKL-DNN v([0-9][0-9.]*)", torch.__config__.show())
    return found.group(1) if found else None


def compile_missing(torch):
    """Why torch.compile cannot work here before trying it (inductor builds C++ on the CPU), or
    None."""
    import shutil
    import sysconfig

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    cxx = os.environ.get("CXX", "g++")
    if not shutil.which(cxx):
        return f"no C++ compiler ({cxx}) on PATH: inductor needs one (g++)"
    include = sysconfig.get_paths().get("include") or "?"
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers ({include}/Python.h): inductor needs python3-dev"
    return None


def build_networks(cfg, spec, objective, tally_torch):
    """The trainable encoder and head, built as Tally builds them for this objective."""
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
    return encoder, head


def make_optimizer(cfg, params, torch):
    """SGD or AdamW as the config says, PyTorch's default implementations; the learning-rate
    schedule is left out (a constant lr costs the same)."""
    name = cfg.get("optim", "name")
    lr = cfg.getfloat("optim", "lr")
    wd = cfg.getfloat("optim", "weight_decay")
    if name == "sgd":
        return name, torch.optim.SGD(params, lr=lr, momentum=cfg.getfloat("optim", "momentum"),
                                     weight_decay=wd)
    if name == "adamw":
        return name, torch.optim.AdamW(params, lr=lr, betas=(cfg.getfloat("optim", "beta1"),
                                                             cfg.getfloat("optim", "beta2")),
                                       eps=cfg.getfloat("optim", "eps"), weight_decay=wd)
    sys.exit(f"bench_torch: optimizer {name!r} has no PyTorch mirror here")


class Step:
    """What every objective's step needs: the networks, the optimizer, the batch's shape, the
    precision context (autocast in bf16) and the input layout (channels_last or not)."""

    def __init__(self, torch, cfg, spec, online, optimizer, amp, layout):
        self.torch, self.cfg, self.spec = torch, cfg, spec
        self.online, self.encoder, self.head = online, online["encoder"], online["head"]
        self.optimizer, self.amp, self.layout = optimizer, amp, layout
        self.B = cfg.getint("train", "batch_size")
        self.C, self.S = spec.channels, spec.image_size

    def images(self, x):
        return x.contiguous(memory_format=self.layout)

    def update(self, loss):
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def inbatch_step(s):
    """SimCLR NT-Xent over the 2B views; 2 views an image."""
    import torch.nn.functional as F

    torch, B = s.torch, s.B
    T = s.cfg.getfloat("inbatch", "temperature")
    eye = torch.eye(2 * B, dtype=torch.bool)
    labels = torch.cat([torch.arange(B) + B, torch.arange(B)])

    def step(views):
        with s.amp():
            z = F.normalize(s.head(s.encoder(s.images(views.reshape(2 * B, s.C, s.S, s.S)))), dim=1)
            logits = (z @ z.t() / T).masked_fill(eye, float("-inf"))
            loss = F.cross_entropy(logits.float(), labels)
        s.update(loss)
        return loss

    return step, 2


def moco_step(s):
    """MoCo v2: queries with backward, keys through the momentum copy, a (K x d) FIFO queue."""
    import copy

    import torch.nn.functional as F

    torch, cfg, B = s.torch, s.cfg, s.B
    T = cfg.getfloat("moco", "temperature")
    K = cfg.getint("moco", "queue_size")
    m = cfg.getfloat("moco", "momentum")
    if cfg.getint("moco", "symmetric", fallback=0):
        sys.exit("bench_torch: moco.symmetric = 1 is not mirrored here")
    key_net = copy.deepcopy(s.online)
    key_net.train()  # batch statistics, as Tally's key encoder
    for p in key_net.parameters():
        p.requires_grad_(False)
    key_params = list(key_net.parameters())
    online_params = list(s.online.parameters())
    queue = F.normalize(torch.randn(K, s.spec.head_out_dim), dim=1)
    zeros = torch.zeros(B, dtype=torch.long)
    ptr = torch.zeros((), dtype=torch.long)  # a tensor, so that a compiled step does not recompile

    def step(views):
        with s.amp():
            with torch.no_grad():
                k = F.normalize(key_net["head"](key_net["encoder"](s.images(views[1]))), dim=1)
            q = F.normalize(s.head(s.encoder(s.images(views[0]))), dim=1)
            l_pos = (q * k).sum(dim=1, keepdim=True)
            l_neg = q @ queue.t().to(q.dtype)
            loss = F.cross_entropy(torch.cat([l_pos, l_neg], dim=1).float() / T, zeros)
        s.update(loss)
        with torch.no_grad():
            for pk, pq in zip(key_params, online_params):
                pk.mul_(m).add_(pq.detach(), alpha=1.0 - m)
            # FIFO: the B new keys replace the oldest (K need not be a multiple of B).
            idx = (torch.arange(B) + ptr) % K
            queue[idx] = k.float()
            ptr.copy_((ptr + B) % K)
        return loss

    return step, 2


def mae_step(s):
    """MAE: random masking, the encoder on the visible patches, the decoder on all positions."""
    from tally_torch.model import frame

    torch, cfg, spec, encoder = s.torch, s.cfg, s.spec, s.encoder
    r = cfg.getfloat("mae", "mask_ratio")
    norm_pix = cfg.getint("mae", "norm_pix_loss")
    Pp, C = spec.patch_size, s.C
    G = spec.pad_to // Pp
    L = G * G
    n_keep = max(1, int(L * (1.0 - r)))
    D = spec.dim

    def patchify(x):  # (N, C, H, W) -> (N, L, P*P*C), each patch (py, px, c), as vit_patchify
        N = x.shape[0]
        x = x.reshape(N, C, G, Pp, G, Pp).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(N, L, Pp * Pp * C)

    def step(views):
        imgs = frame(views[0], encoder.pad_value, spec)
        N = imgs.shape[0]
        noise = torch.rand(N, L)
        keep = torch.argsort(noise, dim=1)[:, :n_keep]
        with s.amp():
            x = encoder.patch_embed(imgs) + encoder.pos_embed
            x = torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, D))
            if spec.pool == "cls":
                x = torch.cat([encoder.cls_token.expand(N, -1, -1).to(x.dtype), x], dim=1)
            for block in encoder.blocks:
                x = block(x)
            pred = s.head(encoder.norm(x), keep).float()  # (N, L, P*P*C)
        target = patchify(imgs)
        if norm_pix:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        mask = torch.ones(N, L)
        mask.scatter_(1, keep, 0.0)
        loss = (((pred - target) ** 2).mean(dim=-1) * mask).sum() / mask.sum()
        s.update(loss)
        return loss

    return step, 1


STEPS = {"inbatch": inbatch_step, "moco": moco_step, "mae": mae_step}


def write_result(args, result):
    text = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def unavailable(args, torch, reason):
    """The setting cannot run here: its reason is its result (the summary shows it)."""
    print(f"bench_torch: {args.setting}: {reason}", file=sys.stderr)
    write_result(args, {"side": "pytorch", "setting": args.setting, "unavailable": reason,
                        "torch": torch.__version__, "onednn_version": torch_onednn_version(torch)})
    return 0


def setup_setting(args, torch, encoder, spec):
    """Applies the setting to the built encoder: (autocast context, input layout), or a reason
    it cannot run."""
    import contextlib

    precision, fast, compiled = parse_setting(args.setting)
    layout = torch.contiguous_format
    if fast == "cl":
        if spec.backbone != "resnet":
            return None, None, "channels_last is the ResNets' setting"
        layout = torch.channels_last
        encoder.to(memory_format=layout)
    elif fast == "sdpa":
        import torch.nn.functional as F

        if spec.backbone != "vit":
            return None, None, "scaled_dot_product_attention is the ViTs' setting"
        if not hasattr(F, "scaled_dot_product_attention"):
            return None, None, f"torch {torch.__version__} has no scaled_dot_product_attention"
    if compiled:
        missing = compile_missing(torch)
        if missing:
            return None, None, f"does not compile: {missing}"
    if precision == "bf16":
        return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), layout, None
    return contextlib.nullcontext, layout, None


def cmd_run(args):
    rss_before_import = proc_status_bytes("VmRSS")
    import torch

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
    encoder, head = build_networks(cfg, spec, args.objective, tally_torch)
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
    amp, layout, reason = setup_setting(args, torch, encoder, spec)
    if reason:
        return unavailable(args, torch, reason)
    for module in online.modules():
        if isinstance(module, tally_torch.Attention):
            module.sdpa = "sdpa" in args.setting.split("-")
    opt_name, optimizer = make_optimizer(cfg, params, torch)
    step, n_views = STEPS[args.objective](Step(torch, cfg, spec, online, optimizer, amp, layout))
    warmup = args.warmup
    if parse_setting(args.setting)[2]:
        # Random ops in the compiled graph draw from PyTorch's generator as eager code does, so
        # every setting trains on the same masks; the first two calls compile (the second again,
        # once the optimizer has state): measured after at least three.
        torch._inductor.config.fallback_random = True
        step = torch.compile(step)
        warmup = max(warmup, 3)
    measured = measure(args, torch, step, n_views, spec, cfg.getint("train", "batch_size"),
                       warmup)
    if isinstance(measured, str):
        return unavailable(args, torch, measured)
    step_ms, losses, faults_measured, blas = measured
    usage = resource.getrusage(resource.RUSAGE_SELF)
    B = cfg.getint("train", "batch_size")
    result = {
        "side": "pytorch",
        "setting": args.setting,
        "objective": args.objective,
        "model_file": os.path.relpath(model_file, ROOT),
        "backbone": spec.backbone,
        "batch_size": B,
        "input": f"{spec.image_size}x{spec.image_size}x{spec.channels} padded to {spec.pad_to}",
        "parameters": n_params,
        "optimizer": opt_name,
        "warmup": warmup,
        "steps": args.steps,
        "step_ms": step_ms,
        "first_step_seconds": step_ms[0] / 1e3,  # with torch.compile: compiling it
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
        "onednn_version": torch_onednn_version(torch),
        "threads": torch.get_num_threads(),
        "blas": blas,
        "onednn": loaded_libraries("dnnl", "mkldnn"),
        "mkldnn_enabled": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
    }
    write_result(args, result)
    med = statistics.median(step_ms[warmup:]) if args.steps else float("nan")
    print(f"bench_torch: {args.objective} {os.path.basename(model_file)} {args.setting}: median "
          f"{med:.1f} ms/step, {B * 1000 / med:.1f} images/s, peak RSS "
          f"{result['peak_rss_bytes'] / 2**20:.0f} MiB, blas {','.join(blas) or 'none mapped'}",
          file=sys.stderr)
    return 0


def measure(args, torch, step, n_views, spec, B, warmup):
    """Runs warmup + steps steps on random inputs made outside the timer: (step times, losses,
    minor page faults in the measured steps, the BLAS mapped), or why the step failed when it was
    compiled (an eager failure is a bug and raises)."""
    step_ms, losses, blas = [], [], []
    faults_measured = 0  # minor page faults inside the measured steps' timers
    compiled = parse_setting(args.setting)[2]
    for i in range(warmup + args.steps):
        views = torch.randn(n_views, B, spec.channels, spec.image_size, spec.image_size)
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        try:
            loss = step(views)
        except Exception as e:  # noqa: BLE001 - inductor raises many kinds
            if not compiled:
                raise
            first = (str(e).strip().splitlines() or [""])[0][:300]
            return f"does not compile: {type(e).__name__}: {first}"
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if i >= warmup:
            faults_measured += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        losses.append(float(loss))
        if i == 0:
            blas = loaded_libraries("blas")  # mapped by now: the first step ran matmuls
    if args.profile:  # where PyTorch's step goes, op by op (a few more steps, not in the result)
        with torch.autograd.profiler.profile() as prof:
            for _ in range(args.profile):
                step(torch.randn(n_views, B, spec.channels, spec.image_size, spec.image_size))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
              file=sys.stderr)
    return step_ms, losses, faults_measured, blas

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


def spread(median, low, high):
    return f"{median:.0f} ({low:.0f}–{high:.0f})" if median == median else "—"


def gib(n):
    return f"{n / 2**30:.2f} GiB" if n else "—"


def fmt(v, spec, suffix=""):
    return f"{v:{spec}}{suffix}" if v == v else "—"


def read_rows(out):
    """rows.tsv: (slug, objective, model file, config, [run ids "SIDE:SETTING" ...])."""
    rows = []
    with open(os.path.join(out, "rows.tsv")) as f:
        for line in f:
            slug, objective, model, config, runs = line.rstrip("\n").split("\t")
            rows.append((slug, objective, model, config, runs.split()))
    return rows


def rate_stats(steps_ms, batch):
    """images/s at the median step, and at the p90 and p10 step times (slow and fast end)."""
    return {"images_per_s": batch * 1000 / statistics.median(steps_ms),
            "images_per_s_p90_step": batch * 1000 / percentile(steps_ms, 0.9),
            "images_per_s_p10_step": batch * 1000 / percentile(steps_ms, 0.1),
            "measured_steps": len(steps_ms)}


def tally_setting(folder, name, reps, warmup):
    """One Tally setting of a row over its repeats: rates, GFLOP/step, peak RSS, other load."""
    steps, data, rss, other, gflop, batch, failed = [], [], [], [], None, None, []
    for rep in reps:
        t = tally_run(os.path.join(folder, f"{name}-rep{rep}"), warmup)
        te = read_json(os.path.join(folder, f"{name}-rep{rep}.exec.json")) or {}
        if not t or te.get("exit_code", 1) != 0:
            failed.append(f"repeat {rep} failed: see {name}-rep{rep}.log")
            continue
        steps += t["step_ms"]
        data += t["data_ms"]
        rss.append(t["peak_rss_bytes"])
        gflop, batch = t["gflop"], t["batch_size"]
        if te.get("other_load_cores") is not None:
            other.append(te["other_load_cores"])
    if not steps:
        return {"unavailable": "; ".join(failed) or "not run"}
    result = rate_stats(steps, batch)
    result.update({"gflop_per_step": gflop, "gflop_per_s": gflop * result["images_per_s"] / batch,
                   "peak_rss_bytes": max(rss), "other_load_max": max(other) if other else None,
                   "batch_size": batch, "data_wait_ms_median": statistics.median(data)})
    return result


def torch_setting(folder, name, reps):
    """One PyTorch setting of a row over its repeats, or the reason it could not run."""
    steps, rss, other, firsts, info, batch, reason = [], [], [], [], {}, None, None
    for rep in reps:
        p = read_json(os.path.join(folder, f"{name}-rep{rep}.json"))
        pe = read_json(os.path.join(folder, f"{name}-rep{rep}.exec.json")) or {}
        if not p:
            reason = reason or f"no result: see {name}-rep{rep}.log"
            continue
        if "unavailable" in p:
            reason = reason or p["unavailable"]
            continue
        steps += p["step_ms"][p["warmup"]:]
        rss.append(p["peak_rss_bytes"])
        firsts.append(p["first_step_seconds"])
        batch = p["batch_size"]
        info = p
        if pe.get("other_load_cores") is not None:
            other.append(pe["other_load_cores"])
    if not steps:
        return {"unavailable": reason or "not run"}
    result = rate_stats(steps, batch)
    result.update({"peak_rss_bytes": max(rss), "other_load_max": max(other) if other else None,
                   "batch_size": batch, "loss_first": info["loss_first"],
                   "first_step_seconds": max(firsts), "torch": info["torch"],
                   "onednn_version": info.get("onednn_version"), "blas": info.get("blas", []),
                   "minor_faults_per_step": info.get("minor_faults_per_step"),
                   "parameters": info.get("parameters")})
    return result


# Same seed, same inputs: a setting's first loss is fp32's up to its arithmetic (relative).
LOSS_AGREES = {"fp32": 1e-3, "bf16": 5e-2}


def precision_of(run):
    return run.split(":", 1)[1].split("-")[0]


def best_of(settings, runs):
    """The run id with the most images/s among runs, or None."""
    ok = [r for r in runs if "images_per_s" in settings.get(r, {})]
    return max(ok, key=lambda r: settings[r]["images_per_s"]) if ok else None


def vs_row(out, meta, slug, objective, model, config, runs):
    """One --vs-pytorch row: every setting's numbers, the bests and the ratios."""
    folder = os.path.join(out, slug)
    reps = range(1, int(meta.get("repeats", 1)) + 1)
    warmup = int(meta.get("warmup", 5))
    settings = {}
    for run in runs:
        side, setting = run.split(":", 1)
        name = f"{side}-{setting}"
        settings[run] = (tally_setting(folder, name, reps, warmup) if side == "tally"
                         else torch_setting(folder, name, reps))
    gflop = next((s["gflop_per_step"] for s in settings.values() if s.get("gflop_per_step")), None)
    reference = settings.get("torch:fp32", {}).get("loss_first")
    for run, s in settings.items():
        if gflop and "images_per_s" in s:
            s["gflop_per_s"] = gflop * s["images_per_s"] / s["batch_size"]
        if run.startswith("torch:") and "loss_first" in s and reference is not None:
            tol = LOSS_AGREES[precision_of(run)]
            agrees = abs(s["loss_first"] - reference) <= tol * abs(reference)
            s["loss_first_agrees_with_fp32"] = agrees
    best, ratios = {}, {}
    for p in ("fp32", "bf16", "overall"):
        of_p = [r for r in runs if p in ("overall", precision_of(r))]
        torch_runs = [r for r in of_p if r.startswith("torch:")]
        tally_runs = [r for r in of_p if r.startswith("tally:")]
        best[p] = {"pytorch": best_of(settings, torch_runs), "tally": best_of(settings, tally_runs)}
        t, q = best[p]["tally"], best[p]["pytorch"]
        ratios[p] = settings[t]["images_per_s"] / settings[q]["images_per_s"] if t and q else None
    return {"slug": slug, "objective": objective,
            "backbone": os.path.splitext(os.path.basename(model))[0], "config": config,
            "gflop_per_step": gflop, "settings": settings, "best": best,
            "tally_over_pytorch": ratios}


def rate_cell(s):
    if "images_per_s" not in s:
        return "—"
    return spread(s["images_per_s"], s["images_per_s_p90_step"], s["images_per_s_p10_step"])


def best_cell(row, p, side):
    run = row["best"][p][side]
    return f"{row['settings'][run]['images_per_s']:.0f} ({run.split(':', 1)[1]})" if run else "—"


def gflops_cell(s, peak, precision):
    """GFLOP/s, with its fraction of the measured matmul peak of its precision when there is one."""
    rate = s.get("gflop_per_s", float("nan"))
    top = peak.get("f32" if precision == "fp32" else "bf16")
    return fmt(rate, ".0f") + (f" ({100 * rate / top:.0f}% of peak)" if top and rate == rate else "")


def setting_lines(row, peak):
    """The Markdown table of one row's settings (peak: meta.json's measured matmul peak)."""
    lines = [f"**{row['objective']}/{row['backbone']}** ({row['config']}, "
             f"{fmt(row['gflop_per_step'] or float('nan'), '.1f')} GFLOP/step)", "",
             "| setting | images/s (p90–p10 step) | peak RSS | GFLOP/s | other load | note |",
             "| --- | --- | --- | --- | --- | --- |"]
    for run, s in row["settings"].items():
        side, setting = run.split(":", 1)
        label = {"tally": "Tally", "torch": "PyTorch", "torch113": "PyTorch 1.13"}[side]
        label += f" {setting}"
        notes = []
        if "unavailable" in s:
            notes.append(s["unavailable"])
        if "loss_first" in s:
            notes.append(f"first loss {s['loss_first']:.4f}")
            if s.get("loss_first_agrees_with_fp32") is False:
                notes.append("**differs from fp32's: not the same training**")
        if setting.endswith("compile") and "first_step_seconds" in s:
            notes.append(f"first step (compiling) {s['first_step_seconds']:.0f} s")
        if (s.get("minor_faults_per_step") or 0) > FAULTS_WARN:
            notes.append("the allocator tunables did not take")
        other = s.get("other_load_max")
        busy = fmt(other if other is not None else float("nan"), ".2f")
        lines.append(f"| {label} | {rate_cell(s)} | {gib(s.get('peak_rss_bytes', 0))} "
                     f"| {gflops_cell(s, peak, setting.split('-')[0])} "
                     f"| {f'**{busy}**' if other is not None and other > BUSY else busy} "
                     f"| {'; '.join(notes)} |")
    return lines


def machine_lines(meta):
    """What a reader needs to place the numbers: CPU, date, run shape, load."""
    lines = [f"CPU {meta.get('cpu', '?')} ({meta.get('cpus', '?')} CPUs), {meta.get('date', '?')}; "
             f"batch {meta.get('batch', '?')} (photo rows {meta.get('photo_batch', '?')}), "
             f"2 threads each, median step of {meta.get('steps', '?')} after "
             f"{meta.get('warmup', '?')} warm-up, {meta.get('repeats', '?')} alternating repeats (steps pooled). "
             f"`scripts/bench.sh {meta.get('flags', '')}`."]
    if meta.get("quick"):
        lines.append("**--quick: a check that the path runs end to end, not a measurement.**")
    return lines


def load_lines(meta, rows):
    other = [s["other_load_max"] for row in rows for s in row["settings"].values()
             if s.get("other_load_max") is not None]
    load0 = meta.get("loadavg_start")
    loaded = (load0 is not None and load0 >= 1.5) or any(o > BUSY for o in other)
    return [f"Load average (1 min) {load0} at the start, {meta.get('loadavg_end')} at the end "
            f"(this benchmark itself adds about 2). Other load: the most cores other processes "
            f"kept busy during one of the setting's runs; above {BUSY} (bold) it is disturbed."
            + (" **The machine was loaded: these numbers are not final.**" if loaded else "")]


def peak_lines(meta):
    peak = meta.get("peak", {})
    f32, bf16 = peak.get("f32"), peak.get("bf16")
    if not f32:
        return ["Peak not measured (--no-peak, --quick, or the peak program failed: see peak.txt)."]
    reps = peak.get("reps", "?")
    return [f"Measured peak (oneDNN {peak.get('onednn', '?')} matmul {peak.get('n', '?')}³, best "
            f"of {reps} before and of {reps} after the rows): f32 {f32:.0f} GFLOP/s "
            f"({peak.get('f32_impl', '?')}), bf16 "
            + (f"{bf16:.0f} GFLOP/s ({peak.get('bf16_impl', '?')})" if bf16 else "not available")
            + "."]


def cmd_summarize(args):
    out = args.dir
    meta = read_json(os.path.join(out, "meta.json")) or {}
    rows = [vs_row(out, meta, *r) for r in read_rows(out)]
    torch_info = next((s for row in rows for run, s in row["settings"].items()
                       if run.startswith("torch:") and "torch" in s), {})
    old_info = next((s for row in rows for run, s in row["settings"].items()
                     if run.startswith("torch113:") and "torch" in s), None)
    blas = sorted({os.path.basename(b) for b in torch_info.get("blas", [])})
    lines = machine_lines(meta)
    lines.append(
        f"Tally as built (oneDNN {meta.get('tally_onednn') or '?'}, default malloc) in fp32 and "
        f"`train.precision = bf16`; PyTorch {torch_info.get('torch', '?')} (oneDNN "
        f"{torch_info.get('onednn_version') or '?'}, {meta.get('torch_where', '?')}, BLAS "
        f"{', '.join(blas) or '?'}, GLIBC_TUNABLES={meta.get('tunables', '?')}) in fp32 and bf16 "
        f"autocast, each eager, with its fast path (cl: channels_last; sdpa: "
        f"F.scaled_dot_product_attention) and "
        + ("compiled (torch.compile of the whole step, fast path on)"
           if meta.get("compiled_settings", "measured") == "measured"
           else "not compiled (--no-compile: torch.compile's settings left out)")
        + (f"; PyTorch {old_info['torch']} fp32 for reference" if old_info else "") + ".")
    lines += ["", "| objective | backbone | Tally fp32 | Tally bf16 | PyTorch best fp32 "
              "| PyTorch best bf16 | Tally/PyTorch fp32 | Tally/PyTorch bf16 "
              "| best Tally/best PyTorch |" + (" PyTorch 1.13 fp32 |" if old_info else ""),
              "| --- " * (9 + (1 if old_info else 0)) + "|"]
    for row in rows:
        s, ratio = row["settings"], row["tally_over_pytorch"]
        cells = [row["objective"], row["backbone"], rate_cell(s.get("tally:fp32", {})),
                 rate_cell(s.get("tally:bf16", {})), best_cell(row, "fp32", "pytorch"),
                 best_cell(row, "bf16", "pytorch")]
        cells += [fmt(ratio[p] if ratio[p] else float("nan"), ".2f", "×")
                  for p in ("fp32", "bf16", "overall")]
        if old_info:
            cells.append(rate_cell(s.get("torch113:fp32", {})))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for row in rows:
        lines += setting_lines(row, meta.get("peak", {})) + [""]
    lines += peak_lines(meta) + load_lines(meta, rows)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"meta": meta, "pytorch": {k: torch_info.get(k) for k in
                                             ("torch", "onednn_version", "blas")},
                   "rows": rows}, f, indent=1)
    print(text, end="")
    return 0


def cmd_summarize_stacks(args):
    """The table of a `bench.sh --stacks` results folder: Tally on the host's oneDNN and on the
    Debian 13 root's, side by side."""
    out = args.dir
    meta = read_json(os.path.join(out, "meta.json")) or {}
    reps = range(1, int(meta.get("repeats", 1)) + 1)
    warmup = int(meta.get("warmup", 5))
    host, root = meta.get("host_onednn") or "?", meta.get("root_onednn") or "?"
    lines = machine_lines(meta)
    lines.append(f"Tally built on the host (oneDNN {host}) and in the Debian 13 root (oneDNN "
                 f"{root}, gcc 14), from the same sources, alternately; default malloc.")
    lines += ["", f"| objective | backbone | precision | images/s, oneDNN {host} "
              f"| images/s, oneDNN {root} | {root} / {host} | GFLOP/s {host} | GFLOP/s {root} "
              f"| peak RSS {host} | peak RSS {root} | other load (max) |",
              "| --- " * 11 + "|"]
    rows = []
    for slug, objective, model, config, runs in read_rows(out):
        folder = os.path.join(out, slug)
        settings = {run: tally_setting(folder, run.replace(":", "-"), reps, warmup) for run in runs}
        backbone = os.path.splitext(os.path.basename(model))[0]
        rows.append({"slug": slug, "objective": objective, "backbone": backbone,
                     "config": config, "settings": settings})
        for p in sorted({precision_of(r) for r in runs}, key=["fp32", "bf16"].index):
            h, d = settings.get(f"host:{p}", {}), settings.get(f"debian13:{p}", {})
            ratio = (d["images_per_s"] / h["images_per_s"]
                     if "images_per_s" in h and "images_per_s" in d else float("nan"))
            other = [s["other_load_max"] for s in (h, d) if s.get("other_load_max") is not None]
            other_text = fmt(max(other) if other else float("nan"), ".2f")
            why = "; ".join(f"{k}: {s['unavailable']}" for k, s in (("host", h), ("Debian 13", d))
                            if "unavailable" in s)
            lines.append(
                f"| {objective} | {backbone} | {p} | {rate_cell(h)} | {rate_cell(d)} "
                f"| {fmt(ratio, '.2f', '×')} | {fmt(h.get('gflop_per_s', float('nan')), '.0f')} "
                f"| {fmt(d.get('gflop_per_s', float('nan')), '.0f')} "
                f"| {gib(h.get('peak_rss_bytes', 0))} | {gib(d.get('peak_rss_bytes', 0))} "
                f"| {other_text}{' — ' + why if why else ''} |")
    lines.append("")
    lines += load_lines(meta, rows)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
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
    run.add_argument("--setting", default="fp32", type=setting_name,
                     help="fp32 or bf16 (autocast), then -cl (ResNets: channels_last) or -sdpa "
                          "(ViTs: scaled_dot_product_attention), then -compile (torch.compile)")
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
    ss = sub.add_parser("summarize-stacks", help="the table of a --stacks results folder")
    ss.add_argument("dir")
    args = parser.parse_args()
    return {"run": cmd_run, "exec": cmd_exec, "summarize": cmd_summarize,
            "summarize-stacks": cmd_summarize_stacks}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
