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
]


def test_an_old_name_warns_and_hands_on_the_call() -> None:
    def new(a: int, *, b: int = 1) -> int:
        return a + b

    old = renamed(new, "somewhere.old")
    with pytest.warns(DeprecationWarning, match=r"somewhere\.old is deprecated: use .*new") as caught:
        assert old(2, b=3) == 5
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert old.__name__ == "old"


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
