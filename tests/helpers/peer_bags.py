"""Feature bags written the way STAMP, CLAM and TRIDENT write them, and STAMP's bag checks restated.

Our own h5py code, following each peer's writer as read in its public source (commits below); nothing
here imports or copies a peer. Used by tests/wsi/formats/test_peer_bags.py, and runnable as a script to write
one cohort of each layout for a manual check with the peers' own readers:

    python tests/helpers/peer_bags.py OUT_DIR       # OUT_DIR/{stamp,clam,trident}/... + labels.csv

Sources (line numbers at these commits):
  KatherLab/STAMP   c54ce06739622c127a83eccb35a7082e504b9aef (v2.5.0)
  mahmoodlab/CLAM   53e2409d4a8189c682c173382964a85f114f923c
  mahmoodlab/TRIDENT a91fa8490e0210ebbbe58452c3babe009e0ab7ca
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

#: the STAMP version our checks stand in for: a bag's `stamp_version` newer than this is refused
STAMP_VERSION = "2.5.0"


# ---------------------------------------------------------------------------------------------- writers
def write_stamp_bag(
    path: Path,
    feats: np.ndarray,
    coords_um: np.ndarray,
    *,
    tile_um: float = 256.0,
    tile_px: int = 224,
) -> Path:
    """As `stamp preprocess` writes a tile bag (src/stamp/preprocessing/__init__.py:345-359): root `coords`
    float32 (N, 2) top-left in level-0 micrometres (tiling.py:335-337), `feats` float16 (N, D), and root
    attributes stamp_version, extractor, unit, tile_size_um, tile_size_px, code_hash, feat_type."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        h5["coords"] = np.asarray(coords_um, np.float32)
        h5["feats"] = np.asarray(feats, np.float16)
        h5.attrs["stamp_version"] = STAMP_VERSION
        h5.attrs["extractor"] = "ctranspath"
        h5.attrs["unit"] = "um"
        h5.attrs["tile_size_um"] = float(tile_um)
        h5.attrs["tile_size_px"] = int(tile_px)
        h5.attrs["code_hash"] = "0123abcd"
        h5.attrs["feat_type"] = "tile"
    return path


def _appendable(h5: h5py.File, name: str, data: np.ndarray, chunk_rows: int) -> h5py.Dataset:
    """A dataset as CLAM's `save_hdf5` and TRIDENT's `save_h5` create it: growable first axis."""
    return h5.create_dataset(
        name, data=data, maxshape=(None, *data.shape[1:]), chunks=(chunk_rows, *data.shape[1:])
    )


def write_clam_bag(path: Path, feats: np.ndarray, coords_px: np.ndarray) -> Path:
    """As CLAM's extract_features_fp.py writes `feat_dir/h5_files/<slide_id>.h5` (compute_w_loader :24-48
    -> utils/file_utils.py:16-34 `save_hdf5` with attr_dict=None): `features` float32 (N, D) and
    `coords` int32 (N, 2) level-0 px top-left, chunks of 32 rows, maxshape (None, ...), NO attributes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        _appendable(h5, "features", np.asarray(feats, np.float32), 32)
        _appendable(h5, "coords", np.asarray(coords_px).astype(np.int32), 32)
    return path


@dataclass(frozen=True)
class TridentGeometry:
    """What TRIDENT's `coords_to_h5` records about a patching run (trident/IO.py:646-687)."""

    patch_size: int = 256  # at the target magnification
    level0_magnification: int = 40
    target_magnification: int = 20
    overlap: int = 0  # px at the target magnification
    level0_width: int = 10000
    level0_height: int = 8000

    @property
    def patch_size_level0(self) -> int:  # IO.py:673, floor division as TRIDENT does it
        return self.patch_size * self.level0_magnification // self.target_magnification

    @property
    def mpp(self) -> float:  # TRIDENT's pixel size: 10 / magnification (WSIPatcher.py:134-142)
        return 10.0 / self.level0_magnification


def write_trident_bag(
    path: Path, feats: np.ndarray, coords_px: np.ndarray, geometry: TridentGeometry = TridentGeometry()
) -> Path:
    """As TRIDENT writes `<coords_dir>/features_<encoder>/<name>.h5` (WSI.extract_patch_features,
    WSI.py:1024-1035, through IO.py:460-515 `save_h5`): `features` float32 (N, D) and `coords` int64
    (N, 2) level-0 px, chunks of 1 row, maxshape (None, ...); attributes on `features` (name, savetodir,
    encoder) and on `coords` (every attribute of the coords file, IO.py:671-681); none on the root."""
    path.parent.mkdir(parents=True, exist_ok=True)
    g = geometry
    with h5py.File(path, "w") as h5:
        _appendable(h5, "features", np.asarray(feats, np.float32), 1).attrs.update(
            {"name": path.stem, "savetodir": str(path.parent), "encoder": "uni_v1"}
        )
        _appendable(h5, "coords", np.asarray(coords_px, np.int64), 1).attrs.update(
            {
                "patch_size": g.patch_size,
                "patch_size_level0": g.patch_size_level0,
                "level0_magnification": g.level0_magnification,
                "target_magnification": g.target_magnification,
                "overlap": g.overlap,
                "name": path.stem,
                "savetodir": str(path.parent.parent),
                "level0_width": g.level0_width,
                "level0_height": g.level0_height,
            }
        )
    return path


# ------------------------------------------------------------------------- STAMP's reader, restated
class StampRefusal(Exception):
    """What STAMP's train / crossval / deploy would raise on a feature folder or bag."""


def _stamp_version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


def stamp_feature_type(feature_dir: Path) -> str:
    """STAMP's `detect_feature_type` (src/stamp/modeling/data.py:424-457), which train.py:56,
    crossval.py:57 and deploy.py:87 all call: every .h5 under the folder (rglob); a file with a
    `feat_type` or an `encoder` root attribute counts as `str(feat_type)`, others as "tile"; more than
    one type, or no .h5 at all, is refused; train then refuses a type other than "tile" (:1292)."""
    types: set[str] = set()
    files = sorted(feature_dir.rglob("*.h5"))
    for file in files:
        with h5py.File(file, "r") as h5:
            feat_type, encoder = h5.attrs.get("feat_type"), h5.attrs.get("encoder")
            types.add(str(feat_type) if feat_type is not None or encoder is not None else "tile")
    if not files:
        raise StampRefusal("No .h5 feature files found in feature_dir.")
    if len(types) > 1:
        raise StampRefusal(f"Multiple feature types detected in {feature_dir}: {types}")
    found = types.pop()
    if found != "tile":
        raise StampRefusal(f"Unknown feature type: {found}")
    return found


def stamp_get_coords(h5: h5py.File) -> tuple[np.ndarray, float]:
    """STAMP's `get_coords` (data.py:741-808) for a bag with `coords`: (coords in um, tile size in um).
    Rule order as STAMP's: `tile_size` + unit "um" (2.0), `tile_size_um` (>= 2.1), a 224 stride (historic,
    coords / 224 * 256); a `stamp_version` newer than STAMP's is refused; nothing else is accepted."""
    coords = np.asarray(h5["coords"][:])
    attrs = h5.attrs
    tile_um: float | None = None
    coords_um: np.ndarray | None = None
    if (size := attrs.get("tile_size")) and attrs.get("unit") == "um":  # noqa: SIM114 (STAMP's rule order)
        tile_um, coords_um = float(size), coords
    elif size := attrs.get("tile_size_um"):
        tile_um, coords_um = float(size), coords
    elif round(float(attrs.get("tile_size", _min_stride(coords)))) == 224:
        tile_um, coords_um = 256.0, coords / 224 * 256
    version = attrs.get("stamp_version")
    if version and _stamp_version_tuple(str(version)) > _stamp_version_tuple(STAMP_VERSION):
        raise StampRefusal(f"features were extracted with a newer version of stamp ({version})")
    if not tile_um or coords_um is None:
        raise StampRefusal("unable to infer coordinates from feature file")
    return coords_um, tile_um


def _min_stride(coords: np.ndarray) -> float:
    """STAMP's `get_stride` (data.py:1150-1161): the smaller of the least steps between sorted unique x
    and sorted unique y (STAMP's own raises on an axis with one value; that case is refused here)."""
    steps = [np.diff(np.unique(coords[:, axis].astype(np.float64))) for axis in (0, 1)]
    if not all(s.size for s in steps):
        raise StampRefusal("get_stride: one coordinate axis has a single value")
    return float(min(s.min() for s in steps))


def stamp_bag_feats(h5: h5py.File) -> np.ndarray:
    """What STAMP's `BagDataset.__getitem__` (data.py:584-655) reads: root `feats`, else
    `patch_embeddings`, as float; never `features`."""
    name = "feats" if "feats" in h5 else "patch_embeddings"
    if name not in h5:
        raise StampRefusal(f"KeyError: {name!r}")
    feats = np.asarray(h5[name][()], dtype=np.float32)
    if feats.ndim != 2:
        raise StampRefusal(f"feats of shape {feats.shape}, expected (N, D)")
    return feats


def stamp_reads(path: Path) -> dict[str, Any]:
    """Everything STAMP's modeling code reads from one tile bag, or StampRefusal with its reason."""
    with h5py.File(path, "r") as h5:
        coords_um, tile_um = stamp_get_coords(h5)
        feats = stamp_bag_feats(h5)
    if len(coords_um) != len(feats):
        raise StampRefusal(f"{len(feats)} feature rows but {len(coords_um)} coordinates")
    return {"feats": feats, "coords_um": coords_um, "tile_size_um": tile_um}


# ------------------------------------------------------------------------------------------ cohort
def grid_coords(n: int, step: int, width: int = 8) -> np.ndarray:
    """(n, 2) int64 top-left corners of the first n cells of a row-major grid of `step` px."""
    i = np.arange(n)
    return np.stack([i % width, i // width], axis=1).astype(np.int64) * step


def class_feats(rng: np.random.Generator, n: int, label: int, dim: int = 16) -> np.ndarray:
    """Features that carry the label (features 0-3 shifted by class), as a toy cohort needs."""
    feats = rng.normal(size=(n, dim)).astype(np.float32)
    feats[:, :4] += 1.5 if label else -1.5
    return feats


def write_cohort(out: Path, layout: str, *, n_slides: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """`n_slides` bags of one peer layout (half per class) and a labels CSV: (bag folder, labels.csv)."""
    rng = np.random.default_rng(seed)
    folders = {"stamp": out / "stamp" / "ctranspath-0123abcd", "clam": out / "clam" / "h5_files",
               "trident": out / "trident" / "20x_256px_0px_overlap" / "features_uni_v1"}  # fmt: skip
    folder = folders[layout]
    geometry = TridentGeometry()
    rows = []
    for k in range(n_slides):
        slide, label = f"slide-{k:02d}", k % 2
        feats = class_feats(rng, int(rng.integers(5, 20)), label)
        if layout == "stamp":
            step_px0 = 512  # 256 um tiles on a 0.5 um/px slide
            write_stamp_bag(folder / f"{slide}.h5", feats, grid_coords(len(feats), step_px0) * 0.5)
        elif layout == "clam":
            write_clam_bag(folder / f"{slide}.h5", feats, grid_coords(len(feats), 256))
        else:
            write_trident_bag(
                folder / f"{slide}.h5", feats, grid_coords(len(feats), geometry.patch_size_level0)
            )
        rows.append((slide, ("LUAD", "LUSC")[label]))
    labels = out / f"labels_{layout}.csv"
    with labels.open("w", newline="") as fh:
        csv.writer(fh).writerows([("slide", "label"), *rows])
    return folder, labels


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "peer-bags")
    for name in ("stamp", "clam", "trident"):
        bags, csv_path = write_cohort(target, name)
        print(f"{name}: {bags} ({csv_path})")
