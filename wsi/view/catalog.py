"""What `wsi view DIR` shows: the slides of a prediction, training or tiling folder and their files.

The viewer reads files only (it never imports `pipelines` or `models`), from the places those stages
write them:

  predict     DIR/manifest.csv (slide, path: the slide, or the bag whose `slide_path` names it, status,
              error), DIR/predictions.csv (one row per slide), DIR/heatmaps/<id>.json (per-tile
              contributions, `pipelines.heatmaps.write_tile_values`), DIR/top_tiles/index.csv, and for
              raw slides DIR/work/tiles/<id>.h5
  tile        DIR/tiles/manifest.csv, DIR/tiles/<id>.h5 (kept tiles and the slide path), DIR/qc/<id>.png;
              DIR/qc/<id>.geojson and DIR/geojson/<id>.geojson (QuPath objects: tissue, tile fates)
              DIR may also be the tiles/ folder itself
  train       DIR/config.json, whose `source` is the bag folder (each bag records its `slide_path`), and
              DIR/test_predictions.csv
  embed       DIR/*.h5 or DIR/features/<encoder>/*.h5 bags

A slide is listed once, by id; its file is the first one these name. Slides whose file is not
reachable from here are listed with the reason, so a moved folder says why nothing shows.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import h5py

from wsi.core.json_types import JsonObject
from wsi.core.suffixes import BAG_SUFFIX, NAMED_SLIDE_SUFFIXES, TILE_FILE_SUFFIX, name_suffix
from wsi.formats.hdf5 import attrs_of
from wsi.formats.tile_file import FORMAT as TILE_FORMAT
from wsi.storage import Url, location

log = logging.getLogger(__name__)


class SlideSummary(TypedDict):
    """One row of the page's slide list (no absolute path leaves the server)."""

    id: str
    viewable: bool
    why_missing: str
    status: str
    error: str
    prediction: dict[str, str]
    has_heatmap: bool
    has_tiles: bool
    has_qc: bool
    geojson: list[str]
    n_top_tiles: int


class Listing(TypedDict):
    folder: str
    kind: str  # what the folder is ("folder" when nothing more is known)
    slides: list[SlideSummary]


@dataclass
class SlideEntry:
    """One slide of the folder: where its file is, and the files about it."""

    slide_id: str
    path: Path | Url | None = None  # a URL (s3://...) is opened in place (wsi.storage)
    mpp: float | None = None  # level-0 um/px recorded by the stage that read it (None: the slide's own)
    why_missing: str = ""
    status: str = ""
    error: str = ""
    prediction: dict[str, str] = field(default_factory=dict)
    tile_file: Path | None = None
    heatmap_json: Path | None = None
    qc_png: Path | None = None
    geojson: dict[str, Path] = field(default_factory=dict)  # layer name -> QuPath GeoJSON file
    top_tiles: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> SlideSummary:
        """The slide list's row (JSON): no absolute path leaves the server."""
        return {
            "id": self.slide_id,
            "viewable": self.path is not None,
            "why_missing": self.why_missing,
            "status": self.status,
            "error": self.error,
            "prediction": self.prediction,
            "has_heatmap": self.heatmap_json is not None,
            "has_tiles": self.tile_file is not None,
            "has_qc": self.qc_png is not None,
            "geojson": sorted(self.geojson),
            "n_top_tiles": len(self.top_tiles),
        }


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return [dict(row) for row in csv.DictReader(fh)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        log.warning("%s: not read (%s)", path, exc)
        return []


def _h5_attrs(path: Path) -> JsonObject:
    try:
        with h5py.File(path, "r") as h5:
            return attrs_of(h5)
    except (OSError, ValueError) as exc:
        log.debug("%s: not an HDF5 file we can read (%s)", path, exc)
        return {}


def _slide_of(path: Path | Url) -> tuple[Path | Url | None, float | None, str]:
    """(slide file, recorded mpp, why not) for a path a manifest names: a slide, or a bag / tile file
    that records its slide. A slide's URL is taken as reachable (opening it says otherwise)."""
    if isinstance(path, Url):
        found = name_suffix(path.name) in NAMED_SLIDE_SUFFIXES
        return (path, None, "") if found else (None, None, f"{path} is not a slide file")
    if name_suffix(path) in NAMED_SLIDE_SUFFIXES:
        return (path, None, "") if path.is_file() else (None, None, f"slide file {path} not found")
    if name_suffix(path) == BAG_SUFFIX and path.is_file():
        attrs = _h5_attrs(path)
        recorded = attrs.get("slide_path")
        if not recorded:
            return None, None, f"{path.name} records no slide path (made by another tool?)"
        slide = location(str(recorded))
        mpp = attrs.get("mpp")
        known = float(mpp) if isinstance(mpp, int | float | str) else None
        if isinstance(slide, Url):
            return slide, known, ""
        if not slide.is_file():
            return None, None, f"slide file {slide} (recorded in {path.name}) is not reachable from here"
        return slide, known, ""
    return None, None, f"{path} is neither a slide nor a bag that names one"


class Catalog:
    """The slides of one folder, by id (in the order found)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.slides: dict[str, SlideEntry] = {}
        self.kind = ""
        self._scan()

    # ---------------------------------------------------------------------------------------- scanning
    def _entry(self, slide_id: str) -> SlideEntry:
        return self.slides.setdefault(slide_id, SlideEntry(slide_id))

    def _offer(self, slide_id: str, path: Path | Url, mpp: float | None = None) -> None:
        """Record where a slide's file may be; the first reachable one wins. A later offer of the same
        file with the mpp it was read at (a tile file's) supplies the mpp the first one lacked (a
        manifest's row): a slide or plain image tiled at --mpp cannot be opened without it."""
        entry = self._entry(slide_id)
        if entry.path is not None:
            if entry.mpp is None and mpp is not None and str(path) == str(entry.path):
                entry.mpp = mpp
            return
        slide, recorded, why = _slide_of(path)
        if slide is None:
            entry.why_missing = entry.why_missing or why
            return
        entry.path, entry.mpp, entry.why_missing = slide, mpp if mpp is not None else recorded, ""

    def _scan(self) -> None:
        root = self.root
        tiles_dir = root / "tiles" if (root / "tiles").is_dir() else root
        for manifest in (root / "manifest.csv", root / "tiles" / "manifest.csv"):
            for row in _read_csv(manifest) if manifest.is_file() else []:
                slide_id, path = row.get("slide", ""), row.get("path", "")
                if not slide_id:
                    continue
                entry = self._entry(slide_id)
                entry.status = entry.status or row.get("status", "")
                entry.error = entry.error or row.get("error", "")
                if path:
                    self._offer(slide_id, location(path))
        for folder in (tiles_dir, root / "work" / "tiles"):
            for h5 in sorted(folder.glob(f"*{TILE_FILE_SUFFIX}")) if folder.is_dir() else []:
                self._tile_file(h5)
        bag_dirs = [root, *sorted(p for p in (root / "features").glob("*") if p.is_dir())]
        bag_dirs += sorted(p for p in (root / "work" / "features").glob("*") if p.is_dir())
        record = root / "config.json"
        if record.is_file():
            self.kind = "train"
            try:
                source = json.loads(record.read_text(encoding="utf-8")).get("source")
            except (OSError, ValueError, AttributeError, RecursionError):
                source = None
            if source and Path(str(source)).is_dir():
                bag_dirs.append(Path(str(source)))
        for folder in bag_dirs:
            for bag in sorted(folder.glob(f"*{BAG_SUFFIX}")):
                attrs = _h5_attrs(bag)
                if attrs.get("format") == TILE_FORMAT or not attrs.get("slide_path"):
                    continue
                slide_id = str(attrs.get("slide_id") or bag.name[: -len(BAG_SUFFIX)])
                self._offer(slide_id, bag)
        self._predictions()
        self._files()

    def _tile_file(self, h5: Path) -> None:
        attrs = _h5_attrs(h5)
        if attrs.get("format") != TILE_FORMAT or not attrs.get("complete"):
            return
        slide_id = str(attrs.get("slide_id") or h5.name[: -len(TILE_FILE_SUFFIX)])
        entry = self._entry(slide_id)
        entry.tile_file = entry.tile_file or h5
        recorded = attrs.get("slide_path")
        if recorded:
            mpp = attrs.get("mpp")
            known = float(mpp) if isinstance(mpp, int | float) and mpp else None
            self._offer(slide_id, location(str(recorded)), known)
        self.kind = self.kind or "tile"

    def _predictions(self) -> None:
        """predictions.csv of `wsi predict`, else test_predictions.csv of a training run."""
        path = self.root / "predictions.csv"
        if path.is_file():
            self.kind = "predict"
        else:
            path = self.root / "test_predictions.csv"
        if not path.is_file():
            return
        for row in _read_csv(path):
            slide_id = row.get("slide")
            if slide_id:  # patient-level rows name no slide: the slide list shows slides
                self._entry(slide_id).prediction = {k: v for k, v in row.items() if k != "slide" and v}

    def _files(self) -> None:
        root = self.root
        for slide_id, entry in self.slides.items():
            heat = root / "heatmaps" / f"{slide_id}.json"
            entry.heatmap_json = heat if heat.is_file() else None
            qcs = [root / "qc" / f"{slide_id}.png", root / "work" / "qc" / f"{slide_id}.png"]
            entry.qc_png = next((qc for qc in qcs if qc.is_file()), None)
            for layer in ("qc", "geojson"):  # `wsi tile`'s QC objects; `wsi predict`'s tile objects
                objects = root / layer / f"{slide_id}.geojson"
                if objects.is_file():
                    entry.geojson[layer] = objects
        index = root / "top_tiles" / "index.csv"
        for row in _read_csv(index) if index.is_file() else []:
            listed = self.slides.get(row.get("slide", ""))
            if listed is not None:
                listed.top_tiles.append(row)

    # --------------------------------------------------------------------------------------- queries
    def get(self, slide_id: str) -> SlideEntry | None:
        return self.slides.get(slide_id)

    def listing(self) -> Listing:
        return {
            "folder": self.root.name,
            "kind": self.kind or "folder",
            "slides": [entry.summary() for entry in self.slides.values()],
        }


__all__ = ["Catalog", "Listing", "SlideEntry", "SlideSummary"]
