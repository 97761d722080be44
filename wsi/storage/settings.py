"""Where remote files are cached and how much memory range reads may hold: `StorageSettings`, read from the
environment so that every process of a run (dask workers, reader processes) sees the same values.

    WSI_CACHE_DIR     local cache root [default: $XDG_CACHE_HOME/wsi, else ~/.cache/wsi]
    WSI_CACHE_GB      most local copies of remote slides may take on disk [default 50]
    WSI_BLOCK_MB      size of one range read of a remote slide [default 2]
    WSI_CACHE_BLOCKS  blocks kept in memory per open remote slide (LRU) [default 64]
    WSI_LOCK_LEASE_S  how long a remote output's lock stays valid without renewal [default 120]

`check_environment()` checks them all once, when a command starts: a bad value is one usage error that
names the variable (not a failure per slide later, when a worker first reads it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from wsi.core.config import config_model, parse_config, setting
from wsi.core.errors import ConfigError

#: environment variable -> StorageSettings field
VARIABLES = {
    "WSI_CACHE_DIR": "cache_dir", "WSI_CACHE_GB": "cache_gb", "WSI_BLOCK_MB": "block_mb",
    "WSI_CACHE_BLOCKS": "blocks", "WSI_LOCK_LEASE_S": "lock_lease_s",
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
    lock_lease_s: float = setting(
        120.0,
        ge=2,
        le=86_400,
        help="Seconds a remote output folder's lock stays valid without renewal (renewed while the "
        "command runs; a lock left by a killed run is taken over after it).",
    )

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


def check_environment() -> StorageSettings:
    """Every WSI_* storage variable checked, each problem naming the variable: ConfigError (exit 2)."""
    problems = []
    for name, field in VARIABLES.items():
        value = os.environ.get(name)
        if not value:
            continue
        try:
            parse_config(StorageSettings, {field: value}, source=name)
        except ConfigError as exc:
            why = str(exc).split(": ", 1)[-1].split(" (valid fields", 1)[0].split(": ", 1)[-1]
            problems.append(f"{name}={value!r}: {why}")
    if problems:
        raise ConfigError(
            "invalid environment setting(s): " + "; ".join(problems) + ". Fix or unset the variable(s) "
            "(defaults: WSI_CACHE_GB 50, WSI_BLOCK_MB 2, WSI_CACHE_BLOCKS 64, WSI_LOCK_LEASE_S 120)"
        )
    settings = storage_settings()
    _check_cache_dir(settings)
    return settings


def _check_cache_dir(settings: StorageSettings) -> None:
    """The cache root must be a folder, or creatable as one (it is created when first needed)."""
    root = settings.root
    given, xdg = os.environ.get("WSI_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME")
    if given:
        name, fix = f"WSI_CACHE_DIR={given!r}", "or unset it"
    elif xdg:  # the variable that placed the cache is the one to name
        name = f"the cache folder {root} (from XDG_CACHE_HOME={xdg!r}; WSI_CACHE_DIR unset)"
        fix = "or point XDG_CACHE_HOME at a folder"
    else:
        name, fix = f"the cache folder {root} (WSI_CACHE_DIR unset)", "or make that folder creatable"
    blocker = next((p for p in (root, *root.parents) if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        what = "is" if blocker == root else f"lies below {blocker}, which is"
        raise ConfigError(
            f"{name}: {what} not a folder ({_kind(blocker)}); point WSI_CACHE_DIR at a folder wsi may "
            f"create and write (it keeps copies of remote slides and mirrors of remote outputs), {fix}"
        )
    if root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{name}: the folder is not writable; point WSI_CACHE_DIR at a folder you can write"
        )


def _kind(path: Path) -> str:
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return "a broken link"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a folder"


__all__ = ["VARIABLES", "StorageSettings", "check_environment", "storage_settings"]
