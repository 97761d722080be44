"""Packaged YAML configs: model presets (`configs/models/`), tasks (`configs/tasks/`) and the baselines'
authors' recipes (`configs/recipes/`).

Found through importlib.resources so they work from an installed wheel as well as a source tree.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path
from typing import Any

from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject
from wsi.core.user_text import load_yaml_file, parse_yaml


def available(kind: str) -> list[str]:
    """Names of the packaged configs of one kind ('models' or 'tasks')."""
    folder = resources.files(__name__).joinpath(kind)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_yaml(kind: str, name_or_path: str | Path) -> tuple[JsonObject, str]:
    """Load a packaged config by name, or any YAML file by path (UTF-8, no aliases: wsi.core.user_text).
    Returns (data, source): the YAML as it is, before any validation (JSON-like: free-form here).

    Parsed once per file version: one `wsi train` asks for its preset from the recipe, the input checks
    and every model build. A file is keyed by its size and modification time, so an edit is seen; each
    caller gets its own copy to change."""
    candidate = Path(name_or_path)
    stamp: tuple[int, int] | None = None
    if candidate.is_file():
        st = candidate.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    data, source = _load_yaml_once(kind, str(name_or_path), stamp)
    return copy.deepcopy(data), source


@functools.lru_cache(maxsize=64)
def _load_yaml_once(
    kind: str, name_or_path: str, stamp: tuple[int, int] | None
) -> tuple[JsonObject, str]:
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} or candidate.exists():
        if not candidate.is_file():
            raise ConfigError(f"{kind[:-1]} file {name_or_path} does not exist")  # as given: no s3:/ fold
        return _mapping(load_yaml_file(candidate, what=f"{kind[:-1]} file"), str(candidate))
    res = resources.files(__name__).joinpath(kind, f"{name_or_path}.yaml")
    if not res.is_file():
        raise ConfigError(
            f"unknown {kind[:-1]} {name_or_path!r}; packaged ones: {', '.join(available(kind))}, "
            "or give a path to a YAML file"
        )
    text, source = res.read_text(encoding="utf-8"), f"configs/{kind}/{name_or_path}.yaml"  # ours
    return _mapping(parse_yaml(text, source), source)


def _mapping(data: Any, source: str) -> tuple[JsonObject, str]:
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping at the top level")
    return data, source
