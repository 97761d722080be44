"""Top tiles: per slide, the K tiles that push each output (a class, a target, the risk) most and least.

Pathologists check a model by looking at these. Each tile is read back from the slide itself at the
resolution it was embedded at (`Slide.read_region_um` with the bag's tile size and target MPP: the
same function embedding used), so a crop shows exactly what the encoder saw. Written per slide:

  top_tiles/<slide>/<output>-most-<rank>.png   the K tiles with the largest contribution to <output>
  top_tiles/<slide>/<output>-least-<rank>.png  the K with the smallest (the strongest push against it)
  top_tiles/<slide>/contact_sheet.png          all of them on one sheet, one row per direction (two
                                               classes: "towards A" and "towards B", no tile twice)
  top_tiles/index.csv                          slide, output, side, rank, tile, x_um, y_um, x0_px,
                                               y0_px, contribution, file
  top_tiles/skipped.csv                        slide, reason: slides whose pixels could not be read

The slide is found from the raw slide being predicted, else from the bag's `slide_path` attribute; a
slide that is not reachable from here (bags moved to another machine, bags of other tools) is skipped
with that reason, and prediction goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from wsi.core.files import sanitize_slide_id, write_bytes_atomic, write_csv_atomic
from wsi.formats.bags import read_bag, read_bag_attrs

log = logging.getLogger(__name__)

INDEX_HEADER = [
    "slide", "output", "side", "rank", "tile", "x_um", "y_um", "x0_px", "y0_px", "contribution", "file",
]  # fmt: skip


@dataclass
class TopTiles:
    """What the export of all slides gathered: index rows and the slides skipped, with why."""

    rows: list[list[Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def write(self, out_dir: Path) -> None:
        """index.csv and skipped.csv; one warning line when slides were skipped."""
        write_csv_atomic(out_dir / "index.csv", INDEX_HEADER, self.rows)
        write_csv_atomic(out_dir / "skipped.csv", ["slide", "reason"], self.skipped)
        if self.skipped:
            slide, why = self.skipped[0]
            log.warning(
                "top tiles skipped for %d slide(s) (e.g. %s: %s); see %s",
                len(self.skipped), slide, why, out_dir / "skipped.csv",
            )  # fmt: skip


def pick(values: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Indices of the k largest ("most", largest first) and k smallest ("least", smallest first) values."""
    order = np.argsort(values, kind="stable")
    k = min(k, len(values))
    return {"most": order[::-1][:k], "least": order[:k]}


def _slide_source(
    bag_path: Path, slide: tuple[Path, float | None] | None
) -> tuple[Path | None, float | None, str]:
    """(slide path, level-0 mpp, why not) for the bag's slide: the raw slide predicted, else the
    one the bag records."""
    if slide is not None:
        return Path(slide[0]), slide[1], ""
    return recorded_slide(bag_path)


def recorded_slide(bag_path: Path) -> tuple[Path | None, float | None, str]:
    """(slide path, level-0 mpp, why not) of the slide a bag of ours records (`slide_path`, `mpp`)
    when that file is reachable from here; (None, None, why) otherwise (bags moved, other tools')."""
    attrs = read_bag_attrs(bag_path)
    recorded = attrs.get("slide_path")
    if not recorded:
        return (
            None,
            None,
            "the bag records no slide path (made by another tool?); predict from the raw slides",
        )
    if not Path(str(recorded)).is_file():
        return None, None, f"slide file {recorded} (recorded in the bag) is not reachable from here"
    mpp = attrs.get("mpp")
    return Path(str(recorded)), None if mpp is None else float(mpp), ""


def export_slide(
    *,
    slide_id: str,
    bag_path: Path,
    maps: Mapping[str, np.ndarray],
    k: int,
    out_dir: Path,
    slide: tuple[Path, float | None] | None = None,
    backend: str = "openslide",
    collected: TopTiles,
) -> None:
    """Crops and a contact sheet of the top and bottom k tiles of each map (values (N,) per bag row)."""
    from wsi.slides.slide import open_slide

    slide_path, mpp, why = _slide_source(bag_path, slide)
    if slide_path is None:
        collected.skipped.append((slide_id, why))
        return
    attrs = read_bag_attrs(bag_path)
    tile_um = float(attrs["tile_size_um"])
    target_mpp = float(attrs.get("target_mpp") or tile_um / float(attrs["tile_size_px"]))
    picks = {name: pick(np.asarray(values, dtype=np.float64), k) for name, values in maps.items()}
    rows = sorted({int(i) for p in picks.values() for idx in p.values() for i in idx})
    bag = read_bag(bag_path, mpp=mpp, rows=rows)
    if bag.coords_um is None:  # read_bag refuses a bag it cannot place unless told not to
        raise ValueError(f"{bag_path}: tile positions in micrometres unknown")
    where = {r: j for j, r in enumerate(rows)}
    folder = out_dir / sanitize_slide_id(slide_id)
    crops: dict[tuple[str, str], list[tuple[np.ndarray, float]]] = {}
    with open_slide(slide_path, backend=backend, mpp=mpp) as wsi_slide:
        for name, sides in picks.items():
            for side, idx in sides.items():
                for rank, i in enumerate(idx, start=1):
                    j = where[int(i)]
                    x_um, y_um = (float(v) for v in bag.coords_um[j])
                    if bag.coords_px is not None:
                        x0, y0 = (int(v) for v in bag.coords_px[j])
                    else:
                        x0, y0 = round(x_um / wsi_slide.mpp), round(y_um / wsi_slide.mpp)
                    crop = wsi_slide.read_region_um(x0, y0, tile_um, target_mpp)
                    value = float(maps[name][int(i)])
                    file = f"{sanitize_slide_id(name)}-{side}-{rank:02d}.png"
                    write_bytes_atomic(folder / file, _png(crop))
                    crops.setdefault((name, side), []).append((crop, value))
                    collected.rows.append(
                        [
                            slide_id,
                            name,
                            side,
                            rank,
                            int(i),
                            x_um,
                            y_um,
                            x0,
                            y0,
                            f"{value:.6g}",
                            f"{folder.name}/{file}",
                        ]
                    )
    write_bytes_atomic(folder / "contact_sheet.png", contact_sheet(sheet_rows(maps, crops), title=slide_id))


def _png(pixels: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def mirrored(maps: Mapping[str, np.ndarray]) -> dict[str, str]:
    """{name: earlier name} for each map that is another's exact negative: two classes' maps, where the
    tiles pushing most towards one are those pushing most towards the other, signs flipped."""
    out: dict[str, str] = {}
    names = list(maps)
    for j, b in enumerate(names):
        for a in names[:j]:
            if a not in out and np.shape(maps[a]) == np.shape(maps[b]) and np.allclose(maps[b], -maps[a]):
                out[b] = a
                break
    return out


def sheet_rows(
    maps: Mapping[str, np.ndarray], crops: Mapping[tuple[str, str], list[tuple[np.ndarray, float]]]
) -> dict[str, tuple[list[tuple[np.ndarray, float]], float]]:
    """The contact sheet's rows, {label: (tiles, sign)}, without repeats: for two classes (maps that are
    each other's negative) "towards A" and "towards B", each tile once, each row's values in its own
    direction; otherwise "towards X" and "against X" per output. `sign` +1 for a row of pushes towards,
    -1 against: a tile whose value has the other sign is marked as such under it."""
    pairs = mirrored(maps)
    rows: dict[str, tuple[list[tuple[np.ndarray, float]], float]] = {}
    for name in maps:
        if name in pairs:  # its "most" row is the partner's "least" row: shown once, as "towards <name>"
            rows[f"towards {name}"] = (crops.get((name, "most"), []), 1.0)
            continue
        rows[f"towards {name}"] = (crops.get((name, "most"), []), 1.0)
        if name not in pairs.values():
            rows[f"against {name}"] = (crops.get((name, "least"), []), -1.0)
    return {label: row for label, row in rows.items() if row[0]}


def contact_sheet(
    rows: Mapping[str, tuple[list[tuple[np.ndarray, float]], float]],
    *,
    title: str,
    caption: str = "the tiles that push each way most, with their contributions",
) -> bytes:
    """One row per `sheet_rows` row, the tiles in rank order, each titled with its value (and "(other
    way)" where it points against the row's direction, the row's sign: no tile pushed that way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wsi.pipelines.report.figures import png_bytes

    n_rows = max(1, len(rows))
    n_cols = max([len(tiles) for tiles, _ in rows.values()] or [1])
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.7 * n_cols + 1.2, 1.9 * n_rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for r, (label, (tiles, sign)) in enumerate(rows.items()):
        axes[r, 0].text(-0.15, 0.5, label.replace(" ", "\n", 1), transform=axes[r, 0].transAxes, ha="right",
                        va="center", fontsize=8)  # fmt: skip
        for c, (crop, value) in enumerate(tiles):
            axes[r, c].imshow(crop)
            other = value * sign < 0
            axes[r, c].set_title(f"{value:+.3g}" + (" (other way)" if other else ""), fontsize=7,
                                 color="0.45" if other else "black")  # fmt: skip
    fig.suptitle(f"{title}: {caption}", fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


__all__ = [
    "INDEX_HEADER", "TopTiles", "contact_sheet", "export_slide", "mirrored", "pick", "recorded_slide",
    "sheet_rows",
]  # fmt: skip
