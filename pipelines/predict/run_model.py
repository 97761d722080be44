"""A trained run ready to predict: its model(s) rebuilt from the run record and best weights.

A model that explains itself by attention (`explains_by = "attention"`: TransMIL, whose logits have no
additive per-tile share) gets its attention drawn instead of contributions: one map, "attention".

`load_run(RUN_DIR)` reads config.json (`pipelines.run_record`) and best.safetensors (safetensors only,
never pickle); a cross-validation run gives one model per fold, and `RunModel` averages their outputs
(probability, value, risk) and contributions. Prediction uses it without importing the training code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from wsi.core.errors import ConfigError
from wsi.pipelines.inputs import InputAdapter, build_input
from wsi.pipelines.runs.checkpoints import load_into, weights_metadata
from wsi.pipelines.runs.record import RUN_STAMP_KEY, RunRecord, read_fitted, read_run_record, record_path
from wsi.pipelines.scheduling.devices import autocast_for, resolve_device
from wsi.pipelines.study.kinds import TaskKind, build_kind

#: the one map of a model explained by attention (heatmaps, tile values, GeoJSON, top tiles)
ATTENTION = "attention"


@dataclass
class RunModel:
    """A trained run ready to predict: its models (one, or one per fold) with each one's kind (fitted
    values of its own training split), the run's kind (for files and figures), record and adapter."""

    models: list[torch.nn.Module]
    kinds: list[TaskKind]  # one per model
    kind: TaskKind  # the run's: columns, derived cells, figures (survival: the mean risk cut-off)
    record: RunRecord
    adapter: InputAdapter
    device: torch.device
    run_dir: Path  # the run folder given
    checkpoints: list[Path]  # the weights loaded: best.safetensors, or each fold's

    @property
    def classes(self) -> list[str]:
        return list(self.record.classes)

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.record.input.provenance)

    def _mean(self, fn: Any, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        x = x.float() if x.dtype == torch.float16 else x
        with torch.inference_mode(), autocast_for(self.device)():
            pairs = zip(self.models, self.kinds, strict=True)
            return torch.stack([fn(m, k, x, extra).float() for m, k in pairs]).mean(0)

    def outputs(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, K): the kind's outputs (mean over the folds' models for a CV run)."""
        return self._mean(lambda m, k, x, e: k.outputs(m(x, **e).float()), x, extra)

    def contributions(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, N, C): each token's contribution to each logit (mean over the folds' models)."""
        return self._mean(lambda m, k, x, e: m.tile_contributions(x, **e), x, extra)

    @property
    def explains_by(self) -> str:
        """"contributions", or "attention" when any of the run's models has no per-tile contributions."""
        ways = {getattr(m, "explains_by", "contributions") for m in self.models}
        return "attention" if "attention" in ways else "contributions"

    def explain(
        self, x: torch.Tensor, extra: dict[str, torch.Tensor], output: np.ndarray
    ) -> tuple[list[tuple[str, np.ndarray, str]], dict[str, np.ndarray]]:
        """(heatmaps: (file suffix, (N,) values, title), maps: {output: (N,)}) of the first case. Folds
        fitted alike share one mean contribution; else each fold's maps (in label units) are averaged.
        Models explained by attention: the mean attention over the models, as map "attention"."""
        if self.explains_by == "attention":
            weights = self._mean(lambda m, k, x, e: m.attention_weights(x, **e), x, extra)[0].cpu().numpy()
            n_out = self.kind.num_outputs
            drawn = self.kind.heatmap_maps(np.zeros((len(weights), n_out)), output)
            title = "; ".join(t for _, _, t in drawn)
            return [("", weights, f"{title}: {ATTENTION}")], {ATTENTION: weights}
        if all(k.fitted() == self.kind.fitted() for k in self.kinds):
            contrib = self.contributions(x, extra)[0].cpu().numpy()  # (N, C)
            return self.kind.heatmap_maps(contrib, output), self.kind.contribution_maps(contrib)
        heat: dict[str, list[np.ndarray]] = {}
        titles: dict[str, str] = {}
        maps: dict[str, list[np.ndarray]] = {}
        for model, kind in zip(self.models, self.kinds, strict=True):
            xx = x.float() if x.dtype == torch.float16 else x
            with torch.inference_mode(), autocast_for(self.device)():
                contrib = cast(Any, model).tile_contributions(xx, **extra)[0].float().cpu().numpy()
            for suffix, values, title in kind.heatmap_maps(contrib, output):
                heat.setdefault(suffix, []).append(values)
                titles.setdefault(suffix, title)
            for name, values in kind.contribution_maps(contrib).items():
                maps.setdefault(name, []).append(values)
        mean = {k: np.mean(v, axis=0) for k, v in heat.items()}
        return [(k, mean[k], titles[k]) for k in heat], {k: np.mean(v, axis=0) for k, v in maps.items()}


def load_run(model_dir: str | Path, *, device: str = "auto") -> RunModel:
    """Rebuild a run's model(s) from its record + best.safetensors (safetensors only, never pickle)."""
    from wsi.models.presets import build_model_from_config

    run = Path(model_dir)
    if not record_path(run).is_file():
        raise ConfigError(f"--model {run}: no config.json; give the --out folder of `wsi train`")
    record = read_run_record(run)
    _check_record(record, record_path(run))
    ckpts = _checkpoints(run, record)
    dev = resolve_device(device)
    models: list[torch.nn.Module] = []
    kinds = []
    for ckpt in ckpts:
        _check_stamp(ckpt, record)
        model = build_model_from_config(record.model, source=str(record_path(run)), saved=True)
        load_into(model, ckpt, hint=_MIXED)
        _check_standardization(model, record, ckpt)
        models.append(model.to(dev).eval())
        kinds.append(build_kind(record.task, read_fitted(ckpt.parent)))
    fitted = kinds[0].fitted()
    cutoffs = [k.fitted().get("risk_cutoff") for k in kinds]
    if all(c is not None for c in cutoffs) and cutoffs:
        fitted["risk_cutoff"] = float(np.mean([float(c) for c in cutoffs if c is not None]))
    adapter = build_input(record.input.name, record.task.input_options)
    return RunModel(models, kinds, build_kind(record.task, fitted), record, adapter, dev, run, ckpts)


_MIXED = (
    "the weights and config.json come from different runs (or config.json was edited): restore it, or retrain"
)


def _check_record(record: RunRecord, path: Path) -> None:
    """config.json's parts agree with each other: the classes it lists are the task's, and the model
    it describes gives as many outputs as the task's kind reads (an edited class list gave an empty
    `prob_C` column)."""
    task = record.task
    if task.kind == "categorical" and tuple(record.classes) != tuple(task.classes):
        raise ConfigError(
            f"{path}: its `classes` {list(record.classes)} and its task's classes {list(task.classes)} "
            f"differ (the file was edited?); {_MIXED}"
        )
    wanted = build_kind(task).num_outputs
    outputs = record.model.num_outputs
    if outputs is not None and outputs != wanted:
        what = f"classes {list(task.classes)}" if task.kind == "categorical" else f"{task.kind} targets"
        raise ConfigError(
            f"{path}: its model gives {outputs} outputs (model.num_classes) but its task's {what} need "
            f"{wanted}; {_MIXED}"
        )


def _check_stamp(ckpt: Path, record: RunRecord) -> None:
    """Weights written by `wsi train` name the run they belong to; another run's are refused."""
    stamped = weights_metadata(ckpt).get(RUN_STAMP_KEY)
    if stamped is not None and stamped != record.created:
        raise ConfigError(
            f"{ckpt} was trained by the run started {stamped}, but this folder's config.json describes "
            f"the run started {record.created}; {_MIXED}"
        )


def _check_standardization(model: torch.nn.Module, record: RunRecord, ckpt: Path) -> None:
    """The weights hold an input standardisation exactly when the run's task asked for one (a run
    folder whose weights were swapped would otherwise predict on the wrong feature scale)."""
    from wsi.models.layers.standardize import input_standardizer

    has = input_standardizer(model) is not None
    if has != record.task.standardize_features:
        said = "asks for" if record.task.standardize_features else "does not ask for"
        held = "hold" if has else "lack"
        raise ConfigError(
            f"{ckpt}: the weights {held} an input standardisation, but the run's config.json {said} "
            "one (standardize_features); this folder mixes runs: retrain it or restore its weights"
        )


def _checkpoints(run: Path, record: RunRecord) -> list[Path]:
    """best.safetensors, or every fold's of a cross-validation run (all K must have finished)."""
    ckpts = [run / "best.safetensors"]
    if not ckpts[0].is_file():
        ckpts = sorted(run.glob("fold-*/best.safetensors"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not ckpts:
        raise ConfigError(
            f"--model {run}: no best.safetensors (nor fold-*/best.safetensors); did training finish?"
        )
    n_folds = record.cv
    if len(ckpts) > 1 and n_folds is not None and len(ckpts) != n_folds:
        have = sorted(p.parent.name for p in ckpts)
        raise ConfigError(
            f"--model {run}: a {n_folds}-fold run, but only {', '.join(have)} finished; "
            f"finish it with `wsi train ... --cv {n_folds} --resume` or predict with one fold's folder"
        )
    return ckpts


__all__ = ["ATTENTION", "RunModel", "load_run"]
