"""The one device resolver and the one autocast policy, shared by embed, train and predict."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from wsi.core.errors import ConfigError


def resolve_device(name: str | None = "auto") -> torch.device:
    """`auto` (or None): CUDA, then MPS, then CPU. Anything else is passed to torch (cpu, cuda:1, mps)."""
    if name is None or name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but CUDA is not available here; use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} asked for, but MPS is not available here; use --device cpu")
    return device


def autocast_for(device: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    """bf16 autocast on CUDA (no loss scaling needed); full precision elsewhere."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext


__all__ = ["autocast_for", "resolve_device"]
