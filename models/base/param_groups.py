"""Optimizer parameter groups: weight decay on weight matrices only.

Decaying a LayerNorm or seqnorm gain pulls it towards 0 (not towards its identity init of 1), decaying a
bias or beta shifts the function for no regularising gain, and decaying the class token or gdla's
lambdas shrinks a learned vector towards an arbitrary point. So, as nanoGPT and timm do, AdamW decays
only the parameters that multiply an input: linear and convolution weights. A module lists further
exceptions by name in its `no_weight_decay` (the class token, gdla's per-head lambdas).
"""

from __future__ import annotations

from typing import Any

from torch import nn

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.RMSNorm)
_NO_DECAY_NAMES = ("bias", "gamma", "beta", "cls_token", "pos_embed", "pos_embedding")


def _decays(module: nn.Module, name: str, ndim: int) -> bool:
    if isinstance(module, _NORMS) or ndim < 2 or name in _NO_DECAY_NAMES:
        return False
    return name not in getattr(module, "no_weight_decay", frozenset())


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: weights with `weight_decay`, and norms, gains, biases, tokens, lambdas without.

    Each group also holds `names` (the parameters' qualified names) for logging; only parameters that
    require gradients are included. Pass the result to `torch.optim.AdamW(groups, lr=...)`.
    """
    decay: dict[str, list[Any]] = {"params": [], "names": []}
    keep: dict[str, list[Any]] = {"params": [], "names": []}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # tied weights: counted once
                continue
            seen.add(id(param))
            group = decay if _decays(module, name, param.ndim) else keep
            group["params"].append(param)
            group["names"].append(f"{module_name}.{name}" if module_name else name)
    return [
        {**decay, "weight_decay": float(weight_decay)},
        {**keep, "weight_decay": 0.0},
    ]


__all__ = ["param_groups"]
