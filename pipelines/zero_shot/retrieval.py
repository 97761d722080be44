"""Retrieval: the tiles of a cohort most like a text ("tumour-infiltrating lymphocytes") or a tile.

From bags alone: every tile's stored feature is mapped into the tower's joint space and compared with
the query's embedding (a text through the text tower, as one prompt without templates; a tile through
the same image map), keeping the best `top` over all slides. top_tiles.csv lists slide, position
(micrometres and level-0 pixels), similarity and the bag; the slides are opened only to cut the
pictures (top_tiles/<rank>_<slide>.png and contact_sheet.png), and a slide that cannot be opened costs
its pictures only (the CSV says why).
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsi.core.config import with_settings
from wsi.core.errors import ConfigError
from wsi.core.files import sanitize_slide_id, write_bytes_atomic, write_csv_atomic
from wsi.pipelines.zero_shot.config import ZeroShotOptions
from wsi.pipelines.zero_shot.inputs import Source, check_sources, find_inputs
from wsi.pipelines.zero_shot.stage import build_tower

log = logging.getLogger("wsi.pipelines.zero_shot")
HEADER = [
    "rank",
    "slide",
    "similarity",
    "x_um",
    "y_um",
    "x_px",
    "y_px",
    "tile_size_um",
    "row",
    "bag",
    "picture",
]


@dataclass
class RetrievalResult:
    out_dir: Path
    query: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def csv(self) -> Path:
        return self.out_dir / "top_tiles.csv"


def retrieve(
    inputs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    out_dir: str | os.PathLike[str],
    query: str | None = None,
    query_tile: tuple[str, float, float] | None = None,
    top: int | None = None,
    pictures: bool = True,
    tower: Any = None,
    options: ZeroShotOptions | None = None,
    **settings: Any,
) -> RetrievalResult:
    """The `top` tiles most similar to `query` (text) or `query_tile` (slide id, x_um, y_um: the tile of
    that slide's bag at that position) across the bags in `inputs`; tile-level towers only."""
    from wsi.models.text_encoders import get_spec

    if (query is None) == (query_tile is None):
        raise ConfigError("retrieval needs a text query or a query tile (one of them)")
    opts = with_settings(ZeroShotOptions, options, settings, source="retrieval options")
    top = opts.top if top is None else top
    if top < 1:
        raise ConfigError(f"top must be at least 1, got {top}")
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    sources = find_inputs(paths)
    name = tower.name if tower is not None else opts.model
    spec = tower.SPEC if tower is not None else get_spec(opts.model)
    if spec.level != "tile":
        raise ConfigError(f"{name} scores slides, not tiles: retrieve tiles with conch-v1 or plip")
    check_sources(sources, tower_name=name, spec=spec)  # a wrong bag, slide or position before the weights
    by_id = {s.slide_id: s for s in sources}
    query_feat, label = None, query or ""
    if query_tile is not None:
        query_feat, label = _query_tile(by_id, query_tile, opts.mpp)
    tower = tower if tower is not None else build_tower(opts)
    sha, width = tower.weights_sha256, tower.image_dim()
    check_sources(sources, tower_name=name, spec=spec, tower_sha=sha, image_dim=width)
    with torch.no_grad():
        q = tower.encode_text([query])[0] if query is not None else tower.image_to_joint(query_feat)[0]
    ranked = _most_similar(sources, tower, q, top, opts.mpp)
    result = RetrievalResult(Path(out_dir), label)
    crops = _rows(result, ranked, by_id, opts.mpp, pictures)
    write_csv_atomic(result.csv, HEADER, ([r[h] for h in HEADER] for r in result.rows))
    if crops:
        from wsi.pipelines.predict.top_tiles import contact_sheet

        sheet = contact_sheet({"most similar": (crops, 1.0)}, title=label[:60],
                              caption="the tiles most like it, with their cosine similarity")  # fmt: skip
        write_bytes_atomic(result.out_dir / "top_tiles" / "contact_sheet.png", sheet)
    log.info("retrieval %r: the %d best of %d slide(s) in %s", label, len(ranked), len(sources), result.csv)
    return result


def _query_tile(
    by_id: dict[str, Source], query_tile: tuple[str, float, float], mpp: float | None
) -> tuple[torch.Tensor, str]:
    """The stored feature (1, D) of the query tile and how the results name it."""
    from wsi.formats.bags import read_bag

    sid, x_um, y_um = query_tile
    if sid not in by_id:
        raise ConfigError(f"query tile: slide {sid!r} is not among the inputs ({', '.join(list(by_id)[:5])})")
    bag = read_bag(by_id[sid].path, mpp=mpp)
    i = _tile_at(bag, by_id[sid].path, x_um, y_um)
    x0, y0 = np.asarray(bag.coords_um)[i]  # _tile_at refused a bag without positions
    return torch.from_numpy(np.asarray(bag.feats[i : i + 1])), f"tile of {sid} at ({x0:.0f}, {y0:.0f}) um"


def _most_similar(
    sources: list[Source], tower: Any, q: torch.Tensor, top: int, mpp: float | None
) -> list[tuple[float, str, int]]:
    """The `top` (similarity, slide, row) over every bag's tiles, best first; tiles with non-finite
    features are left out (logged)."""
    from wsi.formats.bags import read_bag

    best: list[tuple[float, str, int]] = []  # a min-heap of the best `top` (similarity, slide, row)
    for src in sources:
        feats = torch.from_numpy(np.asarray(read_bag(src.path, mpp=mpp, require_um=False).feats))
        with torch.no_grad():
            sims = (tower.image_to_joint(feats) @ q.float()).numpy()
        bad = ~np.isfinite(sims)
        if bad.any():  # NaN / inf features: those tiles cannot be ranked, the others can
            log.warning("%s: %d tile(s) with non-finite features left out of the search", src.path, bad.sum())
            sims = np.where(bad, -np.inf, sims)
        for row in np.argsort(-sims, kind="stable")[: min(top, int((~bad).sum()))]:
            item = (float(sims[row]), src.slide_id, int(row))
            if len(best) < top:
                heapq.heappush(best, item)
            elif item[0] > best[0][0]:
                heapq.heapreplace(best, item)
    return sorted(best, key=lambda t: -t[0])


def _rows(
    result: RetrievalResult,
    ranked: list[tuple[float, str, int]],
    by_id: dict[str, Source],
    mpp: float | None,
    pictures: bool,
) -> list[tuple[np.ndarray, float]]:
    """A top_tiles.csv row per ranked tile into `result` (its picture cut when asked); the crops cut."""
    from wsi.formats.bags import read_bag

    crops: list[tuple[np.ndarray, float]] = []
    for rank, (sim, sid, row) in enumerate(ranked, start=1):
        bag = read_bag(by_id[sid].path, mpp=mpp, rows=[row], require_um=False)
        x_um, y_um = (
            (float(v) for v in bag.coords_um[0]) if bag.coords_um is not None else (float("nan"),) * 2
        )
        x_px, y_px = (int(v) for v in bag.coords_px[0]) if bag.coords_px is not None else (-1, -1)
        picture = ""
        if pictures:
            picture, crop = _picture(result.out_dir, rank, sid, by_id[sid], bag, x_px, y_px)
            if crop is not None:
                crops.append((crop, sim))
        result.rows.append(
            {
                "rank": rank,
                "slide": sid,
                "similarity": f"{sim:.6f}",
                "x_um": f"{x_um:.1f}",
                "y_um": f"{y_um:.1f}",
                "x_px": x_px,
                "y_px": y_px,
                "tile_size_um": bag.tile_um,
                "row": row,
                "bag": str(by_id[sid].path),
                "picture": picture,
            }
        )
    return crops


def _tile_at(bag: Any, path: Path, x_um: float, y_um: float) -> int:
    """The row of the bag's tile that contains the point (x, y) in micrometres (tiles are top-left +
    tile_um); ConfigError naming the tiles' extent when none does."""
    coords = bag.coords_um
    if coords is None or not bag.tile_um:
        raise ConfigError(f"{path} records no tile positions in micrometres: give --mpp, or query by text")
    size = float(bag.tile_um)
    inside = np.flatnonzero(
        (coords[:, 0] <= x_um)
        & (x_um < coords[:, 0] + size)
        & (coords[:, 1] <= y_um)
        & (y_um < coords[:, 1] + size)
    )
    if not len(inside):
        lo, hi = coords.min(0), coords.max(0) + size
        raise ConfigError(
            f"query tile: no tile of {path.stem} contains ({x_um:g}, {y_um:g}) um; its tiles cover x "
            f"{lo[0]:.0f}-{hi[0]:.0f} um, y {lo[1]:.0f}-{hi[1]:.0f} um (wsi view shows positions)"
        )
    return int(inside[0])


def _picture(out: Path, rank: int, sid: str, src: Source, bag: Any, x_px: int, y_px: int) -> tuple[str, Any]:
    """Cut the tile from its slide (recorded in the bag); ('', None) with a logged reason when it cannot."""
    import io

    from PIL import Image

    from wsi.slides.slide import open_slide

    slide_path = bag.meta.get("slide_path") if isinstance(bag.meta, dict) else None
    if not slide_path or not Path(str(slide_path)).is_file() or x_px < 0 or not bag.tile_um:
        log.warning("%s: no picture for rank %d (slide %s not found)", sid, rank, slide_path or "unrecorded")
        return "", None
    try:
        with open_slide(Path(str(slide_path)), mpp=bag.mpp) as slide:
            target = float(bag.meta.get("target_mpp") or bag.tile_um / 256)
            crop = slide.read_region_um(x_px, y_px, float(bag.tile_um), target)
    except Exception as exc:  # the CSV row stands without its picture
        log.warning("%s: no picture for rank %d (%s)", sid, rank, exc)
        return "", None
    name = f"top_tiles/{rank:03d}_{sanitize_slide_id(sid)}.png"
    buf = io.BytesIO()
    Image.fromarray(crop).save(buf, format="PNG")
    write_bytes_atomic(out / name, buf.getvalue())
    return name, crop
