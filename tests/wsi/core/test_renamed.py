"""Old names of renamed functions still work for code written against an earlier release: each gives
the new function's answer and a DeprecationWarning that names the new function."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.peer_bags import write_stamp_bag
from wsi.core.renamed import renamed

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
