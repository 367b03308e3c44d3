#!/usr/bin/python3
"""Checks that PyTorch reproduces a Tally encoder: builds the network an export describes,
loads the export with load_state_dict(strict=True), embeds the same images Tally embedded and
compares with Tally's features (`tally embed ... --out FILE.npy`).

    /usr/bin/python3 tests/interop/roundtrip.py EXPORT.safetensors FEATURES.npy IMAGES [--tol 1e-4]

IMAGES: the IDX images file (.gz or not) Tally embedded; its first N images are used, N = the
rows of FEATURES.npy. Prints the largest absolute difference over all N x D feature values;
exits 1 when it is above the tolerance (or not finite), or when the export does not load.
"""

import argparse
import gzip
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
# The repository's package (python/tally_torch), ahead of an installed copy, unless
# TALLY_TORCH_INSTALLED is set: then the test holds the installed package to the same bound.
if not os.environ.get("TALLY_TORCH_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
import tally_torch  # noqa: E402


def read_idx_images(path, limit):
    """uint8 (N, H, W) from an IDX3 file (Fashion-MNIST / MNIST layout)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic, n, h, w = struct.unpack(">IIII", f.read(16))
        if magic != 0x00000803:
            raise ValueError(f"{path}: not an IDX3 uint8 images file (magic {magic:#x})")
        n = min(n, limit)
        data = f.read(n * h * w)
    return np.frombuffer(data, dtype=np.uint8).reshape(n, h, w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="safetensors written by `tally export`")
    ap.add_argument("features", help=".npy written by `tally embed` (N, D) float32")
    ap.add_argument("images", help="the IDX images file Tally embedded")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest allowed |difference|")
    args = ap.parse_args()

    torch.set_num_threads(2)
    try:
        tensors, metadata = tally_torch.read_safetensors(args.export)
        head = tally_torch.head_kind(tensors)
        model = tally_torch.build_model(metadata, head=head)
        model.load_state_dict(tensors, strict=True)
    except Exception as err:  # a missing/unexpected key, a shape, a bad file: all failures
        print(f"FAIL: {args.export} does not load into the PyTorch model: {err}", file=sys.stderr)
        return 1
    model.eval()

    expected = np.load(args.features)
    if expected.dtype != np.float32 or expected.ndim != 2:
        print(f"FAIL: {args.features} is {expected.dtype} {expected.shape}, expected float32 "
              "(N, D)", file=sys.stderr)
        return 1
    images = read_idx_images(args.images, expected.shape[0])
    if images.shape[0] != expected.shape[0]:
        print(f"FAIL: {args.images} has {images.shape[0]} images, {args.features} "
              f"{expected.shape[0]} rows", file=sys.stderr)
        return 1

    with torch.no_grad():
        got = model(model.preprocess(images)).numpy()
    if got.shape != expected.shape:
        print(f"FAIL: PyTorch features are {got.shape}, Tally's {expected.shape}", file=sys.stderr)
        return 1
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    max_diff = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    n_params = sum(t.numel() for t in tensors.values())
    print(f"{os.path.basename(args.export)}: {metadata.get('backbone')} pool={metadata.get('pool')}"
          f"{' +' + head if head else ''}, {len(tensors)} tensors ({n_params} values) loaded "
          f"strictly; {got.shape[0]}x{got.shape[1]} features: max |torch - tally| = "
          f"{max_diff:.3g} (max |tally| = {scale:.3g}, tolerance {args.tol:g})")
    if not np.isfinite(got).all() or not np.isfinite(max_diff) or max_diff > args.tol:
        print("FAIL: the PyTorch features differ from Tally's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
