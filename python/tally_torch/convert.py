"""A Tally ResNet's weights under torchvision's names.

Tally's resnet (stem, stage{s}.block{b}, proj/proj_bn) is torchvision's ResNet of basic blocks
with the small-image stem: conv1 a 3x3 convolution of stride 1 without bias, no max-pool. With
models/resnet18-small-images.ini (64 -> 64, 128, 256, 512 channels, two blocks a stage) that is

    net = torchvision.models.resnet18()
    net.conv1 = torch.nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = torch.nn.Identity()
    net.fc = torch.nn.Identity()          # the encoder ends at the pooled features
    net.load_state_dict(tally_torch.torchvision_state_dict("encoder.safetensors"))

and net(model.preprocess(files)) gives Tally's features. torchvision_resnet() does all of it.
"""

import re
from collections import OrderedDict

import torch

from .model import Spec, read_safetensors

_BN_MEMBERS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
# torchvision's constructor for each stage_blocks of basic blocks at 64..512 channels.
_TORCHVISION_BASIC = {(2, 2, 2, 2): "resnet18", (3, 4, 6, 3): "resnet34"}


def _rename(name):
    """Tally's ResNet parameter name -> torchvision's, or None for what is not the encoder's."""
    if name.startswith(("head.", "decoder.")):
        return None
    m = re.fullmatch(r"stem\.conv\.weight", name)
    if m:
        return "conv1.weight"
    m = re.fullmatch(r"stem\.bn\.(\w+)", name)
    if m:
        return f"bn1.{m[1]}"
    m = re.fullmatch(r"stage(\d+)\.block(\d+)\.(conv1|bn1|conv2|bn2|proj|proj_bn)\.(\w+)", name)
    if not m:
        raise ValueError(f"{name}: not a parameter of Tally's resnet")
    stage, block, part, member = int(m[1]), int(m[2]) - 1, m[3], m[4]
    part = {"proj": "downsample.0", "proj_bn": "downsample.1"}.get(part, part)
    return f"layer{stage}.{block}.{part}.{member}"


def torchvision_state_dict(source):
    """OrderedDict of the encoder's tensors under torchvision ResNet names (conv1, bn1,
    layer{s}.{b}.*, layer{s}.0.downsample.{0,1}.*), every BatchNorm with num_batches_tracked.
    source: an export's path, or (tensors, metadata) as read_safetensors returns. The projection
    head or MAE decoder of a --with-head export is left out; there is no `fc`: load it into a
    network whose fc is Identity (features) or one whose fc you train (strict=False, then check
    that only fc.weight and fc.bias were missing)."""
    tensors, metadata = read_safetensors(source) if isinstance(source, str) else source
    spec = Spec(metadata)
    if spec.backbone != "resnet":
        raise ValueError(f"a {spec.backbone} encoder has no torchvision ResNet equivalent")
    if spec.pad_to != spec.image_size:
        raise ValueError(f"the model frames its {spec.image_size}-pixel images to {spec.pad_to} "
                         "(pad_to), which torchvision's ResNet does not do")
    out = OrderedDict()
    for name, tensor in tensors.items():
        new = _rename(name)
        if new is not None:
            out[new] = tensor
    for name in list(out):  # BatchNorm modules carry a step count torchvision expects
        if name.endswith(".running_var"):
            counted = name[: -len("running_var")] + "num_batches_tracked"
            out.setdefault(counted, torch.tensor(0, dtype=torch.long))
    return out


def torchvision_name(spec):
    """"resnet18" or "resnet34" when torchvision's constructor builds this encoder's layout,
    else None."""
    basic = spec.stem_channels == 64 and spec.stage_channels == [64, 128, 256, 512] \
        and spec.stage_strides == [1, 2, 2, 2]
    return _TORCHVISION_BASIC.get(tuple(spec.stage_blocks)) if basic else None


def torchvision_resnet(path):
    """torchvision's resnet18/resnet34 with the small-image stem and fc = Identity, the export's
    weights loaded strictly, in eval() mode: a torch.nn.Module whose output is Tally's features.
    Needs torchvision (Debian's python3-torchvision)."""
    import torchvision  # optional: only this function needs it

    tensors, metadata = read_safetensors(path)
    spec = Spec(metadata)
    name = torchvision_name(spec) if spec.backbone == "resnet" else None
    if name is None:
        raise ValueError(f"{path}: not a layout torchvision's resnet18 or resnet34 builds "
                         "(models/resnet18-small-images.ini is one)")
    net = getattr(torchvision.models, name)()
    net.conv1 = torch.nn.Conv2d(spec.channels, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = torch.nn.Identity()
    net.fc = torch.nn.Identity()
    net.load_state_dict(torchvision_state_dict((tensors, metadata)), strict=True)
    return net.eval()
