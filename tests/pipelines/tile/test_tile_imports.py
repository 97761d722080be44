"""A `wsi tile` run imports what it uses (issue 35 item 1): a plain run (no segmentation model, one
process) brings in no torch, no dask, no zarr, nothing of scipy or skimage beyond the filters it runs.

Each case runs the real command in a fresh Python on a small generated slide and lists the modules
loaded at its end, as a user's process would have them (the test process has imported everything)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from wsi.synthetic import SampleSlide

#: modules a plain tile run must not import, and where each used to come from
HEAVY = {
    "torch": "pipelines.tile.segment -> wsi.models (segmentation models only)",
    "torchvision": "with torch",
    "timm": "with torch",
    "dask": "--workers > 1 or --scheduler only",
    "distributed": "--workers > 1 or --scheduler only",
    "zarr": "wsi.formats.tile_file (--save-tiles only)",
    "matplotlib": "wsi.formats.qupath outline (matplotlib.path) and --roi",
    "scipy.signal": "skimage.measure.approximate_polygon in the QC GeoJSON outline",
    "scipy.stats": "with scipy.signal",
    "scipy.optimize": "with scipy.signal",
    "scipy.spatial": "skimage.morphology (tissue mask, artifact filters, QC outline)",
    "skimage.morphology": "the tissue mask, artifact filters, QC (wsi.tiling.morphology does their part)",
    "sklearn": "never needed to tile",
    "pandas": "never needed to tile",
    "asyncio": "tqdm.auto",
    "fsspec": "wsi.storage.fs (a slide or --out given as a URL only)",
    "s3fs": "with fsspec, for s3:// URLs",
    "huggingface_hub": "wsi.storage.hf (weights from the Hugging Face cache only)",
}

_RUN = """
import json, sys
from wsi.cli.main import cli
try:
    cli(sys.argv[1:])
except SystemExit as stop:
    code = stop.code or 0
else:
    code = 0
print(json.dumps({"exit": code, "modules": sorted(sys.modules)}))
"""


def _tile(*args: str) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, "tile", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["exit"], set(result["modules"])


@pytest.fixture(scope="module")
def slide(make_slide: Callable[..., SampleSlide]) -> Path:
    return make_slide(name="imports", size_um=1024.0, mpp=0.5, seed=3).path


def test_a_plain_tile_run_imports_nothing_heavy(slide: Path, tmp_path: Path) -> None:
    code, modules = _tile(str(slide), "--out", str(tmp_path / "run"))
    assert code == 0
    assert (tmp_path / "run" / "tiles" / "imports.h5").is_file()
    assert (tmp_path / "run" / "qc" / "imports.geojson").is_file()  # the outline ran, without scipy.signal
    expected = {"wsi.pipelines.tile.stage", "wsi.tiling.artifacts", "wsi.formats.qupath.outline", "openslide"}
    assert expected <= modules
    loaded = {name: why for name, why in HEAVY.items() if name in modules}
    assert not loaded, f"a plain `wsi tile` imported {loaded}"


def test_saving_tile_pixels_brings_in_zarr(slide: Path, tmp_path: Path) -> None:
    """Imports follow use: --save-tiles writes a zarr store, so zarr is loaded then, and only then."""
    code, modules = _tile(str(slide), "--out", str(tmp_path / "run"), "--save-tiles")
    assert code == 0 and (tmp_path / "run" / "tiles" / "imports.zarr").is_dir()
    assert "zarr" in modules and "torch" not in modules and "distributed" not in modules
