"""Model weights as safetensors: written atomically, read without ever unpickling.

Shared by training (best.safetensors / last.safetensors, the resume state) and prediction, which
loads a run's weights without importing the training code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model

from wsi.core.errors import WeightsError
from wsi.core.files import atomic_path
from wsi.models.layers.standardize import ensure_for_state

_HINT = "was it trained with another preset or size?"


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


def weights_metadata(path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file's header ({} when it has none), read without its tensors."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except Exception as exc:  # safetensors raises its own SafetensorError on a bad header
        raise WeightsError(f"{path} is not a safetensors checkpoint ({exc})") from None


def load_into(model: torch.nn.Module, path: Path, *, hint: str = _HINT) -> None:
    """Load a checkpoint into `model` in place; refuse one of another architecture by name."""
    load_state_into(model, load_weights(path), path, hint=hint)


def load_state_into(
    model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path, *, hint: str = _HINT
) -> None:
    """Load a state dict read from `path` into `model` in place. Weights that hold an input
    standardisation (`standardize_features`) give the model one to load it into first. A tensor of
    another shape is named with both shapes (torch's "size mismatch" RuntimeError named no file);
    `hint` says what the mismatch means where it is loaded."""
    ensure_for_state(model, state)
    own = model.state_dict()
    wrong = [
        (k, tuple(v.shape), tuple(own[k].shape))
        for k, v in state.items()
        if k in own and own[k].shape != v.shape
    ]
    if wrong:
        shown = "; ".join(
            f"{k} is {_dims(a)} in the weights but {_dims(b)} in the model" for k, a, b in wrong[:3]
        )
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise WeightsError(f"{path} does not fit the model: {shown}{more}{_meaning(wrong)}; {hint}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_model drops duplicate names of tied tensors; those are the only acceptable "missing" keys
    really_missing = [k for k in missing if not _is_tied_alias(model, k, state)]
    if really_missing or unexpected:
        raise WeightsError(
            f"{path} does not fit the model: missing {really_missing[:5]}, unexpected {unexpected[:5]}; "
            + hint
        )


def _dims(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape)) or "a scalar"


def _meaning(wrong: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> str:
    """What a mismatch of the last layer (outputs) or of an input layer (feature width) says."""
    notes = []
    for key, have, want in wrong:
        if key.startswith("head.") and have[:1] != want[:1]:
            notes.append(
                f"the weights give {have[0]} outputs, the model {want[0]} (classes or targets differ)"
            )
        elif len(have) == 2 and len(want) == 2 and have[0] == want[0] and have[1] != want[1]:
            notes.append(
                f"the weights take {have[1]}-wide input at {key}, the model {want[1]} (in_dim, feature width)"
            )
    return f" ({'; '.join(dict.fromkeys(notes))})" if notes else ""


def _is_tied_alias(model: torch.nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    params = dict(model.state_dict(keep_vars=True))
    target = params.get(key)
    return target is not None and any(
        params[k].data_ptr() == target.data_ptr() for k in state if k in params and k != key
    )


__all__ = ["load_into", "load_state_into", "load_weights", "save_weights", "weights_metadata"]
