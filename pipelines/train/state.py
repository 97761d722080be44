"""Training state: where a run stands (`TrainState`), the random generators (`RngState`), and the
resume folder that holds both with the model and optimizer, never unpickled.

The resume state is a folder (`resume/`) written atomically when the loop saves (the best epoch
changed, `loop.STATE_EVERY_S` passed, or the run ends): the model, the
optimizer's tensors and the RNG states as safetensors, everything else (the `TrainState`, optimizer
hyper-parameters, scheduler counters) as JSON. An interrupted run restarts from it exactly.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import save_file, save_model

from wsi.core.config import Count, config_model, parse_config
from wsi.core.files import atomic_path
from wsi.core.user_text import load_json_file
from wsi.pipelines.runs.checkpoints import load_into, load_weights

RESUME_DIR = "resume"


@config_model(finite=False)  # best_score is -inf while no epoch's figure was estimable
@dataclass
class TrainState:
    """Where a training run stands after an epoch (saved as `progress` in resume/state.json)."""

    epoch: Count = 0  # epochs finished
    best_score: tuple[float, float] | None = None  # the kind's validation score of the best epoch, e.g.
    # (val AUROC, -val loss) for a categorical task (pipelines.kinds); larger wins
    best_epoch: Count = 0  # 1-based epoch of best.safetensors; 0 = none yet
    bad_epochs: Count = 0  # epochs since the best one (what early stopping counts)
    log: list[dict[str, Any]] = field(default_factory=list)  # the log.csv rows so far
    done: bool = False  # no epoch left to run (stopped early, or every epoch run)

    def finished(self, epochs: int) -> bool:
        return self.done or self.epoch >= epochs

    def best_row(self) -> dict[str, Any]:
        return self.log[self.best_epoch - 1] if self.log and self.best_epoch else {}


@dataclass
class RngState:
    """The global random generators (torch CPU and CUDA, NumPy, Python) at one moment."""

    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor]  # one per device; restored only on a machine with as many
    numpy: list[Any]  # np.random.get_state() as JSON-able values
    python: list[Any]  # random.getstate() as JSON-able values

    @classmethod
    def capture(cls, *, cuda: bool = True) -> RngState:
        np_state = cast(tuple[Any, ...], np.random.get_state(legacy=True))  # (name, keys, pos, gauss...)
        py_state = random.getstate()
        return cls(
            torch_cpu=torch.get_rng_state(),
            cuda=list(torch.cuda.get_rng_state_all()) if cuda and torch.cuda.is_available() else [],
            numpy=[np_state[0], np_state[1].tolist(), *np_state[2:]],
            python=[py_state[0], list(py_state[1]), py_state[2]],
        )

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda and torch.cuda.is_available() and len(self.cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(self.cuda)
        np.random.set_state((self.numpy[0], np.array(self.numpy[1], dtype=np.uint32), *self.numpy[2:]))
        random.setstate((self.python[0], tuple(self.python[1]), self.python[2]))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor part, named as resume/state.safetensors holds it."""
        return {"rng.torch": self.torch_cpu, **{f"rng.cuda.{i}": s for i, s in enumerate(self.cuda)}}

    @classmethod
    def from_saved(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> RngState:
        cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.split(".")[2]))
        return cls(tensors["rng.torch"], [tensors[k] for k in cuda], meta["numpy"], meta["python"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device


# ---------------------------------------------------------------------------------------------- resume


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
    state: TrainState,
) -> None:
    """Everything needed to continue after `state.epoch`, in one atomic folder."""
    opt_tensors, opt_meta = _split_optimizer(optimizer.state_dict())
    rng = RngState.capture()
    meta = {
        "progress": dataclasses.asdict(state),  # plain JSON: NaN and inf figures survive as they are
        "optimizer": opt_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": {"numpy": rng.numpy, "python": rng.python},
    }
    with atomic_path(run_dir / RESUME_DIR) as tmp:
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        tensors = {**opt_tensors, **rng.tensors(), "rng.loader": loader_generator.get_state()}
        save_file(tensors, str(tmp / "state.safetensors"))
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
) -> TrainState:
    """Restore the states saved by `save_resume`; returns the saved `TrainState`."""
    folder = Path(run_dir) / RESUME_DIR
    meta = load_json_file(folder / "state.json", what="resume state")  # ours; may hold NaN figures
    load_into(model, folder / "model.safetensors")
    tensors = load_weights(folder / "state.safetensors")
    optimizer.load_state_dict(_join_optimizer(tensors, meta["optimizer"]))  # moves state to params' device
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    RngState.from_saved(tensors, meta["rng"]).restore()
    loader_generator.set_state(tensors["rng.loader"])
    return parse_config(TrainState, meta["progress"], source=str(folder / "state.json"))


__all__ = ["RngState", "TrainState", "has_resume", "load_resume", "save_resume", "seed_everything"]
