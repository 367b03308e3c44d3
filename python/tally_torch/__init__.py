"""Tally's exported encoders in PyTorch.

    import tally_torch
    model = tally_torch.load_export("runs/photos/encoder.safetensors")   # a torch.nn.Module
    features = model(model.preprocess(["a.jpg", "b.jpg"]))            # (2, D), as `tally embed`

load_export      the encoder an export describes, loaded strictly, in eval() mode (tally_torch.model)
load_image(s)    Tally's evaluation view of image files, before normalization (tally_torch.images)
torchvision_state_dict, torchvision_resnet
                 a ResNet export under torchvision's names (tally_torch.convert)
"""

from .convert import torchvision_name, torchvision_resnet, torchvision_state_dict
from .images import decode, list_images, load_image, load_images
from .model import Spec, build_model, head_kind, load_export, read_safetensors

__all__ = [
    "Spec", "build_model", "decode", "head_kind", "list_images", "load_export", "load_image",
    "load_images", "read_safetensors", "torchvision_name", "torchvision_resnet",
    "torchvision_state_dict",
]
