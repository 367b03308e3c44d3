"""Load a Tally encoder in PyTorch.

`tally export RUN --out encoder.safetensors` writes a trained encoder under PyTorch's names and
layouts; this module rebuilds the same network with torch.nn and loads it strictly:

    import tally_torch
    model = tally_torch.load_export("encoder.safetensors")     # eval() mode, strict load
    x = model.preprocess(["a.jpg", "b.png"])   # image files -> float (N, C, S, S), as Tally
    features = model(x)                        # (N, D), what `tally embed` writes

The architecture is read from the file's own metadata (`config` and `model` are the INI texts of
the run, `input_mean` / `input_std` its input normalization), so nothing has to be told twice.
The networks mirror Tally's C code (src/nn/resnet.c, src/nn/vit.c, src/nn/transformer.c,
src/nn/head.c, src/objectives/mae.c):

resnet  torchvision's ResNet without fc, under its names: a conv stem (no bias; 3x3 stride 1, or
        with stem = imagenet 7x7 stride 2) -> BatchNorm -> ReLU [-> 3x3 max-pool of stride 2]
        -> stages of basic blocks [conv3x3(stride) -> BN -> ReLU -> conv3x3 -> BN] or
        bottleneck blocks [conv1x1 -> BN -> ReLU -> conv3x3(stride) -> BN -> ReLU -> conv1x1 to
        4x -> BN], plus the input or a 1x1 conv + BN projection (downsample) when the shape
        changes, summed, ReLU -> global average pool. BatchNorm eps 1e-5, running statistics
        at inference.
vit     patches of P x P (a Conv2d with kernel = stride = P) + fixed 2-D sin-cos positions
        [cls token first, with no position, when pool = cls] -> pre-norm blocks
        [x + proj(attn(norm1(x))), x + fc2(GELU(fc1(norm2(x))))] -> LayerNorm -> the cls token
        or the mean of all tokens. LayerNorm eps 1e-6, exact (erf) GELU, qkv laid out
        [q | k | v], each split into heads as [head 0 | head 1 | ...], scores scaled 1/sqrt(Dh).
convnext torchvision's ConvNeXt (v1) without the classifier's Linear, under its names: a 4x4
        stride-4 conv + LayerNorm over channels -> stages of blocks [x + layer_scale *
        fc2(GELU(fc1(LayerNorm(depthwise 7x7 conv(x)))))], a LayerNorm + 2x2 stride-2 conv
        between stages -> global average pool -> LayerNorm (classifier.0). LayerNorm eps 1e-6,
        exact GELU, no stochastic depth (as in eval()).

Both see the normalized image framed to `pad_to` when the model file sets it (floor((pad_to - S)
/ 2) rows/columns above/left, the rest below/right) with black as the normalization maps it,
(0 - mean) / std per channel: the same as padding the raw image with 0 before normalizing
(torchvision's Pad), not zeros after it. Each encoder holds that value as its `pad_value` buffer.

No safetensors package is needed (NumPy and PyTorch, plus Pillow for image files): a safetensors
file is an 8-byte little-endian header length, a JSON header, then the raw little-endian tensor
data.
"""

import configparser
import json
import math
import os
import struct
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from . import images
from .names import torchvision_names

BATCHNORM_EPS = 1e-5  # src/ops/batchnorm.c
LAYERNORM_EPS = 1e-6  # src/ops/layernorm.c

# ---------------------------------------------------------------------------------------------
# safetensors without the safetensors package

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


def read_safetensors(path):
    """Returns (tensors, metadata): {name: torch.Tensor} and the header's __metadata__ dict."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + header_len:]
    tensors = OrderedDict()
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, not read here")
        begin, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: {name} {info['dtype']}{list(shape)} has {end - begin} bytes")
        array = np.frombuffer(data[begin:end], dtype=dtype, count=count).reshape(shape)
        tensors[name] = torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))
    return tensors, metadata


# ---------------------------------------------------------------------------------------------
# The architecture, from the export's metadata


def _ini(text):
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"),
                                       inline_comment_prefixes=None, strict=False)
    parser.read_string(text)
    return parser


def _ints(text):
    return [int(v) for v in text.split(",") if v.strip()]


class Spec:
    """What the network needs to know, read from an export's (or a checkpoint's) metadata."""

    def __init__(self, metadata):
        if "config" not in metadata or "model" not in metadata:
            raise ValueError("the file's metadata has no config/model: not a Tally export")
        config, model = _ini(metadata["config"]), _ini(metadata["model"])
        bb = model["backbone"]
        self.backbone = bb.get("type")
        self.image_size = config.getint("data", "image_size")
        self.channels = config.getint("data", "channels")
        self.pad_to = bb.getint("pad_to", 0) or self.image_size
        self.pad_fill = bb.get("pad_fill", "black")
        # How an image file becomes a view (tally_torch.images): the centred square, or squashed.
        self.crop = "center" if config.getboolean("data", "stream", fallback=True) else "squash"
        # resnet (exports from before the stem and block keys have the small stem, basic blocks)
        self.stem = bb.get("stem", "small")
        self.block = bb.get("block", "basic")
        self.stem_channels = bb.getint("stem_channels")
        self.stage_channels = _ints(bb.get("stage_channels", ""))
        self.stage_blocks = _ints(bb.get("stage_blocks", ""))
        self.stage_strides = _ints(bb.get("stage_strides", ""))
        # vit
        self.patch_size = bb.getint("patch_size")
        self.dim = bb.getint("dim")
        self.depth = bb.getint("depth")
        self.heads = bb.getint("heads")
        self.mlp_ratio = bb.getint("mlp_ratio")
        self.pool = bb.get("pool") if self.backbone == "vit" else "avg"
        # convnext
        self.stage_dims = _ints(bb.get("stage_dims", ""))
        self.stage_depths = _ints(bb.get("stage_depths", ""))
        # projection head (inbatch, moco) and MAE decoder (mae): present with --with-head
        self.head_hidden_dim = config.getint("model", "head_hidden_dim", fallback=0)
        self.head_out_dim = config.getint("model", "head_out_dim", fallback=0)
        self.decoder_dim = config.getint("mae", "decoder_dim", fallback=0)
        self.decoder_depth = config.getint("mae", "decoder_depth", fallback=0)
        self.decoder_heads = config.getint("mae", "decoder_heads", fallback=0)
        # input normalization: (x / 255 - mean) / std per channel
        self.mean = [float(v) for v in metadata.get("input_mean", "").split(",") if v]
        self.std = [float(v) for v in metadata.get("input_std", "").split(",") if v]
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError("the file's metadata lacks input_mean/input_std for every channel")

    def pad(self):
        """Frame rows/columns (before, after) around the image: floor above/left, rest after."""
        before = (self.pad_to - self.image_size) // 2
        return before, self.pad_to - self.image_size - before


class Preprocess(nn.Module):
    """Images -> normalized (N, C, S, S), as Tally's evaluation transform:

    - image files (a path or a list of paths): decoded and cropped as Tally does
      (tally_torch.images.load_image at the run's size, channels and `data.stream`);
    - arrays (N, S, S) or (N, S, S, C), uint8 or float on the 0..255 scale, already at the
      training size S (what load_images returns, or IDX images).
    Then x / 255 (clamped to [0, 1]) and (x - mean) / std per channel."""

    def __init__(self, spec):
        super().__init__()
        self.size, self.channels, self.crop = spec.image_size, spec.channels, spec.crop
        shape = (1, spec.channels, 1, 1)
        self.register_buffer("mean", torch.tensor(spec.mean).view(shape), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(shape), persistent=False)

    def load(self, paths):
        """float32 (N, S, S, C) on 0..255: the files' views at this encoder's size."""
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        return images.load_images([os.fspath(p) for p in paths], self.size, self.channels,
                                  self.crop)

    def forward(self, images_or_paths):
        x = images_or_paths
        if isinstance(x, (str, bytes, os.PathLike)) or (
                isinstance(x, (list, tuple)) and x and isinstance(x[0], (str, bytes, os.PathLike))):
            x = self.load(x)
        x = torch.as_tensor(np.array(x))  # a copy: writable
        if x.dim() == 3:
            x = x.unsqueeze(-1)
        if tuple(x.shape[1:]) != (self.size, self.size, self.channels):
            raise ValueError(f"images are {tuple(x.shape[1:])}, the encoder takes "
                             f"({self.size}, {self.size}, {self.channels}) HWC; pass image "
                             "files to have them cropped and resized as Tally does")
        x = (x.permute(0, 3, 1, 2).to(torch.float32) / 255.0).clamp(0.0, 1.0)
        return (x - self.mean) / self.std


def pad_value(spec):
    """(C,) normalized black, or 0 with pad_fill = mean, float32 as Tally computes it
    (src/nn/backbone.c)."""
    mean = torch.tensor(spec.mean, dtype=torch.float32)
    std = torch.tensor(spec.std, dtype=torch.float32)
    if spec.pad_fill == "mean":
        return torch.zeros_like(mean)
    return (0.0 - mean) / std


def frame(x, value, spec):
    """x: normalized (N, C, S, S) -> (N, C, pad_to, pad_to), centred in a frame of `value` (C,)."""
    before, after = spec.pad()
    if not (before or after):
        return x
    n, c, size = x.shape[0], x.shape[1], spec.pad_to
    out = value.view(1, c, 1, 1).expand(n, c, size, size).clone()
    out[:, :, before:before + spec.image_size, before:before + spec.image_size] = x
    return out


# --- ResNet ----------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width, eps=BATCHNORM_EPS)
        self.conv2 = nn.Conv2d(width, width, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width, eps=BATCHNORM_EPS)
        self.downsample = _projection(in_ch, width, stride)

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    """torchvision's v1.5: the stride in the 3x3."""
    expansion = 4

    def __init__(self, in_ch, width, stride):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width, eps=BATCHNORM_EPS)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width, eps=BATCHNORM_EPS)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch, eps=BATCHNORM_EPS)
        self.downsample = _projection(in_ch, out_ch, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(out)))))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


def _projection(in_ch, out_ch, stride):
    """The 1x1 convolution + BatchNorm shortcut where the shape changes, else None."""
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_ch, eps=BATCHNORM_EPS))


class ResNet(nn.Module):
    """Tally's resnet under torchvision's names (conv1, bn1, layer{s}.{b}.*, downsample.{0,1}),
    as `tally export` writes them: stem = small is a 3x3 conv of stride 1, imagenet torchvision's
    7x7 of stride 2 and 3x3 max-pool of stride 2."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        imagenet = spec.stem == "imagenet"
        k, stride = (7, 2) if imagenet else (3, 1)
        self.conv1 = nn.Conv2d(spec.channels, spec.stem_channels, k, stride=stride,
                               padding=k // 2, bias=False)
        self.bn1 = nn.BatchNorm2d(spec.stem_channels, eps=BATCHNORM_EPS)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if imagenet else nn.Identity()
        block = Bottleneck if spec.block == "bottleneck" else BasicBlock
        ch = spec.stem_channels
        for s, (width, blocks, stride) in enumerate(
                zip(spec.stage_channels, spec.stage_blocks, spec.stage_strides), start=1):
            layer = []
            for b in range(blocks):
                layer.append(block(ch, width, stride if b == 0 else 1))
                ch = width * block.expansion
            self.add_module(f"layer{s}", nn.Sequential(*layer))
        self.num_stages = len(spec.stage_channels)
        self.feature_dim = ch
        # Derived from input_mean/input_std, not a tensor of the export: not in the state_dict.
        self.register_buffer("pad_value", pad_value(spec), persistent=False)

    def forward(self, x):
        """x: normalized images (N, C, S, S) -> features (N, D)."""
        # The stem's own zero padding then surrounds the frame, as Tally's stem does.
        x = self.maxpool(F.relu(self.bn1(self.conv1(frame(x, self.pad_value, self.spec)))))
        for s in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{s}")(x)
        return x.mean(dim=(2, 3))


# --- ViT -------------------------------------------------------------------------------------


def sincos_pos_embed(grid, dim):
    """(grid*grid, dim): row gy*grid+gx = [sin(gx w), cos(gx w), sin(gy w), cos(gy w)],
    w_k = 10000^(-k / (dim/4)), k < dim/4 (src/nn/vit.c, vit_sincos_pos_embed)."""
    quarter = dim // 4
    omega = 10000.0 ** (-np.arange(quarter, dtype=np.float64) / quarter)
    gy, gx = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64),
                         indexing="ij")
    ax, ay = gx.reshape(-1, 1) * omega, gy.reshape(-1, 1) * omega
    table = np.concatenate([np.sin(ax), np.cos(ax), np.sin(ay), np.cos(ay)], axis=1)
    return torch.from_numpy(table.astype(np.float32))


class PatchEmbed(nn.Module):
    def __init__(self, channels, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x):  # (N, C, H, W) -> (N, G*G, D), patches row-major over the grid
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        # PyTorch 2's fused F.scaled_dot_product_attention (the same scale) instead of the three
        # ops below: what a PyTorch 2 user writes; scripts/bench_torch.py turns it on.
        self.sdpa = False

    def forward(self, x):
        N, T, D = x.shape
        q, k, v = self.qkv(x).reshape(N, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(N, T, D))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # exact (erf) form, as oneDNN's gelu_erf
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYERNORM_EPS)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=LAYERNORM_EPS)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Tally's vit: state_dict keys patch_embed.proj.*, cls_token (pool = cls), blocks.{i}.*, norm.*."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        D = spec.dim
        self.patch_embed = PatchEmbed(spec.channels, D, spec.patch_size)
        if spec.pool == "cls":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.blocks = nn.ModuleList(Block(D, spec.heads, spec.mlp_ratio) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(D, eps=LAYERNORM_EPS)
        self.grid = spec.pad_to // spec.patch_size
        # Fixed, not a parameter: not in the state_dict.
        self.register_buffer("pos_embed", sincos_pos_embed(self.grid, D), persistent=False)
        self.register_buffer("pad_value", pad_value(spec), persistent=False)
        self.feature_dim = D

    def tokens(self, x):
        """x: normalized images (N, C, S, S) -> final-LayerNorm tokens (N, T, D), cls first."""
        x = self.patch_embed(frame(x, self.pad_value, self.spec)) + self.pos_embed
        if self.spec.pool == "cls":  # the cls token has no position embedding
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, x):
        """x: normalized images (N, C, S, S) -> features (N, D)."""
        t = self.tokens(x)
        return t[:, 0] if self.spec.pool == "cls" else t.mean(dim=1)


# --- What --with-head adds -------------------------------------------------------------------


class _LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of (N, C, H, W), torchvision's LayerNorm2d."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)


class ConvNeXtBlock(nn.Module):
    """torchvision's CNBlock in eval(): block.{0, 2, 3, 5} are the depthwise conv, the norm and
    the two linear layers (on channels-last rows), layer_scale is (C, 1, 1)."""

    def __init__(self, dim):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim), _Permute((0, 2, 3, 1)),
            nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 4 * dim), nn.GELU(),
            nn.Linear(4 * dim, dim), _Permute((0, 3, 1, 2)))
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-6))

    def forward(self, x):
        return x + self.layer_scale * self.block(x)


class ConvNeXt(nn.Module):
    """Tally's convnext: state_dict keys features.*, classifier.0.* (torchvision's)."""

    def __init__(self, spec):
        super().__init__()
        dims, depths = spec.stage_dims, spec.stage_depths
        if not dims or len(dims) != len(depths):
            raise ValueError("a convnext model needs stage_dims and stage_depths of one length")
        layers = [nn.Sequential(nn.Conv2d(spec.channels, dims[0], 4, stride=4),
                                _LayerNorm2d(dims[0], eps=1e-6))]
        for s, (dim, depth) in enumerate(zip(dims, depths)):
            if s:
                layers.append(nn.Sequential(_LayerNorm2d(dims[s - 1], eps=1e-6),
                                            nn.Conv2d(dims[s - 1], dim, 2, stride=2)))
            layers.append(nn.Sequential(*[ConvNeXtBlock(dim) for _ in range(depth)]))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(_LayerNorm2d(dims[-1], eps=1e-6))
        self.feature_dim = dims[-1]

    def forward(self, x):
        x = self.features(x).mean(dim=(2, 3), keepdim=True)
        return self.classifier(x).flatten(1)


class ProjectionHead(nn.Module):
    """inbatch/moco: Linear -> BatchNorm1d -> ReLU -> Linear (src/nn/head.c)."""

    def __init__(self, in_dim, hidden, out_dim):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.bn = nn.BatchNorm1d(hidden, eps=BATCHNORM_EPS)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, features):
        return self.fc2(F.relu(self.bn(self.fc1(features))))


class MaeDecoder(nn.Module):
    """mae: the light decoder (src/objectives/mae.c). mask_token is (Dd,), as the export keeps it.
    tests/test_torch_roundtrip.sh checks that it loads; its forward is not compared with Tally's."""

    def __init__(self, spec):
        super().__init__()
        Dd = spec.decoder_dim
        self.has_cls = spec.pool == "cls"
        self.embed = nn.Linear(spec.dim, Dd)
        self.mask_token = nn.Parameter(torch.zeros(Dd))
        self.blocks = nn.ModuleList(
            Block(Dd, spec.decoder_heads, spec.mlp_ratio) for _ in range(spec.decoder_depth))
        self.norm = nn.LayerNorm(Dd, eps=LAYERNORM_EPS)
        self.pred = nn.Linear(Dd, spec.patch_size * spec.patch_size * spec.channels)
        grid = spec.pad_to // spec.patch_size
        self.register_buffer("pos_embed", sincos_pos_embed(grid, Dd), persistent=False)

    def forward(self, tokens, keep):
        """tokens (N, has_cls + K, D): the encoder's on the visible patches `keep` (N, K), in
        that order -> per-patch pixel predictions (N, G*G, P*P*C), each patch (py, px, c)."""
        N, P = tokens.shape[0], self.pos_embed.shape[0]
        emb = self.embed(tokens)
        first = 1 if self.has_cls else 0
        x = self.mask_token.expand(N, P, -1).clone()
        # .to: under autocast the embedding is bf16 and the mask token stays fp32
        x.scatter_(1, keep.unsqueeze(-1).expand(-1, -1, x.shape[2]), emb[:, first:].to(x.dtype))
        x = x + self.pos_embed
        if self.has_cls:
            x = torch.cat([emb[:, :1].to(x.dtype), x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.pred(self.norm(x))[:, first:]


# ---------------------------------------------------------------------------------------------


def build_model(metadata, head=None):
    """The encoder an export describes. head: None, "projection" (head.*) or "decoder" (MAE's
    decoder.*), the module --with-head adds; it becomes the child `head` or `decoder`."""
    spec = Spec(metadata)
    if spec.backbone == "resnet":
        model = ResNet(spec)
    elif spec.backbone == "vit":
        model = ViT(spec)
    elif spec.backbone == "convnext":
        model = ConvNeXt(spec)
    else:
        raise ValueError(f"unknown backbone type {spec.backbone!r}")
    model.preprocess = Preprocess(spec)
    if head == "projection":
        model.head = ProjectionHead(model.feature_dim, spec.head_hidden_dim, spec.head_out_dim)
    elif head == "decoder":
        model.decoder = MaeDecoder(spec)
    elif head is not None:
        raise ValueError(f"unknown head {head!r}")
    return model


def head_kind(tensors):
    """Which --with-head part a state dict holds: None, "projection" or "decoder"."""
    if any(name.startswith("head.") for name in tensors):
        return "projection"
    if any(name.startswith("decoder.") for name in tensors):
        return "decoder"
    return None


def load_export(path, strict=True):
    """Builds the encoder an export describes, loads it (strictly: every tensor in the file has
    its module and every module its tensor) and returns it in eval() mode."""
    tensors, metadata = read_safetensors(path)
    if metadata.get("format") == "tally-export-1" and Spec(metadata).backbone == "resnet":
        tensors = torchvision_names(tensors)  # a ResNet exported under Tally's own names
    model = build_model(metadata, head=head_kind(tensors))
    model.load_state_dict(tensors, strict=strict)
    return model.eval()
