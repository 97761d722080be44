"""`wsi zero-shot` user mistakes: each is one line naming the file or option and the fix, exit 2, no
traceback, and refused before any weights are read (the tower is never built for them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.bags import BagProvenance, write_bag


def _bag(path: Path, encoder: str, dim: int) -> None:
    n = 6
    coords = np.stack([np.arange(n) % 3, np.arange(n) // 3], 1).astype(np.float32) * 100.0
    prov = BagProvenance(slide_id=path.stem, encoder=encoder, weights_sha256="random", tile_um=100.0,
                         tile_px=100, mpp=1.0, level0_width=300, level0_height=200,
                         tile_params={"tile_um": 100.0}, target_mpp=1.0)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    feats = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    write_bag(path, feats=feats, coords_um=coords, coords_px=coords.astype(np.int64), provenance=prov)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # no weights anywhere
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _bag(tmp_path / "conch" / "s1.h5", "conch-v1", 512)
    _bag(tmp_path / "conch" / "s2.h5", "conch-v1", 512)
    _bag(tmp_path / "uni" / "u1.h5", "uni", 1024)
    (tmp_path / "ok.yaml").write_text("classes:\n  a: [tumour]\n  b: [stroma]\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "labels.csv").write_text("slide,label\ns1,LUAD\ns2,b\n")
    return tmp_path


def _refused(folder: Path, *args: str) -> str:
    res = CliRunner().invoke(cli, ["zero-shot", *args, "--out", str(folder / "out")])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)  # no uncaught error
    assert "RANDOM weights" not in res.output  # refused before a tower was built
    return res.output


def test_user_mistakes_are_named_with_exit_2(folder: Path) -> None:
    conch = str(folder / "conch")
    out = _refused(folder, conch, "--prompts", str(folder / "ok.yaml"))  # no --weights, empty cache
    assert "text encoder 'conch-v1': weights not in the Hugging Face cache" in out
    assert "hf download MahmoodLab/CONCH pytorch_model.bin" in out and "--weights" in out
    out = _refused(folder, str(folder / "uni"), "--prompts", "nsclc", "--random-init")
    assert "u1.h5 holds uni features, but conch-v1's text tower scores conch-v1 features" in out
    assert "wsi embed --encoder conch-v1" in out
    out = _refused(folder, conch, "--prompts", str(folder / "empty.yaml"), "--random-init")
    assert "empty.yaml is empty: a prompt file names two or more classes, e.g. classes:" in out
    out = _refused(folder, conch, "--prompts", "nope", "--random-init")
    assert "prompts nope: no such file or packaged prompt set (packaged: nsclc)" in out
    out = _refused(folder, conch, "--prompts", str(folder / "ok.yaml"), "--model", "clip", "--random-init")
    assert "unknown text encoder 'clip'; choose one of conch-v1, plip, prism, titan" in out
    out = _refused(folder, conch, "--random-init")
    assert "give --prompts (classification) or --query / --query-tile (retrieval)" in out
    out = _refused(folder, conch, "--prompts", str(folder / "ok.yaml"), "--random-init",
                   "--labels", str(folder / "labels.csv"))  # fmt: skip
    assert "labels.csv: 1 label(s) outside the task's classes ['a', 'b']: row 2 (s1: 'LUAD')" in out
    out = _refused(folder, conch, "--query-tile", "s1", "5000", "0", "--random-init")
    assert "no tile of s1 contains (5000, 0) um; its tiles cover x 0-300 um, y 0-200 um" in out
    out = _refused(folder, conch, "--query", "necrosis", "--model", "titan", "--random-init")
    assert "titan scores slides, not tiles: retrieve tiles with conch-v1 or plip" in out


def test_help_has_examples_for_every_model() -> None:
    res = CliRunner().invoke(cli, ["zero-shot", "--help"])
    assert res.exit_code == 0
    for example in ("--prompts nsclc --weights", "--model plip", "--model titan", "--query ", "--query-tile"):
        assert example in res.output, example
