"""Hostile inputs of the fifth probe round that need no storage server, one test per class: secrets in
option values never echoed (click's usage errors, WsiError lines, log lines); a slide replaced by
another of the same size at the same path is tiled again, never skipped as done, at the cost of a stat
and a header read; a model folder whose training runs or stopped early is refused by predict; `hf:`
names checked before huggingface_hub sees them and cache links kept inside the cache; WSI_* variables
checked once at start naming the variable; pipes and devices refused where a file is read whole; a
preset without attention blamed on --attention, not on its file; a declared size that cannot fit
evicts nothing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.core.errors import ConfigError, InputFileError, StorageError, WeightsError
from wsi.core.output_lock import output_lock

REPO = Path(__file__).resolve().parents[3]
FIXTURE_RUN = REPO / "tests" / "fixtures" / "run-v1" / "single"
TILE_ARGS = ["--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0", "--threads", "1"]
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzz"


def _invoke(args: list[str], **env: str) -> Any:
    return CliRunner().invoke(cli, args, env=env or None)


# ------------------------------------------------------------------------------------- 1. secrets
@pytest.mark.parametrize(
    "args",
    [
        ["tile", "x.svs", "--out", "o", "--review", f"s3://AKIAXX:{SECRET}@bkt/r.geojson"],
        ["tile", "x.svs", "--out", "o", "--roi", f"https://h/r.geojson?X-Amz-Signature={SECRET}"],
        ["train", "--task", f"s3://AKIAXX:{SECRET}@bkt/t.yaml", "--features", "f", "--labels", "l.csv",
         "--out", "o"],
        ["info", f"s3://AKIAXX:{SECRET}@bkt/x.h5"],
        ["embed", "--tiles", "t", "--out", "o", "--stain-norm", "macenko", "--stain-reference",
         f"https://h/ref.png?sig={SECRET}"],
    ],
)  # fmt: skip
def test_a_secret_in_any_option_value_is_never_printed(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_slide: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(make_slide(name="r5-a", size_um=800.0, mpp=1.0, seed=3).path, "x.svs")
    for folder in ("f", "t"):
        Path(folder).mkdir()
    Path("l.csv").write_text("slide,label\n")
    result = _invoke(args)
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output and "K7MDENG" not in result.output
    assert "***" in result.output or "URL" in result.output


def test_log_lines_mask_secrets_and_name_urls_for_mirror_folders(tmp_path: Path, monkeypatch: Any) -> None:
    from wsi.storage.masking import MaskingFormatter, shown
    from wsi.storage.mirror import mirror_dir
    from wsi.storage.urls import Url

    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    url = Url("s3://bkt/run")
    local = mirror_dir(url)
    (local / ".wsi-sync").mkdir(parents=True)
    (local / ".wsi-sync" / "url").write_text(str(url))
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "%s in %s", (f"s3://K:{SECRET}@b/x", local), None
    )
    text = MaskingFormatter("%(message)s").format(record)
    assert SECRET not in text and "s3://***@b/x" in text and "s3://bkt/run" in text and str(local) not in text
    assert shown(f"{local}/tiles/a.h5: bad") == "s3://bkt/run/tiles/a.h5: bad"


def test_wsi_info_keeps_the_double_slash_of_a_url(tmp_path: Path) -> None:
    result = _invoke(["info", "s3://no-such-bucket-wsi-test/x.h5"], AWS_ENDPOINT_URL="http://127.0.0.1:9")
    assert "s3:/no-such" not in result.output and "s3://no-such-bucket-wsi-test" in result.output


# ------------------------------------------------------------------ 4. a replaced slide (local)
def _same_size_pair(make_slide: Any, tmp_path: Path) -> tuple[Path, Path]:
    a = make_slide(name="r5-a", size_um=800.0, mpp=1.0, seed=3).path.read_bytes()
    b = make_slide(name="r5-b", size_um=800.0, mpp=1.0, seed=9, style="b").path.read_bytes()
    n = max(len(a), len(b))
    pa, pb = tmp_path / "a.bin", tmp_path / "b.bin"
    pa.write_bytes(a + b"\0" * (n - len(a)))  # trailing bytes a TIFF reader never looks at
    pb.write_bytes(b + b"\0" * (n - len(b)))
    return pa, pb


def test_a_slide_replaced_by_one_of_the_same_size_is_tiled_again(make_slide: Any, tmp_path: Path) -> None:
    pa, pb = _same_size_pair(make_slide, tmp_path)
    slide = tmp_path / "slides" / "s1.svs"
    slide.parent.mkdir()
    shutil.copyfile(pa, slide)
    out = tmp_path / "run"
    assert _invoke(["-q", "tile", str(slide), "--out", str(out), *TILE_ARGS]).exit_code == 0
    with h5py.File(out / "tiles" / "s1.h5") as h5:
        first = (int(h5.attrs["slide_size"]), str(h5.attrs["slide_header_sha256"]), h5["coords"][()].tolist())
    assert first[0] == slide.stat().st_size
    again = _invoke(["tile", str(slide), "--out", str(out), *TILE_ARGS])
    assert "1 already done" in again.output  # unchanged: skipped
    shutil.copyfile(pb, slide)  # another slide, same size, same path
    replaced = _invoke(["tile", str(slide), "--out", str(out), *TILE_ARGS])
    assert replaced.exit_code == 0 and "0 already done" in replaced.output, replaced.output
    with h5py.File(out / "tiles" / "s1.h5") as h5:
        assert str(h5.attrs["slide_header_sha256"]) != first[1]
        assert h5["coords"][()].tolist() != first[2]  # cut from the new slide's tissue


def test_a_fingerprint_reads_the_header_only(tmp_path: Path) -> None:
    from wsi.storage.identity import HEADER_BYTES, fingerprint

    big = tmp_path / "big.svs"
    with open(big, "wb") as fh:
        fh.write(b"II*\0" + b"\1" * (HEADER_BYTES - 4))
        fh.truncate(2 << 30)  # 2 GB, sparse: a full read would take seconds
    start = time.perf_counter()
    first = fingerprint(big)
    assert time.perf_counter() - start < 1.0 and first.size == 2 << 30
    with open(big, "r+b") as fh:  # a byte past the header changes: the version (mtime) tells
        fh.seek(1 << 30)
        fh.write(b"x")
    os.utime(big, ns=(time.time_ns(), first_ns := int(first.version.split(":")[1]) + 10**9))
    assert first_ns and "replaced" in first.differs(fingerprint(big))


# ---------------------------------------------------------------- 5. a model still being trained
def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "model"
    shutil.copytree(FIXTURE_RUN, run)
    return run


def test_predict_refuses_a_model_whose_training_runs_or_stopped(tmp_path: Path) -> None:
    from wsi.pipelines.runs.finished import refuse_unfinished, unfinished

    run = _run_folder(tmp_path)
    assert unfinished(run) == ""  # weights and config.json only (an older version's run): as it is
    (tmp_path / "bags").mkdir()
    args = [
        "predict",
        "--model",
        str(run),
        "--features",
        str(tmp_path / "bags"),
        "--out",
        str(tmp_path / "p"),
    ]
    with output_lock(run, "wsi train --out model"):  # training holds its folder
        result = _invoke(args)
        assert result.exit_code == 2, result.output
        assert "still running" in result.output and "wsi train --out model" in result.output
        assert "--allow-unfinished" in result.output
        refuse_unfinished(run, allow=True)  # the option lets it through
    (run / "last.safetensors").write_bytes(b"")
    (run / "log.csv").write_text("epoch\n1\n")
    assert "stopped before the end" in unfinished(run)
    assert "stopped before the end" in unfinished(run / "best.safetensors")
    result = _invoke(args)
    assert result.exit_code == 2 and "stopped before the end" in result.output, result.output
    (run / "metrics.json").write_text("{}")
    assert unfinished(run) == ""


# ----------------------------------------------------------------------------------- 6. hf: names
@pytest.mark.parametrize(
    "ref", ["hf:../x", "hf:org/../../etc", "hf:org/repo/../../etc/passwd", "hf:org/repo@../../x", "hf:o/r e"]
)
def test_hub_names_are_checked_before_huggingface_hub(ref: str) -> None:
    from wsi.storage.hf import hub_weights

    with pytest.raises(WeightsError, match=r"not allowed in a Hub name|not a Hugging Face reference"):
        hub_weights(ref, repo=None, files=("model.bin",), what="encoder", option="--tissue-weights")


def test_a_cache_link_outside_the_cache_is_refused_without_its_content(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from wsi.storage.hf import hub_weights

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    secret = tmp_path / "private.txt"
    secret.write_text("TOP-SECRET-FIRST-LINE\n")
    folder = tmp_path / "hub" / "models--org--repo"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("c" * 40)
    link = folder / "snapshots" / ("c" * 40) / "model.bin"
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    with pytest.raises(WeightsError) as err:
        hub_weights("hf:org/repo/model.bin", repo=None, files=(), what="encoder")
    assert "links outside the cache" in str(err.value) and "TOP-SECRET" not in str(err.value)


# ------------------------------------------------------------------------------- 7. environment
@pytest.mark.parametrize(
    ("name", "value", "says"),
    [("WSI_CACHE_GB", "0", "greater than 0"), ("WSI_CACHE_DIR", "FILE", "not a folder (a file)"),
     ("WSI_BLOCK_MB", "abc", "valid number"), ("WSI_LOCK_LEASE_S", "1", "greater than or equal")],
)  # fmt: skip
def test_a_bad_environment_variable_is_one_usage_error_naming_it(
    name: str, value: str, says: str, tmp_path: Path, make_slide: Any
) -> None:
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("")
    slide = make_slide(name="r5-a", size_um=800.0, mpp=1.0, seed=3).path
    result = _invoke(["tile", str(slide), "--out", str(tmp_path / "run"), *TILE_ARGS], **{name: value})
    assert result.exit_code == 2, result.output
    assert f"{name}=" in result.output and says in result.output
    assert not (tmp_path / "run").exists()  # nothing started


# ---------------------------------------------------------------------------- 9. pipes, devices
def test_a_pipe_or_device_is_refused_where_a_file_is_read_whole(tmp_path: Path, make_slide: Any) -> None:
    from wsi.core.files import sha256_file
    from wsi.core.user_text import load_json_file, read_utf8

    fifo = tmp_path / "review.geojson"
    os.mkfifo(fifo)
    for read in (sha256_file, read_utf8, load_json_file):
        with pytest.raises((InputFileError, ConfigError), match="pipe"):
            read(fifo)
    with pytest.raises((InputFileError, ConfigError), match="device"):
        sha256_file("/dev/zero")
    slide = make_slide(name="r5-a", size_um=800.0, mpp=1.0, seed=3).path
    for given in (fifo, Path("/dev/zero")):
        start = time.perf_counter()
        result = _invoke(
            ["tile", str(slide), "--out", str(tmp_path / "o"), "--review", str(given), *TILE_ARGS]
        )
        assert result.exit_code == 2 and "not a regular file" in result.output, result.output
        assert time.perf_counter() - start < 30


def test_process_substitution_is_refused_not_read_twice(tmp_path: Path, make_slide: Any) -> None:
    slide = make_slide(name="r5-a", size_um=800.0, mpp=1.0, seed=3).path
    review = tmp_path / "r.geojson"
    review.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    script = (
        f"{Path(sys.executable).parent / 'wsi'} tile {slide} --out {tmp_path / 'o'} --review <(cat {review}) "
        + " ".join(TILE_ARGS)
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "process substitution" in done.stderr and "not valid JSON" not in done.stderr


# ------------------------------------------------------------------------------ 10. smaller points
def test_an_attention_a_preset_cannot_take_is_blamed_on_the_option() -> None:
    from wsi.models.presets import build_model

    with pytest.raises(ConfigError) as err:
        build_model("dsmil", attention="gdla", in_dim=8, num_classes=2)
    text = str(err.value)
    assert "--attention gdla" in text and "'dsmil'" in text and "dsmil.yaml" not in text


def test_a_declared_size_that_cannot_fit_evicts_nothing(tmp_path: Path) -> None:
    from wsi.storage.cache import check_fits
    from wsi.storage.settings import StorageSettings
    from wsi.storage.urls import Url

    settings = StorageSettings(cache_dir=tmp_path / "cache", cache_gb=1.0)
    kept = tmp_path / "cache" / "files" / ("a" * 24) / "data" / "x.svs"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"x" * 1000)
    with pytest.raises(StorageError, match=r"declares 1e\+06 GB.*nothing was evicted"):
        check_fits(Url("s3://b/huge.svs"), 10**15, settings)
    assert kept.is_file()
