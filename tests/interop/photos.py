#!/usr/bin/python3
"""Checks that tally_torch reproduces `tally embed` on a folder of image files: the package's
loader decodes and crops each file as Tally does, the export's encoder embeds it, and every
feature must be within the tolerance of Tally's.

    /usr/bin/python3 tests/interop/photos.py EXPORT.safetensors FEATURES.npy FOLDER \
        [--tol 1e-4] [--torchvision | --torchvision-names]

FEATURES.npy is `tally embed EXPORT --data FOLDER --out FEATURES.npy`; its FEATURES.rows.txt
names each row's file, and tally_torch.list_images(FOLDER) must list the same files in the same
order. The largest |difference| is printed for the JPEG rows and for the others apart (JPEGs go
through Pillow's draft() to libjpeg's reduced decode, PNG and BMP are decoded whole).

--torchvision: the export converted to torchvision's names loads strictly into torchvision's
resnet18 with the small-image stem (tally_torch.torchvision_resnet) and gives the same features;
a resnet18 with a classifier (fc) of its own misses exactly fc.weight and fc.bias.
--torchvision-names: without torchvision, the converted names are held to resnet18's as
torchvision 0.14 spells them (written out below).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
if not os.environ.get("TALLY_TORCH_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
import tally_torch  # noqa: E402


def resnet18_names():
    """torchvision.models.resnet18()'s state_dict keys without fc, written out by hand."""
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    names = ["conv1.weight"] + [f"bn1.{m}" for m in bn]
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}.{block}"
            names += [f"{p}.conv1.weight"] + [f"{p}.bn1.{m}" for m in bn]
            names += [f"{p}.conv2.weight"] + [f"{p}.bn2.{m}" for m in bn]
            if layer > 1 and block == 0:
                names += [f"{p}.downsample.0.weight"] + [f"{p}.downsample.1.{m}" for m in bn]
    return names


def max_diff(got, expected):
    if not got.size:
        return 0.0
    return float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())


def check_torchvision(args, x, expected):
    failures = 0
    net = tally_torch.torchvision_resnet(args.export)
    with torch.no_grad():
        got = net(x).numpy()
    diff = max_diff(got, expected)
    print(f"torchvision resnet18 (3x3 stem, no max-pool, fc = Identity), strict load: "
          f"max |torchvision - tally| = {diff:.3g}")
    if not diff <= args.tol:
        print("FAIL: torchvision's resnet18 does not give Tally's features", file=sys.stderr)
        failures += 1
    import torchvision
    classifier = torchvision.models.resnet18(num_classes=7)
    classifier.conv1 = torch.nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    classifier.maxpool = torch.nn.Identity()
    result = classifier.load_state_dict(tally_torch.torchvision_state_dict(args.export),
                                        strict=False)
    if sorted(result.missing_keys) != ["fc.bias", "fc.weight"] or result.unexpected_keys:
        print(f"FAIL: a resnet18 with its own fc: missing {result.missing_keys}, unexpected "
              f"{result.unexpected_keys}", file=sys.stderr)
        failures += 1
    return failures


def check_names(args):
    names = sorted(tally_torch.torchvision_state_dict(args.export))
    want = sorted(resnet18_names())
    if names != want:
        print(f"FAIL: converted names differ from resnet18's: extra "
              f"{sorted(set(names) - set(want))}, missing {sorted(set(want) - set(names))}",
              file=sys.stderr)
        return 1
    print(f"the converted state dict has resnet18's {len(want)} names (torchvision absent)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="safetensors written by `tally export`")
    ap.add_argument("features", help=".npy written by `tally embed` on FOLDER")
    ap.add_argument("folder", help="the folder Tally embedded")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest allowed |difference|")
    tv = ap.add_mutually_exclusive_group()
    tv.add_argument("--torchvision", action="store_true")
    tv.add_argument("--torchvision-names", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)

    stem = args.features[:-4] if args.features.endswith(".npy") else args.features
    with open(stem + ".rows.txt", encoding="utf-8") as f:
        rows = f.read().splitlines()
    listed = tally_torch.list_images(args.folder)
    if [os.path.abspath(p) for p in listed] != [os.path.abspath(p) for p in rows]:
        print(f"FAIL: list_images({args.folder}) gives {listed}, tally embed's rows {rows}",
              file=sys.stderr)
        return 1

    model = tally_torch.load_export(args.export)
    expected = np.load(args.features)
    x = model.preprocess(rows)
    with torch.no_grad():
        got = model(x).numpy()
    if got.shape != expected.shape:
        print(f"FAIL: PyTorch features are {got.shape}, Tally's {expected.shape}", file=sys.stderr)
        return 1
    jpeg = np.array([tally_torch.images.is_jpeg(p) for p in rows], dtype=bool)
    spec = model.preprocess
    print(f"{os.path.basename(args.export)}: {len(rows)} files at {spec.size} px, "
          f"{spec.channels} channel(s), crop={spec.crop}: max |torch - tally| = "
          f"{max_diff(got[jpeg], expected[jpeg]):.3g} over {int(jpeg.sum())} JPEGs, "
          f"{max_diff(got[~jpeg], expected[~jpeg]):.3g} over {int((~jpeg).sum())} PNG/BMP "
          f"(max |tally| = {float(np.abs(expected).max()):.3g}, tolerance {args.tol:g})")
    failures = 0
    if not np.isfinite(got).all() or not max_diff(got, expected) <= args.tol:
        print("FAIL: the PyTorch features differ from Tally's", file=sys.stderr)
        failures += 1
    if args.torchvision:
        failures += check_torchvision(args, x, expected)
    if args.torchvision_names:
        failures += check_names(args)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
