"""What `wsi info FOLDER` reports: a folder of feature bags or tile files, or a run folder, in a few lines.

A user who has just run `wsi tile` / `wsi embed` wants to know what a folder holds before training on it:
which encoder's bags (and their width) or which tile size, how many, the tiles per slide, which files
`wsi train` / `wsi predict` / `wsi embed` would refuse and why, and what the stage's manifest.csv says.
Only HDF5 attributes and dataset shapes are read (`scan_bag_header`, `read_tile_meta`), so 10,000 bags
take seconds; `features=True` also reads every bag's features for NaN (`scan_bag`, bounded memory).

The manifest is read as the CSV it is (columns slide, path, status, tiles, seconds, error, note:
docs/architecture.md), because the slide side of `wsi` never imports `wsi.pipelines`, which writes it.
"""

from __future__ import annotations

import csv
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wsi.core.errors import TileFileError, WsiError
from wsi.core.files import is_temp_name
from wsi.core.suffixes import BAG_SUFFIX
from wsi.formats.bags import BadBag, BagHeader, bag_folders_below, scan_bag, scan_bag_header
from wsi.formats.hdf5 import to_stored
from wsi.formats.tile_file import is_tile_file, read_tile_meta

MANIFEST = "manifest.csv"
#: the manifest statuses, in the order they are shown (pipelines/scheduling/jobs.py STATUSES)
STATUSES = ("ok", "skipped", "empty", "failed")
#: the root attribute naming a bag's encoder: ours `encoder`, STAMP's `extractor` (CLAM, TRIDENT: none)
ENCODER_ATTRS = ("encoder", "extractor")


@dataclass(frozen=True)
class Spread:
    """Tiles per slide over a folder's readable files."""

    total: int
    min: int
    median: float
    max: int


@dataclass(frozen=True)
class EncoderGroup:
    """Bags of one encoder and feature width (CLAM and TRIDENT bags name no encoder: "unknown")."""

    encoder: str
    layout: str  # wsi | stamp | clam | trident
    dim: int
    dtype: str
    bags: int


@dataclass(frozen=True)
class TileSizeGroup:
    tile_um: float
    tile_px: int
    files: int


@dataclass(frozen=True)
class BagsPart:
    count: int
    encoders: list[EncoderGroup]  # most bags first
    tiles: Spread | None  # None when no bag reads
    empty: int  # bags with no tiles (also in `unusable`)

    @property
    def mixed(self) -> bool:
        """Bags of more than one encoder or width: no model takes them together."""
        return len({(e.encoder, e.dim) for e in self.encoders if e.dim}) > 1


@dataclass(frozen=True)
class TilesPart:
    count: int
    tile_sizes: list[TileSizeGroup]  # most files first
    tiles: Spread | None
    empty: int  # tile files that kept no tile (their slide's bag would be empty)


@dataclass(frozen=True)
class Manifest:
    """A stage's manifest.csv: rows per status and the failed slides with their error."""

    file: str
    slides: int = 0
    status: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (slide, error)
    error: str = ""  # why it cannot be read ("" when it can)


@dataclass(frozen=True)
class FolderSummary:
    """One folder of tile files and/or bags."""

    folder: str
    files: int  # *.h5 files in it
    tile_files: TilesPart | None
    bags: BagsPart | None
    unusable: list[BadBag]  # files the next command refuses (wsi embed, train, predict), and why
    features_read: bool  # bags' features read for NaN (else attributes and shapes only)
    manifest: Manifest | None  # None: no manifest.csv

    @property
    def kind(self) -> str:
        kinds = [name for name, got in (("tile files", self.tile_files), ("feature bags", self.bags)) if got]
        return " and ".join(kinds) or "no files, a manifest only"

    def to_json(self) -> dict[str, object]:
        fields = asdict(self)
        if fields["tile_files"] is not None:  # the tile side under its stored names, as in the files
            fields["tile_files"]["tile_sizes"] = [to_stored(g) for g in fields["tile_files"]["tile_sizes"]]
        if self.bags is not None:
            fields["bags"]["mixed"] = self.bags.mixed
        return {"folder": fields.pop("folder"), "kind": self.kind, **fields}


@dataclass(frozen=True)
class RunSummary:
    """A run folder (or a features/ folder): each tile / bag folder in it."""

    folder: str
    parts: list[FolderSummary]

    @property
    def unusable(self) -> list[BadBag]:
        return [bad for part in self.parts for bad in part.unusable]

    def to_json(self) -> dict[str, object]:
        return {"folder": self.folder, "kind": "run folder", "parts": [p.to_json() for p in self.parts]}


def folder_info(folder: Path, *, features: bool = False) -> FolderSummary | RunSummary:
    """One folder's summary, or a run folder's: one summary per tile / bag folder in it (RUN/tiles,
    RUN/features/<encoder>, two levels down at most).

    Raises WsiError naming the folder when it holds nothing of ours, nor folders that do.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise WsiError(f"{folder}: folder not found")
    files = _h5_files(folder)
    if files or (folder / MANIFEST).is_file():
        return _one_folder(folder, files, features=features)
    parts = [p for p in (folder / "tiles",) if p.is_dir() and _holds_outputs(p)] + bag_folders_below(folder)
    if not parts:
        raise WsiError(
            f"{folder} holds no tile files, feature bags (*{BAG_SUFFIX}) or {MANIFEST}, nor folders that do; "
            "give a folder `wsi tile` or `wsi embed` wrote: RUN/tiles, RUN/features/<encoder>, or RUN itself"
        )
    return RunSummary(str(folder), [_one_folder(p, _h5_files(p), features=features) for p in parts])


def _one_folder(folder: Path, files: list[Path], *, features: bool) -> FolderSummary:
    """Each file is opened once in a folder of one kind (a second open per file is a third of the time):
    tile files are told by their `format` when the first file is one, else by failing as bags."""
    tiles: list[Path] = []
    headers: list[tuple[Path, BagHeader | None, BadBag | None]] = []
    tiles_first = bool(files) and is_tile_file(files[0])
    for path in files:
        if tiles_first and is_tile_file(path):
            tiles.append(path)
            continue
        header, bad = scan_bag_header(path, attr_names=ENCODER_ATTRS)
        if header is None and not tiles_first and is_tile_file(path):
            tiles.append(path)
        else:
            headers.append((path, header, bad))
    unusable: list[BadBag] = []
    return FolderSummary(
        folder=str(folder),
        files=len(files),
        tile_files=_tile_files(tiles, unusable) if tiles else None,
        bags=_bags(headers, unusable, features=features) if headers else None,
        unusable=unusable,
        features_read=features,
        manifest=_manifest(folder / MANIFEST),
    )


def _tile_files(paths: list[Path], unusable: list[BadBag]) -> TilesPart:
    sizes: Counter[tuple[float, int]] = Counter()
    counts: list[int] = []
    for path in paths:
        try:
            meta = read_tile_meta(path)
        except TileFileError as exc:
            unusable.append(BadBag(path, str(exc)))
            continue
        sizes[(float(meta.tile_um), int(meta.tile_px))] += 1
        counts.append(meta.n_kept)
    groups = [TileSizeGroup(um, px, n) for (um, px), n in sizes.most_common()]
    return TilesPart(len(paths), groups, _spread(counts), sum(1 for n in counts if n == 0))


def _bags(
    headers: list[tuple[Path, BagHeader | None, BadBag | None]], unusable: list[BadBag], *, features: bool
) -> BagsPart:
    kinds: Counter[tuple[str, str, int, str]] = Counter()
    counts: list[int] = []
    for path, header, bad in headers:
        if bad is None and features:
            bad = scan_bag(path)
        if bad is not None:
            unusable.append(bad)
        if header is not None:
            kinds[(_encoder(header), header.layout, header.dim, header.dtype)] += 1
            counts.append(header.n_tiles)
    groups = [EncoderGroup(*key, n) for key, n in kinds.most_common()]
    return BagsPart(len(headers), groups, _spread(counts), sum(1 for n in counts if n == 0))


def _encoder(header: BagHeader) -> str:
    for key in ENCODER_ATTRS:
        value = header.attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return "unknown"


def _spread(counts: list[int]) -> Spread | None:
    if not counts:
        return None
    return Spread(sum(counts), min(counts), float(statistics.median(counts)), max(counts))


def _manifest(path: Path) -> Manifest | None:
    if not path.is_file():
        return None
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        status = Counter(str(row["status"]) for row in rows)
        failed = [(str(row["slide"]), row.get("error") or "") for row in rows if row["status"] == "failed"]
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError) as exc:
        return Manifest(str(path), error=f"cannot be read ({type(exc).__name__}: {exc})")
    order = [s for s in STATUSES if s in status] + sorted(s for s in status if s not in STATUSES)
    return Manifest(str(path), len(rows), {s: status[s] for s in order}, failed)


def _h5_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(f"*{BAG_SUFFIX}") if p.is_file() and not is_temp_name(p))


def _holds_outputs(folder: Path) -> bool:
    return bool(_h5_files(folder)) or (folder / MANIFEST).is_file()


__all__ = [
    "MANIFEST",
    "BagsPart",
    "EncoderGroup",
    "FolderSummary",
    "Manifest",
    "RunSummary",
    "Spread",
    "TileSizeGroup",
    "TilesPart",
    "folder_info",
]
