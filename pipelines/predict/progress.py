"""What `wsi predict` has finished, so an interrupted run loses nothing and a re-run skips finished cases.

`OUT/predict_progress.jsonl` gets one JSON line per case predicted (appended and flushed as it finishes):
the case's key, its predictions row, its outputs at full precision (so patient means and figures of a
re-run equal an uninterrupted run's), the tiles it used, its output files and its top-tile rows. A
re-run skips a case whose line has the same key and whose files are still there; the key is a digest
of everything the result depends on:

  the model       sha256 of every checkpoint predict loads, config.json and fitted.json
  the inputs      each slide's bag (or image): path, size and modification time
  the settings    the slide's mpp, heatmaps on/off, the number of top tiles, the slide reader

so another model, a re-embedded bag or other options recompute the case. `--overwrite` starts afresh.
A line cut short by a kill is ignored. Failed cases are not recorded: a re-run tries them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wsi.core.errors import ConfigError
from wsi.core.files import disk_full_error, is_disk_full, sha256_file
from wsi.pipelines.inputs import Item

log = logging.getLogger(__name__)

PROGRESS_NAME = "predict_progress.jsonl"
#: seconds between two rewrites of predictions.csv and manifest.csv while cases finish
FLUSH_SECONDS = 2.0


def model_digest(run_dir: Path, checkpoints: Sequence[Path]) -> str:
    """sha256 over every file a prediction depends on: the checkpoints, and config.json and fitted.json
    of the run folder and of each checkpoint's folder (a cross-validation run's folds)."""
    digest = hashlib.sha256()
    folders = {Path(run_dir), *(p.parent for p in checkpoints)}
    files = [*checkpoints, *(f / name for f in folders for name in ("config.json", "fitted.json"))]
    for path in sorted({p for p in files if p.is_file()}):
        digest.update(f"{path.relative_to(run_dir)}:{sha256_file(path)};".encode())
    return digest.hexdigest()


def _fingerprint(path: Path) -> list[Any]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None]
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def case_key(model: str, case: Item, settings: Mapping[str, Any]) -> str:
    """The digest a finished case is recorded under (see the module docstring)."""
    slides = [(sid, _fingerprint(Path(p))) for sid, p in case.slides] or [(case.id, _fingerprint(case.path))]
    text = json.dumps({"model": model, "case": case.id, "slides": slides, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Finished:
    """One case's recorded result."""

    key: str
    case: str
    row: dict[str, Any]  # the predictions.csv row (outputs as floats, derived cells as text)
    output: list[float]  # (K,) the kind's outputs, full precision
    n: int  # tiles (or 1 for an image)
    files: list[str] = field(default_factory=list)  # output files made for it, relative to OUT
    top_rows: list[list[Any]] = field(default_factory=list)  # its top_tiles/index.csv rows
    top_skipped: list[list[str]] = field(default_factory=list)  # its top_tiles/skipped.csv rows
    note: str = ""  # what was not made for it, and why (the manifest's `note`)
    model: str = ""  # the model digest it was predicted with ("" from versions before it was recorded)
    model_dir: str = ""  # the run folder it was predicted with (named when another model is refused)
    patient: str = ""  # its patient (slide-level runs), for patient means over every recorded slide


class Progress:
    """The progress file of one output folder: what is finished, and appending what finishes."""

    def __init__(self, out_dir: Path, *, fresh: bool) -> None:
        self.out_dir = out_dir
        self.path = out_dir / PROGRESS_NAME
        self.done: dict[str, Finished] = {}
        if fresh:
            self.path.unlink(missing_ok=True)
        elif self.path.is_file():
            self.done = {f.key: f for f in _read(self.path)}

    def check_model(self, model: str, model_dir: Path, predictions: Path) -> None:
        """Refuse to mix models in one folder: predictions.csv holds one model's rows, so a run with another
        model (or a predictions.csv this record does not explain) needs another --out or --overwrite."""
        others = [f for f in self.done.values() if f.model != model]
        if others:
            names = sorted({f.model_dir or "a model not recorded (an earlier wsi version)" for f in others})
            raise ConfigError(
                f"{self.out_dir} holds predictions of {len(others)} case(s) made with another model "
                f"({'; '.join(names)[:300]}); predicting with {model_dir} would replace them in "
                f"{predictions.name}: choose another --out, or give --overwrite to replace them"
            )
        if not self.done and _has_rows(predictions):  # a header alone: a run whose every case failed
            raise ConfigError(
                f"{predictions} exists but {self.path.name} does not say how it was made; choose another "
                "--out, or give --overwrite to replace it"
            )

    def earlier(self, model: str, exclude: set[str]) -> list[Finished]:
        """The latest recorded result of each case of this model not in `exclude` (cases of earlier calls
        into this folder, e.g. with other --features: kept in predictions.csv, merged by case)."""
        latest: dict[str, Finished] = {}
        for found in self.done.values():  # in file order: a later line of a case wins
            if found.model == model and found.case not in exclude:
                latest.pop(found.case, None)
                latest[found.case] = found
        return list(latest.values())

    def get(self, key: str) -> Finished | None:
        """The case's recorded result when its key matches and its output files are still there."""
        found = self.done.get(key)
        if found is None or not all((self.out_dir / f).is_file() for f in found.files):
            return None
        return found

    def add(self, finished: Finished) -> None:
        """Append one line and push it to disk (a kill right after loses nothing)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(asdict(finished)) + "\n"
        try:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(self.out_dir, len(line), self.path.name) from None
            raise
        self.done[finished.key] = finished


def _has_rows(csv_path: Path) -> bool:
    try:
        with csv_path.open(encoding="utf-8", errors="replace") as fh:
            return sum(1 for line in fh if line.strip()) > 1
    except OSError:
        return False


def _read(path: Path) -> Iterable[Finished]:
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            try:
                yield Finished(**json.loads(line))
            except (ValueError, TypeError, RecursionError):  # cut short by a kill, another version's
                log.debug("%s line %d unreadable; that case is predicted again", path, n)


class Flusher:
    """Calls `write` at most every FLUSH_SECONDS (and always on `now`): results appear as slides finish
    without rewriting a large CSV after every one of thousands of slides."""

    def __init__(self, write: Callable[[], None], seconds: float = FLUSH_SECONDS) -> None:
        self.write = write
        self.seconds = seconds
        self.last = time.monotonic()

    def maybe(self) -> None:
        if time.monotonic() - self.last >= self.seconds:
            self.now()

    def now(self) -> None:
        self.write()
        self.last = time.monotonic()


__all__ = ["FLUSH_SECONDS", "PROGRESS_NAME", "Finished", "Flusher", "Progress", "case_key", "model_digest"]
