"""The run record: `config.json` of a run folder, written by `wsi train` and read by `wsi predict`.

It says everything needed to use and to repeat a run: the resolved task, the model's architecture
(what `models.presets.build_model_from_config` rebuilds), the input adapter with the provenance of
its inputs (encoder, weights sha256, tile settings), the label table and input folder, counts, the
splits, devices and versions. Prediction reads it through this module alone, so it never imports the
training code.

Values fitted on a training split that predict needs besides the weights (the standardisation of
continuous targets, the survival risk cut-off) sit beside it in `fitted.json` (`Fitted`): they are
known only once a fold's split is made or its training ends, and a cross-validation run has one per
fold folder.

Format versions: 3 (this one) adds the resolution given to bags in level-0 pixels (`input.mpp`,
`input.mpp_by_slide`); 2 holds the model once, as `model`. Version 1 (before `format_version` was
written) also held the build_model keyword arguments as `model_spec`; older versions still load (no
mpp given), and the architecture in their `model` is what predict rebuilds, as it always was.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from wsi.core.config import Count, Mpp, config_dict, config_model, parse_config
from wsi.core.errors import ConfigError
from wsi.core.files import write_json_atomic
from wsi.core.user_text import load_json_file
from wsi.pipelines.study.tasks import TaskConfig, check_task

RECORD_NAME = "config.json"
FORMAT_VERSION = 3
FITTED_NAME = "fitted.json"
#: the most folds of a cross-validation (one case each: leave-one-out of a large cohort is not run)
MAX_FOLDS = 1000
_REAL = 1e300  # fitted values in label units (a mean, a std, a risk): any finite number
_Real = Annotated[float, Field(ge=-_REAL, le=_REAL)]


class ModelArchitecture(Mapping[str, Any]):
    """A run's model architecture, as the model wrote it (`KindModel.to_dict()`: kind, widths,
    attention, ...): what `models.presets.build_model_from_config` rebuilds, each field typed by the
    model kind's own config then. The fields the pipeline reads are typed here; it reads and is written
    (config.json's `model`) as the plain mapping it is, so records of every format version load."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    @property
    def kind(self) -> str:
        """The model kind (`mil`, `abmil`, `vit2d`, `linear`, ...)."""
        return str(self._data.get("kind", "mil"))

    @property
    def num_outputs(self) -> int | None:
        """The model's outputs (`num_classes`: classes, targets or one risk); None when not recorded."""
        value = self._data.get("num_classes")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def uses_positions(self) -> bool:
        return model_uses_positions(self._data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ModelArchitecture({self._data!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.dict_schema(keys_schema=core_schema.str_schema()),
            serialization=core_schema.plain_serializer_function_ser_schema(dict),
        )


@config_model
@dataclass(frozen=True)
class InputRecord:
    name: str  # the input adapter (pipelines.inputs registry): bags | images
    options: dict[str, Any] = field(default_factory=dict)  # the task's input_options it was built with
    provenance: dict[str, Any] = field(default_factory=dict)  # how the inputs were made (adapter's own)
    mpp: Mpp | None = None  # --mpp: run-wide level-0 um/px for bags in pixels (CLAM, TRIDENT)
    mpp_by_slide: dict[str, Mpp] = field(default_factory=dict)  # the labels CSV `mpp` column, per slide


@config_model
@dataclass(frozen=True)
class Counts:
    slides: Count  # labelled items that have an input: what was split and trained on
    patients: Count  # distinct patients among them (the split unit)
    labelled_without_input: Count  # label rows with no input found (left out, reported)
    inputs_without_label: Count  # inputs found with no label row (left out, reported)


@config_model
@dataclass(frozen=True)
class SplitIds:
    train: tuple[str, ...]  # item ids, in splits.csv order
    val: tuple[str, ...]
    test: tuple[str, ...]


@config_model
@dataclass(frozen=True)
class RunRecord:
    task: TaskConfig  # the resolved task, command-line changes included
    model: ModelArchitecture  # the architecture: model.config_dict(), rebuilt by build_model_from_config
    input: InputRecord
    classes: tuple[str, ...]  # categorical: output order of the model's logits (other kinds: none)
    labels_csv: str  # absolute path of the label table
    source: str  # absolute path of the input folder (--features / --images)
    counts: Counts
    splits: tuple[SplitIds, ...]  # one per fold (one without cross-validation)
    cv: Annotated[int, Field(ge=2, le=MAX_FOLDS)] | None  # K of K-fold cross-validation; None for one split
    init_from: str | None  # run folder or checkpoint the weights started from (--init-from)
    device: str  # where it trained (cpu, cuda:0, mps)
    amp: str | None  # mixed precision used: bf16 on CUDA, else None
    created: str  # ISO 8601 UTC time the run started
    versions: dict[str, str]  # wsi, torch, python
    fold: Annotated[int, Field(ge=1, le=MAX_FOLDS)] | None = (
        None  # 1-based fold of a cross-validation run's fold-<k>/ folder
    )
    format_version: Annotated[int, Field(ge=1, le=FORMAT_VERSION)] = (
        FORMAT_VERSION  # of this record's layout (see the module docstring)
    )


@config_model
@dataclass(frozen=True)
class Fitted:
    """fitted.json: values fitted on a run folder's training split that prediction needs."""

    target_scaling: dict[str, tuple[_Real, Annotated[float, Field(gt=0, le=_REAL)]]] = field(
        default_factory=dict
    )  # column: (mean, std)
    risk_cutoff: _Real | None = None  # survival: median training risk (best weights): the KM split
    format_version: Annotated[int, Field(ge=1, le=1)] = 1  # of this file's layout


def write_fitted(run_dir: str | Path, values: dict[str, Any]) -> Path:
    """fitted.json in `run_dir` (checked like every config), atomically; returns its path."""
    path = Path(run_dir) / FITTED_NAME
    fitted = parse_config(Fitted, values, source=f"values fitted for {run_dir}")
    write_json_atomic(path, config_dict(fitted))
    return path


def read_fitted(run_dir: str | Path) -> dict[str, Any]:
    """The fitted values of a run folder as the mapping `pipelines.kinds.build_kind` takes ({} when
    the run has none: categorical runs, and runs written before fitted.json existed)."""
    path = Path(run_dir) / FITTED_NAME
    if not path.is_file():
        return {}
    try:
        data = load_json_file(path, what="fitted values")
    except ConfigError as exc:
        raise ConfigError(f"{exc}; retrain the run or restore the file") from None
    fitted = parse_config(Fitted, data, source=str(path))
    return {k: v for k, v in config_dict(fitted).items() if k != "format_version"}


def record_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORD_NAME


def write_run_record(run_dir: str | Path, record: RunRecord) -> Path:
    """config.json in `run_dir`, atomically; returns its path."""
    path = record_path(run_dir)
    write_json_atomic(path, config_dict(record))
    return path


def read_run_record(run_dir: str | Path) -> RunRecord:
    """The record of a run folder written by `wsi train` (any format version)."""
    path = record_path(run_dir)
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no {RECORD_NAME}; give the --out folder of `wsi train`")
    try:
        data = load_json_file(path, what="run record")
    except ConfigError as exc:
        raise ConfigError(f"{exc}: not a readable run record; was the run interrupted?") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (a run record of `wsi train`)")
    data = _upgrade(data, path)
    record = parse_config(RunRecord, data, source=str(path))
    check_task(record.task, f"{path} (task)")
    return record


def _upgrade(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A record of any known format version as the current layout."""
    version = data.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ConfigError(
            f"{path}: run record format {version!r} is newer than this wsi reads ({FORMAT_VERSION}); "
            "upgrade wsi"
        )
    if version == 1:
        data = {k: v for k, v in data.items() if k != "model_spec"}  # the model once: its `model`
        if not data.get("model"):
            raise ConfigError(f"{path}: this run record holds no model architecture (`model`); retrain it")
    # 1, 2 -> 3: no resolution was given to bags in pixels then (the InputRecord defaults say so)
    data["format_version"] = FORMAT_VERSION
    return data


#: safetensors metadata key of best.safetensors: the `created` of the run record it was trained under
RUN_STAMP_KEY = "wsi_run_created"


def run_stamp(run_dir: str | Path) -> dict[str, str]:
    """Metadata that ties weights written into `run_dir` to its config.json ({} without a record), so
    prediction can tell weights copied in from another run (`pipelines.predict.run_model`)."""
    path = record_path(run_dir)
    if not path.is_file():
        return {}
    try:
        data = load_json_file(path, what="run record")
    except ConfigError:
        return {}
    created = data.get("created") if isinstance(data, dict) else None
    return {RUN_STAMP_KEY: created} if isinstance(created, str) else {}


def model_uses_positions(model: Mapping[str, Any]) -> bool:
    """Whether a model (its architecture, `RunRecord.model`) reads tile positions: vit-wsi with
    `pos_encoding` on. Bags in level-0 pixels then need a resolution (--mpp, an `mpp` column); a model
    without positions (vit-wsi by default, abmil) needs none."""
    return bool(model.get("pos_encoding", False))


__all__ = [
    "FITTED_NAME",
    "FORMAT_VERSION",
    "RUN_STAMP_KEY",
    "Counts",
    "Fitted",
    "InputRecord",
    "ModelArchitecture",
    "RunRecord",
    "SplitIds",
    "model_uses_positions",
    "read_fitted",
    "read_run_record",
    "record_path",
    "run_stamp",
    "write_fitted",
    "write_run_record",
]
