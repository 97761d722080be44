"""Every option of the embed stage, as one typed config validated through `wsi.core.config`.

`wsi embed` parses its command-line options into `EmbedOptions` with `parse_config` (unknown keys
refused, types checked); library callers may build it directly, which runs the same value checks.

One encoder is `encoder` + `weights` (+ `expected_sha256`, `input_px`), as always. Several encoders in one
pass (each tile read and decoded once, one bag per encoder) are `encoders`, a tuple of `EncoderChoice`;
then the single-encoder fields stay at their defaults. `choices()` gives the list either way.

Public API:
  EmbedOptions                      frozen, picklable (sent to dask workers); defaults are `wsi embed`'s
      .choices() -> tuple[EncoderChoice, ...]     the encoders of this run, in order
  EncoderChoice(name, weights=None, expected_sha256=None, input_px=None)   one encoder of a run
  default_readers() -> int          reader processes: every core but one, 1 to 16
  PRECISIONS, DTYPES, DECODES, STAIN_NORMS, READER_MODES   the allowed values (from the field types)
  CPU_BATCH                         tiles per pass on a CPU when batch_size is "auto" (the old default)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator, Field

from wsi.core.config import config_model, setting
from wsi.core.errors import ConfigError

Precision = Literal["bf16", "fp16", "fp32"]
Dtype = Literal["float16", "float32"]
Decode = Literal["cpu", "device", "auto"]
StainNorm = Literal["macenko", "reinhard"]
ReaderMode = Literal["process", "thread"]
# the allowed values, as the types above declare them (the CLI's choices come from the same types)
PRECISIONS: tuple[str, ...] = get_args(Precision)
DTYPES: tuple[str, ...] = get_args(Dtype)
DECODES: tuple[str, ...] = get_args(Decode)
STAIN_NORMS: tuple[str, ...] = get_args(StainNorm)
READER_MODES: tuple[str, ...] = get_args(ReaderMode)
CPU_BATCH = 128  # batch_size "auto" off CUDA: what `wsi embed` always used
MAX_INPUT_PX = 4096  # a network input side (ViTs take 224-518)
_InputPx = Annotated[int, Field(ge=16, le=MAX_INPUT_PX)]


@config_model
@dataclass(frozen=True)
class EncoderChoice:
    """One encoder of a multi-encoder run (the single-encoder fields of EmbedOptions, per encoder)."""

    name: str  # a named encoder (`wsi encoders`), timm:<architecture>, or a recipe file my-encoder.yaml
    weights: str | None = None  # weights file, or the model folder as the authors' hub repository lays it out
    expected_sha256: str | None = None  # refuse weights whose sha256 differs
    input_px: _InputPx | None = None  # timm:<name> encoders only; named encoders fix their input size


#: `--gpus`: a number of GPUs on this machine, or all of them
Gpus = Annotated[int, Field(ge=1, le=1024)] | Literal["all"]


def _gpus_text(value: object) -> object:
    """`--gpus` as typed: a count or "all" (the count's range is the field's)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        if text == "all":
            return "all"
        raise ValueError(f"give a number of GPUs (e.g. --gpus 4) or all, not {value!r}")
    return value


def default_readers() -> int:
    """Reader processes: every core but the one feeding the device, at most 16."""
    return max(1, min(16, (os.cpu_count() or 1) - 1))


@config_model
@dataclass(frozen=True)
class EmbedOptions:
    """Options of the embed stage; defaults are what `wsi embed` uses."""

    encoder: str = setting(
        "retccl",
        help="Encoder: a name from `wsi encoders` (retccl, uni, uni2-h, virchow2, ...), timm:<architecture>, "
        "or a recipe file my-encoder.yaml. Repeat it to run several encoders on one read of the tiles.",
    )
    weights: str | None = setting(
        None,
        help="Weights file (.pth/.pt/.bin state dict, or .safetensors) or the model folder as the authors' "
        "hub repository lays it out (config.json + weights). With several --encoder: one --weights each, "
        "in the same order.",
    )
    #: explicit: a bag of random features must never happen by accident
    random_init: bool = setting(False, help="No weights: random features, for tests and demos only.")
    expected_sha256: str | None = setting(
        None, help="Refuse weights whose sha256 differs. With several --encoder: none, or one each in order."
    )
    input_px: int | None = setting(
        None, ge=16, le=MAX_INPUT_PX, default_text="the architecture's",
        help="Network input side for timm:<name> encoders; named encoders fix theirs (retccl 256, uni 224).",
    )  # fmt: skip
    # several encoders in one pass (each tile read once, one bag each); () means the one `encoder` above
    encoders: tuple[EncoderChoice, ...] = ()
    #: `pipelines.devices.resolve_device`; with --gpus, auto or cuda (the GPUs are chosen for it)
    device: str = setting("auto", help="Device: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps.")
    precision: Precision = setting(
        "bf16", help="Autocast precision on CUDA (the CPU always runs fp32)."
    )
    compile: bool = setting(False, help="torch.compile the encoders (CUDA; pays off on long runs).")
    threads: int | None = setting(
        None, ge=1, le=1024, default_text="torch's default", help="CPU threads for the encoder."
    )
    # "auto": measured from free memory on CUDA (every encoder's probe, the smallest wins, at most 256),
    # CPU_BATCH elsewhere; 128 x 256 px fills an H100 for RetCCL in bf16
    batch_size: Annotated[int, Field(ge=1, le=65_536)] | Literal["auto"] = setting(
        128,
        help="Tiles per pass (N or auto); auto: measured from free GPU memory on CUDA (every encoder "
        "probed, at most 256), 128 on the CPU.",
    )  # fmt: skip
    #: threads inside dask workers, which may not fork
    readers: int = setting(
        default_factory=lambda: default_readers(), ge=0, le=256, default_text="cores - 1, 1 to 16",
        help="Background readers; 0 reads inline.",
    )  # fmt: skip
    reader_mode: ReaderMode = setting(
        "process", help="Readers as processes (fastest) or threads (when /dev/shm is small)."
    )
    dtype: Dtype = setting(
        "float16", help="Storage type of the features (float32 when beyond float16's range)."
    )
    max_bad_tiles: float = setting(
        0.05, ge=0, lt=1, help="Fail a slide when more than this fraction of its tiles cannot be read."
    )
    use_cache: bool = setting(
        True, help="Read tiles from the --save-tiles zarr cache when it is complete (--no-cache: the slides)."
    )
    overwrite: bool = setting(False, help="Redo bags that are already complete.")
    decode: Decode = setting(
        "auto",
        help="Where JPEG tiles are decoded and resized: device (nvjpeg on CUDA; readers only slice the "
        "compressed tiles out of the file), cpu (openslide/tiffslide in the readers), auto (device on "
        "CUDA for JPEG TIFFs).",
    )
    stain_norm: StainNorm | None = setting(
        None, default_text="none",
        help="Stain-normalise tiles on the device before the encoders (recorded in every bag).",
    )  # fmt: skip
    stain_reference: str | None = setting(
        None, default_text="the method's shipped H&E reference", existing="any",
        help="What --stain-norm maps onto: a saved reference (.json), an image or a folder of images, or a "
        "tile file (tiles/<slide_id>.h5) to fit it from.",
    )  # fmt: skip

    # how the batch runs: none of these changes a feature, so none is recorded in a bag
    workers: int = setting(
        1, ge=1, le=1024, help="Slides embedded in parallel (local dask workers, each with its encoders)."
    )
    scheduler: str | None = setting(
        None, help="Run on an existing dask.distributed cluster (e.g. tcp://host:8786)."
    )
    gpus: Annotated[Gpus, BeforeValidator(_gpus_text)] | None = setting(
        None, help="One worker per GPU on this machine (N GPUs, or all); exit 2 when there are not that many."
    )
    progress: bool = setting(True, help="Progress bars (--no-progress: none).")

    def choices(self) -> tuple[EncoderChoice, ...]:
        """The encoders of this run, in order (without `encoders`: the one of the single-encoder fields)."""
        if self.encoders:
            return self.encoders
        return (EncoderChoice(self.encoder, self.weights, self.expected_sha256, self.input_px),)

    def __post_init__(self) -> None:
        """Value checks for direct construction too (parse_config also checks the types)."""
        checks = (("--precision", self.precision, PRECISIONS), ("--dtype", self.dtype, DTYPES),
                  ("--reader-mode", self.reader_mode, READER_MODES),
                  ("--decode", self.decode, DECODES))  # fmt: skip
        for option, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(f"{option} {value!r} unknown; choose {', '.join(allowed)}")
        if (self.batch_size != "auto" and self.batch_size < 1) or self.readers < 0:
            raise ConfigError(f"--batch-size ({self.batch_size}) must be >= 1 or auto, and --readers >= 0")
        if self.stain_norm is not None and self.stain_norm not in STAIN_NORMS:
            raise ConfigError(f"--stain-norm {self.stain_norm!r} unknown; choose {', '.join(STAIN_NORMS)}")
        if self.stain_reference is not None and self.stain_norm is None:
            raise ConfigError(f"--stain-reference needs --stain-norm {'|'.join(STAIN_NORMS)}")
        if self.encoders:
            single = (self.encoder, self.weights, self.expected_sha256, self.input_px)
            if single != (EmbedOptions.encoder, None, None, None):
                raise ConfigError(
                    "give the encoders either as `encoders` or as encoder/weights/expected_sha256/input_px, "
                    "not both"
                )
            _check_unique(self.encoders)


def _check_unique(choices: tuple[EncoderChoice, ...]) -> None:
    """Two choices writing into one bag folder would overwrite each other's bags."""
    from wsi.models.encoders import encoder_id_for

    seen: dict[str, str] = {}
    for choice in choices:
        folder = encoder_id_for(choice.name)
        if folder in seen:
            raise ConfigError(
                f"--encoder {choice.name!r} and {seen[folder]!r} would write into the same bag folder "
                f"features/{folder}/; give each encoder once"
            )
        seen[folder] = choice.name
