"""Remote storage when things go wrong: a process killed while uploading leaves nothing a re-run takes as
finished; a missing bucket and refused credentials give one clear message (per slide, or for the run
where nothing can run); a URL that holds a secret is refused without echoing it. Against a real
S3-compatible server (moto's server mode, IAM authentication on; tests/helpers/s3_server.py)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import h5py
import pytest
from click.testing import CliRunner
from s3_server import S3Server, forget_filesystems
from s3_server import s3 as s3  # a fixture
from s3_server import s3_server as s3_server  # a fixture

from wsi.cli.main import cli
from wsi.storage import Mirror, parse_url

TILE_ARGS = ["--backend", "tiffslide", "--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0",
             "--threads", "1"]  # fmt: skip
EMBED_ARGS = ["--encoder", "timm:test_resnet", "--random-init", "--input-px", "64", "--batch-size", "8",
              "--readers", "0", "--dtype", "float32", "--threads", "1"]  # fmt: skip
BAG = "features/timm-test_resnet"
REPO = Path(__file__).resolve().parents[3]

#: runs `wsi ARGS...` and kills itself (os._exit, as SIGKILL would) when the upload of an object whose
#: key ends with KILL_AT has reached the server under its temporary name, before it is moved into place
DYING = textwrap.dedent(
    """
    import os, sys
    import s3fs
    target = os.environ["KILL_AT"]
    move = s3fs.S3FileSystem.mv
    def mv(self, path1, path2, *args, **kwargs):
        if str(path2).endswith(target):
            os._exit(9)
        return move(self, path1, path2, *args, **kwargs)
    s3fs.S3FileSystem.mv = mv
    from wsi.cli.main import cli
    cli(sys.argv[1:])
    """
)


@pytest.fixture(scope="module")
def bucket(make_slide: Any, s3: S3Server) -> str:
    """A bucket with two small slides under slides/."""
    name = s3.bucket()
    for slide, kwargs in {"k-a": {"seed": 3}, "k-b": {"seed": 4, "style": "b"}}.items():
        path = make_slide(name=slide, size_um=800.0, mpp=1.0, **kwargs).path
        s3.client().upload_file(str(path), name, f"slides/{path.name}")
    return name


def _dying(args: list[str], kill_at: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILL_AT": kill_at, "WSI_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", DYING, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )


def _rows(text: bytes | str) -> dict[str, dict[str, str]]:
    data = text.decode() if isinstance(text, bytes) else text
    return {row["slide"]: row for row in csv.DictReader(data.splitlines())}


@pytest.mark.slow  # three runs in subprocesses (each imports torch): 20-40 s on two shared cores
def test_a_kill_during_an_upload_leaves_nothing_a_rerun_takes_as_finished(
    s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = f"s3://{bucket}/killed/"
    # 1. tiles and a bag of k-a are uploaded; the process dies while the bag of k-a is being put in place
    args = ["-q", "embed", f"s3://{bucket}/slides/", "--out", run, "--tile-um", "128", "--tile-px", "32"]
    died = _dying([*args, *EMBED_ARGS], f"{BAG}/k-a.h5", tmp_path / "machine-1")
    assert died.returncode == 9, died.stderr[-3000:]
    keys = set(s3.objects(bucket, "killed/"))
    assert "killed/tiles/k-a.h5" in keys and f"killed/{BAG}/k-a.h5" not in keys  # never visible as done
    assert any(
        k.startswith(f"killed/{BAG}/.k-a.h5.tmp-") for k in keys
    )  # the bytes, under a name no one reads

    # 2. re-tiled with other settings, dying while the new tile file of k-a is being put in place: the
    # old tile file (other settings) was removed first, so neither says k-a is done
    retile = ["tile", f"s3://{bucket}/slides/", "--out", run, *TILE_ARGS[:2], "--tile-um", "96", "--tile-px",
              "32", "--min-blur-var", "0", "--threads", "1"]  # fmt: skip
    died = _dying(["-q", *retile], "tiles/k-a.h5", tmp_path / "machine-1")
    assert died.returncode == 9, died.stderr[-3000:]
    keys = set(s3.objects(bucket, "killed/"))
    assert "killed/tiles/k-a.h5" not in keys
    # k-b, tiled beside it on another thread, may or may not have been put in place before the kill; if it
    # was, it holds the new settings and a re-run rightly skips it
    b_done = "killed/tiles/k-b.h5" in keys
    if b_done:
        (tmp_path / "k-b.h5").write_bytes(s3.objects(bucket, "killed/tiles/k-b.h5")["killed/tiles/k-b.h5"])
        with h5py.File(tmp_path / "k-b.h5") as h5:
            assert float(h5.attrs["tile_size_um"]) == 96.0

    # 3. another machine (a cache of its own) re-runs: both slides are tiled again and k-a is embedded
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "machine-2"))
    runner = CliRunner()
    again = runner.invoke(cli, retile)
    assert again.exit_code == 0, again.output
    rows = _rows(s3.objects(bucket, "killed/tiles/manifest.csv")["killed/tiles/manifest.csv"])
    assert rows["k-a"]["status"] == "ok"  # made again, not skipped
    assert rows["k-b"]["status"] == ("skipped" if b_done else "ok"), rows["k-b"]
    stored = s3.objects(bucket, "killed/tiles/k-a.h5")["killed/tiles/k-a.h5"]
    (tmp_path / "k-a.h5").write_bytes(stored)
    with h5py.File(tmp_path / "k-a.h5") as h5:
        assert float(h5.attrs["tile_size_um"]) == 96.0

    # 4. the machine that died runs again: its finished but never uploaded files are not trusted over the
    # bucket; what it makes goes up, and every tile file and bag is there, complete
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "machine-1"))
    embedded = runner.invoke(cli, ["embed", "--tiles", run, "--out", run, *EMBED_ARGS])
    assert embedded.exit_code == 0, embedded.output
    rows = _rows(s3.objects(bucket, f"killed/{BAG}/manifest.csv")[f"killed/{BAG}/manifest.csv"])
    assert rows["k-a"]["status"] == "ok" and rows["k-b"]["status"] == "ok"  # the tiles changed: both made
    keys = set(s3.objects(bucket, "killed/"))
    assert {f"killed/{BAG}/k-a.h5", f"killed/{BAG}/k-b.h5", "killed/tiles/k-a.h5"} <= keys


def test_a_missing_bucket_or_refused_credentials_is_one_message_for_the_run(
    s3: S3Server, bucket: str, make_slide: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    slide = make_slide(name="k-a", size_um=800.0, mpp=1.0, seed=3).path
    for args in (
        ["tile", "s3://no-such-bucket-wsi/slides/", "--out", str(tmp_path / "out")],
        ["tile", str(slide), "--out", "s3://no-such-bucket-wsi/run/"],
        ["embed", "--tiles", "s3://no-such-bucket-wsi/run/", "--out", str(tmp_path / "out"), "--random-init"],
    ):
        res = runner.invoke(cli, args)
        assert res.exit_code == 2, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and "the bucket 'no-such-bucket-wsi' does not exist" in errors[0], res.output

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    forget_filesystems()
    try:
        for args in (
            ["tile", f"s3://{bucket}/slides/", "--out", str(tmp_path / "out")],
            ["tile", str(slide), "--out", f"s3://{bucket}/run/"],
        ):
            res = runner.invoke(cli, args)
            assert res.exit_code == 2, res.output
            errors = [line for line in res.output.splitlines() if line.startswith("Error")]
            assert len(errors) == 1 and "access denied" in errors[0] and "AWS_ACCESS_KEY_ID" in errors[0]
            assert "wrong-secret-0123456789" not in res.output and s3.key_id not in res.output
    finally:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
        forget_filesystems()


def test_slides_that_cannot_be_reached_fail_one_by_one(
    s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = tmp_path / "slides.csv"
    listing.write_text(
        "path,slide_id\n"
        f"s3://{bucket}/slides/k-a.svs,good\n"
        "s3://no-such-bucket-wsi/slides/x.svs,nobucket\n"
        f"s3://{bucket}/slides/missing.svs,missing\n"
    )
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["tile", str(listing), "--out", str(out), *TILE_ARGS])
    assert res.exit_code == 1, res.output
    rows = _rows((out / "tiles" / "manifest.csv").read_text())
    assert rows["good"]["status"] == "ok"
    assert rows["nobucket"]["status"] == "failed"
    assert "the bucket 'no-such-bucket-wsi' does not exist" in rows["nobucket"]["error"]
    assert rows["missing"]["status"] == "failed"
    assert rows["missing"]["error"] == f"s3://{bucket}/slides/missing.svs: not found while opening the slide"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    forget_filesystems()
    try:
        res = CliRunner().invoke(cli, ["tile", str(listing), "--out", str(tmp_path / "denied"), *TILE_ARGS])
    finally:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
        forget_filesystems()
    assert res.exit_code == 1, res.output
    rows = _rows((tmp_path / "denied" / "tiles" / "manifest.csv").read_text())
    for slide in ("good", "missing"):
        assert rows[slide]["status"] == "failed" and "access denied" in rows[slide]["error"], rows[slide]
    manifest = (tmp_path / "denied" / "tiles" / "manifest.csv").read_text()
    assert "wrong-secret-0123456789" not in manifest + res.output and s3.key_id not in manifest + res.output


def test_a_url_with_credentials_is_refused_without_showing_them(tmp_path: Path) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    res = CliRunner().invoke(
        cli, ["tile", f"s3://AKIAEXAMPLE:{secret}@bucket/slides/", "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "holds credentials" in res.output and "AWS_PROFILE" in res.output
    assert secret not in res.output and "AKIAEXAMPLE" not in res.output
    signed = "https://host.example/slide.svs?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef"
    res = CliRunner().invoke(cli, ["tile", signed, "--out", str(tmp_path)])
    assert res.exit_code == 2 and "is signed" in res.output and "deadbeef" not in res.output


def test_a_resume_folder_is_pulled_only_as_the_whole_its_last_upload_left(
    s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = parse_url(f"s3://{bucket}/units/")
    mirror = Mirror(url)
    for name, text in {"resume/model.bin": "epoch 1", "resume/state.json": "1", "log.csv": "a"}.items():
        (mirror.local / name).parent.mkdir(parents=True, exist_ok=True)
        (mirror.local / name).write_text(text)
    mirror.push_all(units=("resume",))
    # a later save goes up file by file; the process dies after the first one
    (mirror.local / "resume" / "model.bin").write_text("epoch 2")
    (mirror.local / "resume" / "state.json").write_text("2")
    upload, uploaded = Mirror._upload, []

    def dying(self: Mirror, rel: str) -> None:
        if uploaded:
            raise KeyboardInterrupt  # killed
        uploaded.append(rel)
        upload(self, rel)

    monkeypatch.setattr(Mirror, "_upload", dying)
    with pytest.raises(KeyboardInterrupt):
        mirror.push_all(units=("resume",))
    monkeypatch.setattr(Mirror, "_upload", upload)
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "elsewhere"))
    other = Mirror(url)
    other.pull_folder(units=("resume",))
    assert (other.local / "log.csv").read_text() == "a"
    assert not (other.local / "resume").exists()  # a mix of two saves is not resumed from
    mirror.push_all(units=("resume",))  # the save completes
    other.pull_folder(units=("resume",))
    assert (other.local / "resume" / "model.bin").read_text() == "epoch 2"
    assert (other.local / "resume" / "state.json").read_text() == "2"
