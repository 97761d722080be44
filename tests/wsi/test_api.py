"""The front door: `import wsi` offers the stages and everyday entry points, imports nothing heavy, and
each function hands its inputs to the stage it names and returns that stage's typed result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

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


#: the libraries a lister must not import: listing names needs none of them
MODEL_LIBRARIES = ("torch", "timm", "transformers", "open_clip", "einops")
LISTERS = ("list_encoders", "list_models", "list_attention", "list_slide_encoders", "list_text_encoders",
           "list_tasks")  # fmt: skip

# Run in a fresh interpreter: every registry after importing every module of its package (so a module
# that registers a name its package's table lacks is caught), with the module each member comes from (a
# table row that points at the wrong module is caught too).
REGISTRIES = """
import importlib, json, pkgutil
import wsi.models.presets
from wsi import configs
for family in ("attention", "encoders", "slide_encoders", "text_encoders"):
    package = importlib.import_module(f"wsi.models.{family}")
    for found in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{found.name}")
from wsi.models.attention import ATTENTION
from wsi.models.encoders import ENCODERS
from wsi.models.slide_encoders import SLIDE_ENCODERS
from wsi.models.text_encoders import TEXT_ENCODERS
homes = {family: {n: reg.get(n).__module__ for n in reg.names()}
         for family, reg in (("attention", ATTENTION), ("slide", SLIDE_ENCODERS), ("text", TEXT_ENCODERS))}
names = {
    "list_encoders": [*ENCODERS.names(), "timm:<name>", "<recipe>.yaml"],
    "list_models": wsi.models.presets.list_models(),
    "list_attention": ATTENTION.names(),
    "list_slide_encoders": SLIDE_ENCODERS.names(),
    "list_text_encoders": TEXT_ENCODERS.names(),
    "list_tasks": configs.available("tasks"),
}
print(json.dumps({"names": names, "homes": homes}))
"""


def _run_json(code: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return cast(dict[str, Any], json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def registries() -> dict[str, Any]:
    return _run_json(REGISTRIES)


@pytest.mark.parametrize("lister", LISTERS)
def test_each_lister_names_its_registry_without_torch(lister: str, registries: dict[str, Any]) -> None:
    """Each lister in a fresh interpreter: the registry's names, and none of the model libraries loaded."""
    got = _run_json(
        "import json, sys, wsi\n"
        f"names = wsi.{lister}()\n"
        f"loaded = [m for m in {MODEL_LIBRARIES!r} if m in sys.modules]\n"
        "print(json.dumps({'names': names, 'loaded': loaded}))\n"
    )
    assert got["loaded"] == [], f"wsi.{lister}() imported {got['loaded']}"
    assert got["names"] == registries["names"][lister] and got["names"]


def test_the_name_tables_point_at_the_modules_that_register_each_name(registries: dict[str, Any]) -> None:
    from wsi.models.attention.names import VARIANT_MODULES
    from wsi.models.slide_encoders.names import ENCODER_MODULES
    from wsi.models.text_encoders.names import TOWER_MODULES

    tables = {"attention": VARIANT_MODULES, "slide": ENCODER_MODULES, "text": TOWER_MODULES}
    assert registries["homes"] == tables


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
