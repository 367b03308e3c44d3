"""Tally's exported encoders in PyTorch.

    import tally_torch
    model = tally_torch.load_export("runs/m/encoder.safetensors")   # a torch.nn.Module

load_export      the encoder an export describes, loaded strictly, in eval() mode (tally_torch.model)
"""

from .model import Spec, build_model, head_kind, load_export, read_safetensors

__all__ = ["Spec", "build_model", "head_kind", "load_export", "read_safetensors"]
