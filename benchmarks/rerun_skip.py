"""What the slide fingerprint costs a re-run on unchanged slides: `wsi tile` and `wsi embed` into a
finished run folder, with the fingerprint check (a stat and a 64 KiB header read per slide, before the
skip) against the same re-runs with the check switched off, alternating, side by side in one process.

The slides are generated (N of them, 1.6 x 1.6 mm at 0.5 um/px); the first tile and embed runs make the
outputs, then each round times one re-run of each stage both ways (every slide skipped). The embed
re-run includes building the encoder (a tiny random-initialised timm model), as a user's re-run does.

    python benchmarks/rerun_skip.py --slides 24 --rounds 5 2>/dev/null
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.stage import embed_tiles
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import find_slides
from wsi.synthetic import write_sample_slide
from wsi.tiling.params import TileParams

PARAMS = TileParams(tile_um=128.0, tile_px=64, min_blur_variance=0.0)
EMBED = EmbedOptions(
    encoder="timm:test_resnet", random_init=True, input_px=64, batch_size=32, readers=0, dtype="float32"
)


@contextlib.contextmanager
def fingerprints_off() -> Iterator[None]:
    """The stages as they were before the fingerprint: no look at the slide file before a skip."""

    def as_they_are(slides):  # type: ignore[no-untyped-def]
        return list(slides), {}

    with (
        mock.patch("wsi.pipelines.tile.stage.current_fingerprint", lambda path: None),
        mock.patch("wsi.pipelines.embed.plan._as_they_are", as_they_are),
    ):
        yield


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slides", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.slides):
            write_sample_slide(root / "slides" / f"s{i:03d}.svs", size_um=1600.0, mpp=0.5, seed=i)
        sources = find_slides([root / "slides"])
        out = root / "run"

        def tile() -> None:
            rows = tile_slides(sources, out_dir=out, params=PARAMS, threads=1, progress=False)
            assert all(r.status in ("skipped", "ok") for r in rows)

        def embed() -> None:
            embed_tiles(tiles_dir=out, out_dir=out, options=EMBED, progress=False)

        tile()
        embed()
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for stage, fn in (("tile", tile), ("embed", embed)):
                times.setdefault((stage, "with fingerprint"), []).append(timed(fn))
                with fingerprints_off():
                    times.setdefault((stage, "without"), []).append(timed(fn))
    print(f"re-run on {args.slides} unchanged slides, {args.rounds} rounds, median s ({cpu_model()})")
    print(f"{'stage':<8}{'with fingerprint':>18}{'without':>10}{'ratio':>8}")
    for stage in ("tile", "embed"):
        a = statistics.median(times[(stage, "with fingerprint")])
        b = statistics.median(times[(stage, "without")])
        print(f"{stage:<8}{a:>18.3f}{b:>10.3f}{a / b:>8.2f}")


if __name__ == "__main__":
    main()
