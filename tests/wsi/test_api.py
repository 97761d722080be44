"""The front door: `import wsi` offers the stages and everyday entry points, imports nothing heavy, and
each function hands its inputs to the stage it names and returns that stage's typed result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wsi

HEAVY = ("torch", "openslide", "tiffslide", "dask", "distributed", "h5py", "timm", "matplotlib", "scipy")


def test_import_wsi_offers_the_stages_without_heavy_imports() -> None:
    code = (
        "import sys, wsi\n"
        "fns = [wsi.tile, wsi.embed, wsi.train, wsi.predict, wsi.open_slide, wsi.read_bag,\n"
        "       wsi.list_encoders, wsi.list_models, wsi.list_attention, wsi.list_slide_encoders,\n"
        "       wsi.list_tasks, wsi.zero_shot, wsi.retrieve, wsi.list_text_encoders]\n"
        "assert all(callable(f) for f in fns), fns\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_listing_functions_read_the_registries() -> None:
    assert "nsclc-subtype" in wsi.list_tasks()
    assert {"vit-wsi", "abmil", "transmil"} <= set(wsi.list_models())
    assert {"seqnorm", "softmax", "sima", "gdla"} <= set(wsi.list_attention())
    assert "retccl" in wsi.list_encoders()
    assert "titan" in wsi.list_slide_encoders()
    assert {"conch-v1", "plip", "titan", "prism"} <= set(wsi.list_text_encoders())


def test_tile_open_slide_and_read_bag_through_the_front_door(tmp_path: Path) -> None:
    from wsi.synthetic import write_sample_slide

    slide = write_sample_slide(tmp_path / "slides" / "a.tiff", seed=1)
    result = wsi.tile([tmp_path / "slides"], out_dir=tmp_path / "run", tile_um=128, tile_px=64,
                      min_blur_variance=0, progress=False)  # fmt: skip
    assert result.stage == "tile" and len(result) == 1 and result.problems == ()
    row = result[0]
    assert row.status == "ok" and row.n > 0 and row.findings is not None
    assert row.findings.counts.n_kept == row.n  # the typed counts are the row's
    assert (tmp_path / "run" / "tiles" / "a.h5").is_file()
    with wsi.open_slide(slide.path) as s:
        patch = s.read_region_um(0, 0, 128.0, 2.0)
    assert patch.shape == (64, 64, 3)

    again = wsi.tile(tmp_path / "slides", out_dir=tmp_path / "run", tile_um=128, tile_px=64,
                     min_blur_variance=0, progress=False)  # fmt: skip
    assert [r.status for r in again] == ["skipped"]  # the settings given as keywords are the same

    bags = wsi.embed(tmp_path / "run", out_dir=tmp_path / "run", encoder="timm:resnet18", random_init=True,
                     input_px=64, device="cpu", batch_size=8, readers=0, progress=False)  # fmt: skip
    assert bags.stage == "embed" and [r.status for r in bags] == ["ok"]
    bag = wsi.read_bag(tmp_path / "run" / "features" / bags[0].encoder_id / "a.h5")
    assert bag.feats.shape == (row.n, 512) and np.isfinite(bag.feats).all()


def test_a_folder_without_slides_is_named(tmp_path: Path) -> None:
    from wsi.core.errors import WsiError

    with pytest.raises(WsiError, match=f"no slide files found in {tmp_path}"):
        wsi.tile([tmp_path], out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written
