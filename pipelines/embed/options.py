"""Every option of the embed stage, as one typed config validated through `wsi.config`.

`wsi embed` parses its command-line options into `EmbedOptions` with `parse_config` (unknown keys
refused, types checked); library callers may build it directly, which runs the same value checks.

Public API:
  EmbedOptions                      frozen, picklable (sent to dask workers); defaults are `wsi embed`'s
  default_readers() -> int          reader processes: every core but one, 1 to 16
  PRECISIONS, DTYPES, DECODES       the allowed values of precision, dtype and decode
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


def default_readers() -> int:
    """Reader processes: every core but the one feeding the device, at most 16."""
    return max(1, min(16, (os.cpu_count() or 1) - 1))


@config_model
@dataclass(frozen=True)
class EmbedOptions:
    """Options of the embed stage; defaults are what `wsi embed` uses."""

    encoder: str = "retccl"  # retccl, or timm:<architecture>
    weights: str | None = None  # weights file (.pth/.pt/.bin state dict, or .safetensors)
    random_init: bool = False  # explicit: a bag of random features must never happen by accident
    expected_sha256: str | None = None  # refuse weights whose sha256 differs
    input_px: int | None = None  # timm encoders only; retccl is fixed at 256
    device: str | None = None  # "cuda", "cuda:1", "cpu"; None: CUDA when available
    precision: Precision = "bf16"  # CUDA autocast; the CPU always runs fp32
    compile: bool = False  # torch.compile the encoder (CUDA; pays off on long runs)
    threads: int | None = None  # CPU threads for torch (None: torch's default)
    batch_size: int = 128  # tiles per forward pass; 128 x 256 px fills an H100 in bf16
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
        if self.batch_size < 1 or self.readers < 0:
            raise ConfigError(f"--batch-size ({self.batch_size}) must be >= 1 and --readers >= 0")
