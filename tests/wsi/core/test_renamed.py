"""Old names of renamed functions still work for code written against an earlier release: each gives
the new function's answer and a DeprecationWarning that names the new function."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.peer_bags import write_stamp_bag
from wsi.core.renamed import renamed, renamed_keywords

#: (module, old name, new name): the renames callers may have imported by the old name
RENAMES = [
    ("wsi.formats.bags", "load_bag", "read_bag"),
    ("wsi.formats.bags.read", "load_bag", "read_bag"),
    ("wsi.models", "available_encoders", "list_encoders"),
    ("wsi.models.encoders", "available_encoders", "list_encoders"),
    ("wsi.models", "available_presets", "list_models"),
    ("wsi.models.presets", "available_presets", "list_models"),
    ("wsi.models", "available_attention", "list_attention"),
    ("wsi.models.attention", "available_attention", "list_attention"),
    ("wsi.pipelines.inputs", "available_inputs", "list_inputs"),
]


def test_an_old_name_warns_and_hands_on_the_call() -> None:
    def new(a: int, *, b: int = 1) -> int:
        return a + b

    old = renamed(new, "somewhere.old")
    with pytest.warns(DeprecationWarning, match=r"somewhere\.old is deprecated: use .*new") as caught:
        assert old(2, b=3) == 5
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert old.__name__ == "old"


@pytest.mark.parametrize(("module", "old", "new"), [r for r in RENAMES if r[2] != "read_bag"])
def test_old_listers_give_the_new_lists(module: str, old: str, new: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: use \S*\.{new}$"):
        names = getattr(mod, old)()
    assert names == getattr(mod, new)() and names


@pytest.mark.parametrize("module", ["wsi.formats.bags", "wsi.formats.bags.read"])
def test_load_bag_reads_what_read_bag_reads(tmp_path: Path, module: str) -> None:
    feats = np.arange(12, dtype=np.float16).reshape(3, 4)
    coords = np.array([[0, 0], [256, 0], [0, 256]], dtype=np.float32)
    write_stamp_bag(tmp_path / "a.h5", feats, coords)
    old = importlib.import_module(module).load_bag
    new = r"wsi\.formats\.bags\.read\.read_bag$"
    with pytest.warns(DeprecationWarning, match=rf"load_bag is deprecated: use {new}"):
        bag = old(tmp_path / "a.h5", rows=[2, 0])
    np.testing.assert_array_equal(bag.feats, feats[[2, 0]])
    np.testing.assert_array_equal(bag.coords_um, coords[[2, 0]])


def test_new_names_do_not_warn() -> None:
    import warnings

    import wsi

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert "retccl" in wsi.list_encoders()
        assert "abmil" in wsi.list_models()
        assert "seqnorm" in wsi.list_attention()


def test_an_old_keyword_warns_and_is_handed_on_under_its_new_name() -> None:
    @renamed_keywords(size_um="side_um")
    def area(*, side_um: float) -> float:
        return side_um**2

    with pytest.warns(DeprecationWarning, match=r"area\(size_um=\.\.\.\) is deprecated: use side_um="):
        assert area(size_um=3.0) == 9.0  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="both size_um= and its new name side_um="):
        area(size_um=3.0, side_um=3.0)  # type: ignore[call-arg]


def test_read_region_um_takes_side_um_and_still_its_old_size_um(sample_slide: Any) -> None:
    from wsi.slides.region import plan_region
    from wsi.slides.slide import open_slide

    with open_slide(sample_slide.path) as slide:
        new = slide.read_region_um(512, 256, side_um=128.0, target_mpp=1.0)
        with pytest.warns(DeprecationWarning, match=r"read_region_um\(size_um=\.\.\.\) is deprecated"):
            old = slide.read_region_um(512, 256, size_um=128.0, target_mpp=1.0)
        with pytest.warns(DeprecationWarning, match=r"region_plan\(size_um=\.\.\.\) is deprecated"):
            assert slide.region_plan(512, 256, size_um=128.0, target_mpp=1.0) == slide.region_plan(
                512, 256, side_um=128.0, target_mpp=1.0
            )
    assert new.shape == (128, 128, 3)
    np.testing.assert_array_equal(old, new)
    kw = {"target_mpp": 1.0, "mpp": 0.5, "downsamples": (1.0, 4.0)}
    with pytest.warns(DeprecationWarning, match=r"plan_region\(size_um=\.\.\.\) is deprecated"):
        assert plan_region(0, 0, size_um=64.0, **kw) == plan_region(0, 0, side_um=64.0, **kw)
