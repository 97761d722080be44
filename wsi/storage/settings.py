"""Where remote files are cached and how much memory range reads may hold: `StorageSettings`, read from the
environment so that every process of a run (dask workers, reader processes) sees the same values.

    WSI_CACHE_DIR     local cache root [default: $XDG_CACHE_HOME/wsi, else ~/.cache/wsi]
    WSI_CACHE_GB      most local copies of remote slides may take on disk [default 50]
    WSI_BLOCK_MB      size of one range read of a remote slide [default 2]
    WSI_CACHE_BLOCKS  blocks kept in memory per open remote slide (LRU) [default 64]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from wsi.core.config import config_model, parse_config, setting

#: environment variable -> StorageSettings field
VARIABLES = {
    "WSI_CACHE_DIR": "cache_dir", "WSI_CACHE_GB": "cache_gb", "WSI_BLOCK_MB": "block_mb",
    "WSI_CACHE_BLOCKS": "blocks",
}  # fmt: skip


@config_model
@dataclass(frozen=True)
class StorageSettings:
    """The local side of remote storage: cache folder and size, range-read block size and count."""

    cache_dir: Path | None = setting(
        None, help="Local cache root for copies of remote slides and output folders being written."
    )
    cache_gb: float = setting(
        50.0,
        gt=0,
        le=1_000_000,
        help="Disk the local copies of remote slides may take (least recently used go first).",
    )
    block_mb: float = setting(2.0, gt=0, le=1024, help="One range read of a remote slide, in MB.")
    blocks: int = setting(64, ge=1, le=100_000, help="Blocks kept in memory per open remote slide.")

    @property
    def root(self) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg) if xdg else Path.home() / ".cache") / "wsi"

    @property
    def block_bytes(self) -> int:
        return max(4096, int(self.block_mb * (1 << 20)))


def storage_settings() -> StorageSettings:
    """The settings from the environment (ConfigError naming the variable's field when one is invalid)."""
    given = {field: os.environ[name] for name, field in VARIABLES.items() if os.environ.get(name)}
    return parse_config(StorageSettings, given, source="environment (WSI_CACHE_DIR, WSI_CACHE_GB, ...)")


__all__ = ["VARIABLES", "StorageSettings", "storage_settings"]
