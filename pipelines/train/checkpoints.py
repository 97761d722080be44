"""Checkpoints: model weights as safetensors, and a resume state that is never unpickled.

`best.safetensors` / `last.safetensors` hold only the model's tensors. The resume state is a folder
(`resume/`) written atomically after every epoch: the model, the optimizer's tensors and the RNG
states as safetensors, everything else (epoch, optimizer hyper-parameters, scheduler counters,
early-stopping state, the log so far) as JSON. An interrupted run restarts from it exactly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file, save_model

from wsi.errors import WeightsError
from wsi.files import atomic_path

RESUME_DIR = "resume"


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
    state = load_weights(path)
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


# ---------------------------------------------------------------------------------------------- resume


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    np_state = np.random.get_state()
    py_state = random.getstate()
    meta = {
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    np_state = meta["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    py_state = meta["python"]
    random.setstate((py_state[0], tuple(py_state[1]), py_state[2]))


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state_dict -> (flat tensors, JSON rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, pstate in state["state"].items():
        for name, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.{pid}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


def save_resume(
    run_dir: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    loader_generator: torch.Generator,
    progress: dict[str, Any],
) -> None:
    """Everything needed to continue after `progress["epoch"]`, in one atomic folder."""
    opt_tensors, opt_meta = _split_optimizer(optimizer.state_dict())
    rng_tensors, rng_meta = _rng_state()
    rng_tensors["rng.loader"] = loader_generator.get_state()
    meta = {
        "progress": progress,
        "optimizer": opt_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_meta,
    }
    with atomic_path(run_dir / RESUME_DIR) as tmp:
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        save_file({**opt_tensors, **rng_tensors}, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta), encoding="utf-8")


def has_resume(run_dir: Path) -> bool:
    return (Path(run_dir) / RESUME_DIR / "state.json").is_file()


def load_resume(
    run_dir: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    loader_generator: torch.Generator,
) -> dict[str, Any]:
    """Restore the states saved by `save_resume`; returns the saved `progress`."""
    folder = Path(run_dir) / RESUME_DIR
    meta = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    load_into(model, folder / "model.safetensors")
    tensors = load_weights(folder / "state.safetensors")
    optimizer.load_state_dict(_join_optimizer(tensors, meta["optimizer"]))  # moves state to params' device
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    _set_rng_state(tensors, meta["rng"])
    loader_generator.set_state(tensors["rng.loader"])
    return meta["progress"]
