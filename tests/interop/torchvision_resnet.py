#!/usr/bin/python3
"""Checks that torchvision's own ResNet is Tally's: torchvision.models.NAME() loads the export
with strict=False missing only fc.weight and fc.bias (nothing unexpected), and with fc = Identity
in eval() mode it gives the features Tally gave the same images (`tally embed ... --out
FILE.npy`).

    /usr/bin/python3 tests/interop/torchvision_resnet.py NAME EXPORT.safetensors FEATURES.npy \
        IMAGES [--tol 1e-4]

NAME: resnet18 or resnet50. IMAGES: the IDX images file Tally embedded (gray, which Tally's
3-channel run repeated into R, G and B); its first N images are used, N = the rows of
FEATURES.npy. Prints the largest absolute difference; exits 1 when it is above the tolerance
(relative to the largest feature, or 1) or not finite, or when the load is not as above.
"""

import argparse
import os
import sys

import numpy as np
import torch
import torchvision

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally_torch  # noqa: E402
from roundtrip import read_idx_images  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=["resnet18", "resnet50"])
    ap.add_argument("export")
    ap.add_argument("features")
    ap.add_argument("images")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(2)

    tensors, metadata = tally_torch.read_safetensors(args.export)
    net = getattr(torchvision.models, args.name)()
    result = net.load_state_dict(tally_torch.torchvision_state_dict((tensors, metadata)),
                                 strict=False)
    print(f"torchvision {torchvision.__version__} {args.name}(), strict=False: missing "
          f"{sorted(result.missing_keys)}, unexpected {sorted(result.unexpected_keys)}")
    if sorted(result.missing_keys) != ["fc.bias", "fc.weight"] or result.unexpected_keys:
        print(f"FAIL: {args.name} should miss only fc", file=sys.stderr)
        return 1
    # The export's own tensors, not a converted copy: its names are torchvision's already.
    exported = {n for n in tensors if not n.startswith(("head.", "decoder."))}
    if exported != set(net.state_dict()) - {"fc.weight", "fc.bias"}:
        print("FAIL: the export's names are not the network's", file=sys.stderr)
        return 1
    net.fc = torch.nn.Identity()
    net.eval()

    expected = np.load(args.features)
    gray = read_idx_images(args.images, expected.shape[0])
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    preprocess = tally_torch.build_model(metadata).preprocess
    with torch.no_grad():
        got = net(preprocess(rgb)).numpy()
    if got.shape != expected.shape:
        print(f"FAIL: torchvision's features are {got.shape}, Tally's {expected.shape}",
              file=sys.stderr)
        return 1
    diff = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())
    scale = max(1.0, float(np.abs(expected).max()))
    print(f"{args.name}: {got.shape[0]} images x {got.shape[1]} features: max |torchvision - "
          f"tally| = {diff:.3g} (max |tally| = {float(np.abs(expected).max()):.3g}, tolerance "
          f"{args.tol:g} x {scale:.3g})")
    if not np.isfinite(got).all() or not diff <= args.tol * scale:
        print("FAIL: torchvision's features differ from Tally's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
