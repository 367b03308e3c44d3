#!/usr/bin/python3
"""Checks that torchvision's own convnext_tiny is Tally's models/convnext_tiny.ini.

    /usr/bin/python3 tests/interop/torchvision_convnext.py frame SOURCE_IDX OUT_IDX N
    /usr/bin/python3 tests/interop/torchvision_convnext.py check EXPORT.safetensors \
        FEATURES.npy IMAGES [--tol 1e-4]

frame: the first N images of an IDX images file (Fashion-MNIST, 28 px) framed in black to 32 px
(convnext_tiny's four stages need 32 or more) and written as a plain IDX images file, their
labels beside it under the standard name (OUT_IDX must contain "-images-idx3-").

check: torchvision.models.convnext_tiny() loads the export with strict=False, missing only
classifier.2 (the Linear) and nothing unexpected; with classifier.2 = Identity in eval() mode it
gives the features Tally gave the same images (`tally embed ... --out FILE.npy`), within the
tolerance relative to the largest feature (or 1). The layer scales must have left 1e-6 (Tally's
training moved them), or a block's branch would hardly reach the features and a mistake in it
could pass. tally_torch.load_export must load the same file strictly and give the same features.
Prints the largest absolute difference; exits 1 on any failure.
"""

import argparse
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torchvision

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally_torch  # noqa: E402
from tally_torch.model import Preprocess, Spec  # noqa: E402
from roundtrip import read_idx_images  # noqa: E402


def frame(source, out, n):
    gray = read_idx_images(source, n)
    side = 32
    before = (side - gray.shape[1]) // 2
    framed = np.zeros((gray.shape[0], side, side), dtype=np.uint8)
    framed[:, before:before + gray.shape[1], before:before + gray.shape[2]] = gray
    with open(out, "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, framed.shape[0], side, side))
        f.write(framed.tobytes())
    labels = source.replace("-images-idx3-", "-labels-idx1-")
    opener = gzip.open if labels.endswith(".gz") else open
    with opener(labels, "rb") as f:
        magic, count = struct.unpack(">II", f.read(8))
        data = f.read(min(n, count))
    with open(out.replace("-images-idx3-", "-labels-idx1-"), "wb") as f:
        f.write(struct.pack(">II", magic, len(data)))
        f.write(data)
    return 0


def check(args):
    torch.set_num_threads(2)
    tensors, metadata = tally_torch.read_safetensors(args.export)
    net = torchvision.models.convnext_tiny()
    encoder = {n: t for n, t in tensors.items() if not n.startswith(("head.", "decoder."))}
    result = net.load_state_dict(encoder, strict=False)
    print(f"torchvision {torchvision.__version__} convnext_tiny(), strict=False: missing "
          f"{sorted(result.missing_keys)}, unexpected {sorted(result.unexpected_keys)}")
    if sorted(result.missing_keys) != ["classifier.2.bias", "classifier.2.weight"] or \
            result.unexpected_keys:
        print("FAIL: convnext_tiny should miss only classifier.2", file=sys.stderr)
        return 1
    scales = [t.abs().max().item() for n, t in encoder.items() if n.endswith("layer_scale")]
    print(f"{len(scales)} layer scales, the smallest's largest entry {min(scales):.3g}")
    if len(scales) != 18 or min(scales) < 1e-3:
        print("FAIL: the layer scales are still near 1e-6: the blocks' branches are not tested",
              file=sys.stderr)
        return 1
    net.classifier[2] = torch.nn.Identity()
    net.eval()

    expected = np.load(args.features)
    gray = read_idx_images(args.images, expected.shape[0])
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    preprocess = Preprocess(Spec(metadata))
    with torch.no_grad():
        got = net(preprocess(rgb)).numpy()
    if got.shape != expected.shape:
        print(f"FAIL: torchvision's features are {got.shape}, Tally's {expected.shape}",
              file=sys.stderr)
        return 1
    diff = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())
    scale = max(1.0, float(np.abs(expected).max()))
    print(f"convnext_tiny: {got.shape[0]} images x {got.shape[1]} features: max |torchvision - "
          f"tally| = {diff:.3g} (max |tally| = {float(np.abs(expected).max()):.3g}, tolerance "
          f"{args.tol:g} x {scale:.3g})")
    if not np.isfinite(got).all() or not diff <= args.tol * scale:
        print("FAIL: torchvision's features differ from Tally's", file=sys.stderr)
        return 1
    # tally_torch builds the same network from the file's metadata and loads it strictly.
    model = tally_torch.load_export(args.export)
    with torch.no_grad():
        mine = model(model.preprocess(rgb)).numpy()
    diff = float(np.abs(mine.astype(np.float64) - expected.astype(np.float64)).max())
    print(f"tally_torch.load_export: max |tally_torch - tally| = {diff:.3g}")
    if mine.shape != expected.shape or not np.isfinite(mine).all() or \
            not diff <= args.tol * scale:
        print("FAIL: tally_torch's ConvNeXt differs from Tally's features", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("frame")
    f.add_argument("source")
    f.add_argument("out")
    f.add_argument("n", type=int)
    c = sub.add_parser("check")
    c.add_argument("export")
    c.add_argument("features")
    c.add_argument("images")
    c.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    if args.command == "frame":
        return frame(args.source, args.out, args.n)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
