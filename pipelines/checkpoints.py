"""Model weights as safetensors: written atomically, read without ever unpickling.

Shared by training (best.safetensors / last.safetensors, the resume state) and prediction, which
loads a run's weights without importing the training code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from wsi.errors import WeightsError
from wsi.files import atomic_path
from wsi.models.standardize import ensure_for_state


def save_weights(model: torch.nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """The model's weights, atomically (tied tensors handled by safetensors.save_model)."""
    with atomic_path(path) as tmp:
        save_model(model, str(tmp), metadata=metadata)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors state dict; anything else is refused (no pickle is ever loaded)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"checkpoint {path} does not exist")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError on a bad header
        raise WeightsError(f"{path} is not a safetensors checkpoint ({exc})") from None


def load_into(model: torch.nn.Module, path: Path) -> None:
    """Load a checkpoint into `model` in place; refuse one of another architecture by name."""
    load_state_into(model, load_weights(path), path)


def load_state_into(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load a state dict read from `path` into `model` in place. Weights that hold an input
    standardisation (`standardize_features`) give the model one to load it into first."""
    ensure_for_state(model, state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_model drops duplicate names of tied tensors; those are the only acceptable "missing" keys
    really_missing = [k for k in missing if not _is_tied_alias(model, k, state)]
    if really_missing or unexpected:
        raise WeightsError(
            f"{path} does not fit the model: missing {really_missing[:5]}, unexpected {unexpected[:5]}; "
            "was it trained with another preset or size?"
        )


def _is_tied_alias(model: torch.nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    params = dict(model.state_dict(keep_vars=True))
    target = params.get(key)
    return target is not None and any(
        params[k].data_ptr() == target.data_ptr() for k in state if k in params and k != key
    )


__all__ = ["load_into", "load_state_into", "load_weights", "save_weights"]
