"""`wsi embed-slides`: file layout STAMP reads, provenance, refusals naming both encoders, per-slide
failures, patient level, skip and overwrite."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from slide_bags import make_bag

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.models.slide_encoders import build_slide_encoder
from wsi.pipelines.embed_slides import embed_slides, read_embedding

CHIEF_TILE_SHA = "1646f23001214f74cf432ef0e80b808ee6605143802ae6ed53a87564ddc4924a"




def test_cli_writes_stamp_layout_with_provenance(tmp_path: Path) -> None:
    feats = {s: make_bag(tmp_path / "bags" / f"{s}.h5", seed=i) for i, s in enumerate(["s1", "s2"])}
    args = ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "feather", "--random-init",
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / "feather-slide"  # STAMP's `<encoder>-slide`
    assert sorted(p.name for p in folder.glob("*.h5")) == ["s1.h5", "s2.h5"]
    with h5py.File(folder / "s1.h5") as h5:
        assert h5["feats"].shape == (512,) and h5["feats"].dtype == np.float32
        attrs = dict(h5.attrs)
    # what STAMP's detect_feature_type / PatientFeatureDataset read
    assert attrs["feat_type"] == "slide" and attrs["encoder"] == "feather"
    assert attrs["tile_encoder"] == "conch-v1.5" and attrs["tile_encoder_weights_sha256"] == "a" * 64
    assert attrs["slide_encoder_weights_sha256"] == "random" and attrs["n_tiles"] == 40
    assert attrs["tile_size_um"] == 256.0 and attrs["target_mpp"] == 0.5
    model = build_slide_encoder("feather", random_init=True)
    want = model.encode(torch.from_numpy(feats["s1"]), None, 256.0).numpy()
    np.testing.assert_allclose(read_embedding(folder / "s1.h5").vector, want, rtol=1e-5, atol=1e-6)
    manifest = (folder / "manifest.csv").read_text()
    assert manifest.count(",ok,") == 2
    again = CliRunner().invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder",
                                     "feather", "--random-init", "--out", str(tmp_path / "out")])  # fmt: skip
    assert again.exit_code == 0 and "2 skipped" in again.output


def test_wrong_tile_encoder_is_refused_alone(tmp_path: Path) -> None:
    make_bag(tmp_path / "bags" / "good.h5")
    make_bag(tmp_path / "bags" / "uni.h5", encoder="uni", dim=1024)
    make_bag(tmp_path / "bags" / "small.h5", tile_um=112.0)
    result = CliRunner().invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder",
                                      "feather", "--random-init", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 1
    assert "uni.h5 holds uni features, but slide encoder 'feather' reads conch-v1.5 features" in result.output
    assert "--encoder conch-v1.5" in result.output  # the fix names the command
    assert (
        "small.h5 holds tiles of 112 um, but slide encoder 'feather' was trained on 256 um" in result.output
    )
    assert [p.name for p in (tmp_path / "feather-slide").glob("*.h5")] == ["good.h5"]


def test_chief_needs_chiefs_own_ctranspath_weights(tmp_path: Path) -> None:
    orig = "7c998680060c8743551a412583fac689db43cec07053b72dfec6dcd810113539"
    make_bag(tmp_path / "a" / "x.h5", encoder="ctranspath", sha=orig, mpp=1.0)
    embedded = embed_slides(tmp_path / "a", encoder="chief", random_init=True, out_dir=tmp_path)
    _, results = embedded.folder, list(embedded)
    assert results[0].status == "failed"
    assert "weights sha256 7c998680060c" in results[0].error and "1646f2300121" in results[0].error
    make_bag(tmp_path / "b" / "x.h5", encoder="ctranspath", sha=CHIEF_TILE_SHA, mpp=1.0)
    embedded = embed_slides(tmp_path / "b", encoder="chief", random_init=True, out_dir=tmp_path)
    _, results = embedded.folder, list(embedded)
    assert results[0].status == "ok"
    make_bag(tmp_path / "c" / "x.h5", encoder="ctranspath", sha=CHIEF_TILE_SHA, mpp=0.5, tile_um=128.0)
    embedded = embed_slides(tmp_path / "c", encoder="chief", random_init=True, out_dir=tmp_path,
                              overwrite=True)
    _, results = embedded.folder, list(embedded)  # fmt: skip
    assert results[0].status == "failed" and "128 um" in results[0].error


def test_stamp_bag_names_its_extractor(tmp_path: Path) -> None:
    path = tmp_path / "stamp" / "s.h5"
    path.parent.mkdir()
    with h5py.File(path, "w") as h5:  # STAMP >= 2 tile bags: feats, coords in um, tile_size_um, extractor
        h5["feats"] = np.random.default_rng(0).normal(size=(10, 768)).astype(np.float32)
        h5["coords"] = np.zeros((10, 2), np.float32) + np.arange(10)[:, None] * 256
        h5.attrs["tile_size_um"] = 256.0
        h5.attrs["extractor"] = "chief-ctranspath"
        h5.attrs["unit"] = "um"
    embedded = embed_slides(path, encoder="chief", random_init=True, out_dir=tmp_path / "o")
    _, ok = embedded.folder, list(embedded)
    assert ok[0].status == "ok", ok[0].error
    with pytest.raises(ConfigError, match="hold ctranspath features, but slide encoder 'feather' reads"):
        embed_slides(path, encoder="feather", random_init=True, out_dir=tmp_path / "o")


def test_a_folder_of_another_tile_encoders_bags_is_refused_in_one_line(tmp_path: Path) -> None:
    """Not the same failure once per slide and exit 1: the folder is the mistake (exit 2)."""
    for slide in ("a", "b", "c"):
        make_bag(tmp_path / "bags" / f"{slide}.h5", encoder="uni", dim=1024)
    result = CliRunner().invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder",
                                      "feather", "--random-init", "--out", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2, result.output
    want = f"{tmp_path / 'bags'}: its 3 bag(s) hold uni features, but slide encoder 'feather' reads conch"
    assert want in result.output and result.output.count("hold uni features") == 1
    assert "--encoder conch-v1.5" in result.output and not (tmp_path / "o" / "feather-slide").exists()


@pytest.mark.parametrize("name,fusion", [("chief", "early"), ("feather", "late")])
def test_patient_level(tmp_path: Path, name: str, fusion: str) -> None:
    enc, sha, mpp = ("ctranspath", CHIEF_TILE_SHA, 1.0) if name == "chief" else ("conch-v1.5", "a" * 64, 0.5)
    f1 = make_bag(tmp_path / "bags" / "p1-a.h5", encoder=enc, sha=sha, mpp=mpp, seed=1)
    f2 = make_bag(tmp_path / "bags" / "p1-b.h5", encoder=enc, sha=sha, mpp=mpp, seed=2, n=25)
    make_bag(tmp_path / "bags" / "p2-a.h5", encoder=enc, sha=sha, mpp=mpp, seed=3)
    table = tmp_path / "slides.csv"
    table.write_text("patient,slide\np1,p1-a\np1,p1-b.h5\np2,p2-a\np3,absent\n")
    result = CliRunner().invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", name,
                                      "--random-init", "--out", str(tmp_path / "o"), "--level", "patient",
                                      "--slide-table", str(table)])  # fmt: skip
    assert result.exit_code == 0, result.output
    emb = read_embedding(tmp_path / "o" / f"{name}-pat" / "p1.h5")
    assert emb.attrs["feat_type"] == "patient" and emb.attrs["patient_fusion"] == fusion
    assert emb.attrs["n_tiles"] == 65 and '"p1-a", "p1-b"' in emb.attrs["slides"]
    model = build_slide_encoder(name, random_init=True)
    a, b = torch.from_numpy(f1), torch.from_numpy(f2)
    if fusion == "early":  # STAMP encode_patients_: the patient's tiles as one bag
        want = model.encode(torch.cat([a, b]), None, 256.0)
    else:  # the mean of the slide embeddings
        want = (model.encode(a, None, 256.0) + model.encode(b, None, 256.0)) / 2
    np.testing.assert_allclose(emb.vector, want.numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(p.stem for p in (tmp_path / "o" / f"{name}-pat").glob("*.h5")) == ["p1", "p2"]


def test_user_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_bag(tmp_path / "bags" / "s.h5")
    runner = CliRunner()
    r = runner.invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "chief",
                            "--out", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 2 and "needs --weights FILE" in r.output and "Traceback" not in r.output
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # a Hub model: the cache, then how
    r = runner.invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "feather",
                            "--out", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 2 and "hf download MahmoodLab/abmil.base.conch_v15.pc108-24k" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "nope",
                            "--random-init", "--out", str(tmp_path)])  # fmt: skip
    # the choices are the registry's (a usage error listing them), not a list restated by the option
    assert r.exit_code == 2 and "'nope' is not one of" in r.output and "feather" in r.output
    r = runner.invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "feather",
                            "--random-init", "--out", str(tmp_path), "--level", "patient"])  # fmt: skip
    assert r.exit_code == 2 and "--slide-table" in r.output
    assert "wsi embed-slides --features" in runner.invoke(cli, ["embed-slides", "--help"]).output
