"""Every option of the embed stage, as one typed config validated through `wsi.config`.

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
  PRECISIONS, DTYPES, DECODES, STAIN_NORMS    the allowed values of precision, dtype, decode, stain_norm
  CPU_BATCH                         tiles per pass on a CPU when batch_size is "auto" (the old default)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from wsi.config import config_model
from wsi.errors import ConfigError

Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32")
DTYPES: tuple[str, ...] = ("float16", "float32")
DECODES: tuple[str, ...] = ("cpu", "device", "auto")
STAIN_NORMS: tuple[str, ...] = ("macenko", "reinhard")
CPU_BATCH = 128  # batch_size "auto" off CUDA: what `wsi embed` always used


@config_model
@dataclass(frozen=True)
class EncoderChoice:
    """One encoder of a multi-encoder run (the single-encoder fields of EmbedOptions, per encoder)."""

    name: str  # a named encoder (`wsi encoders`), timm:<architecture>, or a recipe file my-encoder.yaml
    weights: str | None = None  # weights file, or the model folder as the authors' hub repository lays it out
    expected_sha256: str | None = None  # refuse weights whose sha256 differs
    input_px: int | None = None  # timm:<name> encoders only; named encoders fix their input size


def default_readers() -> int:
    """Reader processes: every core but the one feeding the device, at most 16."""
    return max(1, min(16, (os.cpu_count() or 1) - 1))


@config_model
@dataclass(frozen=True)
class EmbedOptions:
    """Options of the embed stage; defaults are what `wsi embed` uses."""

    encoder: str = "retccl"  # a named encoder (`wsi encoders`), timm:<architecture>, or my-encoder.yaml
    weights: str | None = None  # weights file (.pth/.pt/.bin/.safetensors) or the authors' model folder
    random_init: bool = False  # explicit: a bag of random features must never happen by accident
    expected_sha256: str | None = None  # refuse weights whose sha256 differs
    input_px: int | None = None  # timm encoders only; named encoders fix theirs (retccl 256)
    # several encoders in one pass (each tile read once, one bag each); () means the one `encoder` above
    encoders: tuple[EncoderChoice, ...] = ()
    device: str | None = None  # "cuda", "cuda:1", "cpu"; None: CUDA when available
    precision: Precision = "bf16"  # CUDA autocast; the CPU always runs fp32
    compile: bool = False  # torch.compile the encoder (CUDA; pays off on long runs)
    threads: int | None = None  # CPU threads for torch (None: torch's default)
    # tiles per forward pass; "auto": measured from free memory on CUDA (every encoder's probe, the
    # smallest wins, at most 256), CPU_BATCH elsewhere; 128 x 256 px fills an H100 for RetCCL in bf16
    batch_size: int | Literal["auto"] = 128
    #: background readers (threads inside dask workers, which may not fork); default: the cores but one
    readers: int = field(default_factory=lambda: default_readers())
    reader_mode: Literal["process", "thread"] = "process"  # threads: no shared memory (small /dev/shm)
    dtype: Literal["float16", "float32"] = "float16"  # feats on disk; float32 when beyond float16's range
    max_bad_tiles: float = 0.05  # fraction of unreadable tiles above which a slide fails
    use_cache: bool = True  # read the --save-tiles zarr cache when it is complete
    overwrite: bool = False  # redo bags that are already complete
    # where JPEG tiles are decoded and resized: "device" (readers send compressed tiles; device_decode/),
    # "cpu" (readers decode with openslide/tiffslide), "auto" (device on CUDA for JPEG TIFFs, else cpu)
    decode: Literal["cpu", "device", "auto"] = "auto"
    # stain normalisation on the tiles' device before the encoders (opt-in): macenko | reinhard | None
    stain_norm: Literal["macenko", "reinhard"] | None = None
    # the reference to map onto: a saved reference (.json), an image, a folder of images, or a tile file
    # (tiles/<slide_id>.h5) to fit it from; None: the shipped default of the method (models/stain.py)
    stain_reference: str | None = None

    def choices(self) -> tuple[EncoderChoice, ...]:
        """The encoders of this run, in order (without `encoders`: the one of the single-encoder fields)."""
        if self.encoders:
            return self.encoders
        return (EncoderChoice(self.encoder, self.weights, self.expected_sha256, self.input_px),)

    def __post_init__(self) -> None:
        """Value checks for direct construction too (parse_config also checks the types)."""
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision {self.precision!r} unknown; choose bf16, fp16 or fp32")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} unknown; choose float16 or float32")
        if not 0.0 <= self.max_bad_tiles < 1.0:
            raise ConfigError(f"--max-bad-tiles is a fraction in [0, 1), got {self.max_bad_tiles}")
        if self.reader_mode not in ("process", "thread"):
            raise ConfigError(f"--reader-mode {self.reader_mode!r} unknown; choose process or thread")
        if self.decode not in DECODES:
            raise ConfigError(f"--decode {self.decode!r} unknown; choose cpu, device or auto")
        if (self.batch_size != "auto" and self.batch_size < 1) or self.readers < 0:
            raise ConfigError(f"--batch-size ({self.batch_size}) must be >= 1 or auto, and --readers >= 0")
        if self.stain_norm is not None and self.stain_norm not in STAIN_NORMS:
            raise ConfigError(f"--stain-norm {self.stain_norm!r} unknown; choose macenko or reinhard")
        if self.stain_reference is not None and self.stain_norm is None:
            raise ConfigError("--stain-reference needs --stain-norm macenko|reinhard")
        if self.encoders:
            single = (self.encoder, self.weights, self.expected_sha256, self.input_px)
            if single != ("retccl", None, None, None):
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
