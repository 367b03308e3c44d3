"""A Tally ResNet in torchvision.

`tally export` (format tally-export-2) names a ResNet's tensors as torchvision's ResNet does:
conv1, bn1, layer{s}.{b}.conv1 ... and layer{s}.0.downsample.{0,1}, with no fc. With the ImageNet
stem ([backbone] stem = imagenet: models/resnet18.ini, models/resnet50.ini) the export is
torchvision's own network without fc:

    net = torchvision.models.resnet50()
    result = net.load_state_dict(tally_torch.torchvision_state_dict("encoder.safetensors"),
                                 strict=False)      # result.missing_keys: fc.weight, fc.bias
    net.fc = torch.nn.Identity()                    # the encoder ends at the pooled features

With the small-image stem (models/resnet18-small-images.ini) conv1 is a 3x3 convolution of
stride 1 and there is no max-pool:

    net.conv1 = torch.nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = torch.nn.Identity()

Either way net(model.preprocess(files)) gives Tally's features; torchvision_resnet() does all of
it. Exports of format tally-export-1 named the tensors as Tally does (stem.conv,
stage{s}.block{b}, proj/proj_bn): torchvision_names() renames them.
"""

from collections import OrderedDict

import torch

from .model import Spec, read_safetensors
from .names import torchvision_names

# torchvision's constructor for each (block, stage_blocks) at 64 -> 64..512 channels.
_TORCHVISION = {
    ("basic", (2, 2, 2, 2)): "resnet18", ("basic", (3, 4, 6, 3)): "resnet34",
    ("bottleneck", (3, 4, 6, 3)): "resnet50", ("bottleneck", (3, 4, 23, 3)): "resnet101",
    ("bottleneck", (3, 8, 36, 3)): "resnet152",
}


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
    if metadata.get("format") == "tally-export-1":
        tensors = torchvision_names(tensors)
    out = OrderedDict((name, t) for name, t in tensors.items()
                      if not name.startswith(("head.", "decoder.")))
    for name in list(out):  # BatchNorm modules carry a step count torchvision expects
        if name.endswith(".running_var"):
            counted = name[: -len("running_var")] + "num_batches_tracked"
            out.setdefault(counted, torch.tensor(0, dtype=torch.long))
    return out


def torchvision_name(spec):
    """"resnet18", "resnet34", "resnet50", "resnet101" or "resnet152" when torchvision's
    constructor builds this encoder's layout (either stem), else None."""
    standard = spec.stem_channels == 64 and spec.stage_channels == [64, 128, 256, 512] \
        and spec.stage_strides == [1, 2, 2, 2]
    return _TORCHVISION.get((spec.block, tuple(spec.stage_blocks))) if standard else None


def torchvision_resnet(path):
    """torchvision's resnet the export's layout is (the small-image stem put in when the model
    has it) with fc = Identity, the export's weights loaded strictly, in eval() mode: a
    torch.nn.Module whose output is Tally's features. Needs torchvision (Debian's
    python3-torchvision)."""
    import torchvision  # optional: only this function needs it

    tensors, metadata = read_safetensors(path)
    spec = Spec(metadata)
    name = torchvision_name(spec) if spec.backbone == "resnet" else None
    if name is None:
        raise ValueError(f"{path}: not a layout torchvision's resnet18 ... resnet152 builds "
                         "(models/resnet18.ini, models/resnet50.ini are)")
    net = getattr(torchvision.models, name)()
    if spec.stem != "imagenet":
        net.conv1 = torch.nn.Conv2d(spec.channels, 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = torch.nn.Identity()
    elif spec.channels != 3:
        net.conv1 = torch.nn.Conv2d(spec.channels, 64, 7, stride=2, padding=3, bias=False)
    net.fc = torch.nn.Identity()
    net.load_state_dict(torchvision_state_dict((tensors, metadata)), strict=True)
    return net.eval()
