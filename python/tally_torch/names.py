"""Tensor names of a Tally ResNet export: format tally-export-1 named them as Tally does
(stem.conv, stage{s}.block{b}, proj/proj_bn), format tally-export-2 as torchvision's ResNet does
(conv1, bn1, layer{s}.{b}..., downsample.{0,1}). Both model.py (reading a format-1 file) and
convert.py (torchvision's networks) rename through here.
"""

import re
from collections import OrderedDict


def _rename(name):
    """A tally-export-1 ResNet tensor name -> torchvision's; other names (head.*, decoder.*)
    as they are."""
    if name.startswith(("head.", "decoder.")):
        return name
    m = re.fullmatch(r"stem\.(conv|bn)\.(\w+)", name)
    if m:
        return f"{'conv1' if m[1] == 'conv' else 'bn1'}.{m[2]}"
    m = re.fullmatch(r"stage(\d+)\.block(\d+)\.(conv\d|bn\d|proj|proj_bn)\.(\w+)", name)
    if not m:
        raise ValueError(f"{name}: not a parameter of Tally's resnet")
    stage, block, part, member = int(m[1]), int(m[2]) - 1, m[3], m[4]
    part = {"proj": "downsample.0", "proj_bn": "downsample.1"}.get(part, part)
    return f"layer{stage}.{block}.{part}.{member}"


def torchvision_names(tensors):
    """A tally-export-1 ResNet state dict under torchvision's names (format 2's)."""
    return OrderedDict((_rename(name), t) for name, t in tensors.items())
