"""Remote outputs with the guarantees of local ones, against a real S3 server (moto's server mode; see
tests/helpers/s3_server.py), one test per class: another remote slide under a taken id is refused (it is
not "gone"); two machines (two cache folders) writing one s3:// run: the second is refused naming the
holder and the URL, a killed holder's lock is taken over after its lease; a remote slide replaced by one
of the same size is tiled again and its old tiles never embedded; a model whose training holds its
remote folder is refused by predict; an object given as --out is refused and a key that is also a
prefix is named; leftover `.tmp-` uploads are removed by the next run."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from s3_server import S3Server, padded_pair
from s3_server import s3 as s3  # a fixture
from s3_server import s3_server as s3_server  # a fixture

from wsi.cli.main import cli

TILE = [
    "--backend",
    "tiffslide",
    "--tile-um",
    "128",
    "--tile-px",
    "32",
    "--min-blur-var",
    "0",
    "--threads",
    "1",
]
REPO = Path(__file__).resolve().parents[3]
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzz"


@pytest.fixture(scope="module")
def pair(make_slide: Any) -> tuple[bytes, bytes]:
    return padded_pair(make_slide, "g")


def _tile(*args: str, cache: Path | None = None) -> Any:
    env = {"WSI_CACHE_DIR": str(cache)} if cache is not None else None
    return CliRunner().invoke(cli, ["tile", *args, *TILE], env=env)


def _rows(text: bytes) -> dict[str, dict[str, str]]:
    return {r["slide"]: r for r in csv.DictReader(text.decode().splitlines())}


# --------------------------------------------------------------------- 2. slide identity for URLs
def test_another_remote_slide_under_a_taken_id_is_refused(s3: S3Server, pair: tuple[bytes, bytes]) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    s3.client().put_object(Bucket=bucket, Key="other/s1.svs", Body=pair[1])
    run = f"s3://{bucket}/run/"
    assert _tile(f"s3://{bucket}/slides/s1.svs", "--out", run).exit_code == 0
    before = s3.objects(bucket, "run/tiles/s1.h5")
    again = _tile(f"s3://{bucket}/other/s1.svs", "--out", run)
    assert again.exit_code == 1, again.output
    assert "already taken" in again.output and f"s3://{bucket}/slides/s1.svs" in again.output
    assert "gone" not in again.output and "/outputs/" not in again.output  # names the URL, not the mirror
    assert s3.objects(bucket, "run/tiles/s1.h5") == before  # nothing replaced


# ----------------------------------------------------------------- 4. a replaced slide (remote)
def test_a_remote_slide_replaced_at_the_same_size_is_redone_and_never_embedded_stale(
    s3: S3Server, pair: tuple[bytes, bytes]
) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    run = f"s3://{bucket}/run/"
    assert _tile(f"s3://{bucket}/slides/", "--out", run).exit_code == 0
    old = s3.objects(bucket, "run/tiles/s1.h5")["run/tiles/s1.h5"]
    assert "1 already done" in _tile(f"s3://{bucket}/slides/", "--out", run).output
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[1])  # same key, same size
    from wsi.pipelines.embed.config import EmbedOptions
    from wsi.pipelines.embed.plan import _as_they_are, read_tile_files
    from wsi.storage import local_folder

    tiles = local_folder(f"s3://{bucket}/run/tiles")
    slides, _ = read_tile_files(sorted(tiles.glob("*.h5")), EmbedOptions(random_init=True))
    _, changed = _as_they_are(slides)  # embed would cut the new slide at the old tissue: refused
    assert len(changed) == 1 and "changed since its tiles were made" in next(iter(changed.values()))
    redo = _tile(f"s3://{bucket}/slides/", "--out", run)
    assert redo.exit_code == 0 and "1 tiled" in redo.output, redo.output
    assert s3.objects(bucket, "run/tiles/s1.h5")["run/tiles/s1.h5"] != old


# ------------------------------------------------------------- 3. two machines, one remote output
HOLD = textwrap.dedent(
    """
    import sys, time
    from wsi.storage.folder_lock import output_lock
    from wsi.storage import remote_output
    mirror = remote_output(sys.argv[1])
    with output_lock(mirror.local, "wsi tile --out " + sys.argv[1]):
        print("held", flush=True)
        if sys.argv[2] == "die":
            import os; os._exit(9)
        time.sleep(float(sys.argv[2]))
    """
)


def _holder(url: str, how: str, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "WSI_CACHE_DIR": str(cache), "WSI_LOCK_LEASE_S": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, url, how], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_machine_is_refused_while_the_first_writes(
    s3: S3Server, pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    run = f"s3://{bucket}/run"
    holder = _holder(run, "20", tmp_path / "machine-1")
    try:
        refused = _tile(f"s3://{bucket}/slides/", "--out", run, cache=tmp_path / "machine-2")
        assert refused.exit_code == 2, refused.output
        assert f"{run} is in use by another wsi command" in refused.output
        assert f"wsi tile --out {run}" in refused.output and "lease" in refused.output
        assert str(tmp_path) not in refused.output  # the URL, not a cache folder
        assert not s3.objects(bucket, "run/tiles/")  # it wrote nothing
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holders_lock_is_taken_over_after_its_lease(
    s3: S3Server, pair: tuple[bytes, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    s3.client().put_object(Bucket=bucket, Key="run/tiles/.s1.h5.tmp-1-abcd", Body=b"partial")
    run = f"s3://{bucket}/run"
    holder = _holder(run, "die", tmp_path / "machine-1")
    holder.wait()
    assert ".wsi-lock" in "".join(s3.objects(bucket, "run/"))
    monkeypatch.setattr("socket.gethostname", lambda: "another-machine")  # its pid cannot be looked at
    start = time.monotonic()
    while True:
        done = _tile(f"s3://{bucket}/slides/", "--out", run, cache=tmp_path / "machine-2")
        if done.exit_code != 2 or time.monotonic() - start > 30:
            break
        assert "in use" in done.output
        time.sleep(1)
    assert done.exit_code == 0, done.output
    keys = set(s3.objects(bucket, "run/"))
    assert "run/tiles/s1.h5" in keys and ".wsi-lock" not in "".join(keys)
    assert not any(".tmp-" in k for k in keys)  # the killed upload's leftover is gone


def test_two_lock_takers_agree_on_one_winner(s3: S3Server) -> None:
    from wsi.core.errors import OutputLockedError
    from wsi.storage.remote_lock import RemoteLock
    from wsi.storage.urls import Url

    url = Url(f"s3://{s3.bucket()}/run")
    first, second = RemoteLock(url, "a", lease_s=30), RemoteLock(url, "b", lease_s=30)
    first.acquire()
    try:
        with pytest.raises(OutputLockedError, match="`a`"):
            second.acquire()
        time.sleep(8)  # renewed meanwhile (lease/4): still held
        with pytest.raises(OutputLockedError):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()
    assert RemoteLock(url, "c").read() is None


# ---------------------------------------------------------------- 5. a model still being trained
def test_predict_refuses_a_remote_model_whose_training_holds_it(s3: S3Server, tmp_path: Path) -> None:
    from wsi.storage.remote_lock import RemoteLock
    from wsi.storage.urls import Url

    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="model/config.json", Body=b"{}")
    lock = RemoteLock(Url(f"s3://{bucket}/model"), "wsi train --out s3://x/model", lease_s=60)
    lock.acquire()
    try:
        (tmp_path / "bags").mkdir()
        result = CliRunner().invoke(cli, [
            "predict", "--model", f"s3://{bucket}/model", "--features", str(tmp_path / "bags"), "--out",
            str(tmp_path / "p"),
        ])  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "still running" in result.output and "--allow-unfinished" in result.output
    finally:
        lock.release()


# --------------------------------------------------------------------- 8. keys that are objects
def test_an_object_as_out_is_refused_and_a_key_that_is_a_prefix_is_named(
    s3: S3Server, pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    s3.client().put_object(Bucket=bucket, Key="x.bin", Body=b"data")
    refused = _tile(f"s3://{bucket}/slides/", "--out", f"s3://{bucket}/x.bin")
    assert refused.exit_code == 2 and "is an object (a file), not a folder" in refused.output, refused.output
    s3.client().put_object(Bucket=bucket, Key="x.bin/features/a.h5", Body=b"bag")  # made by another tool
    result = CliRunner().invoke(cli, [
        "predict", "--model", str(REPO / "tests/fixtures/run-v1/single"), "--features", f"s3://{bucket}",
        "--out", str(tmp_path / "p"),
    ])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"s3://{bucket}/x.bin is both an object and a folder" in result.output


# ------------------------------------------------------------------- 1. secrets (remote sources)
def test_a_slide_list_url_with_credentials_prints_no_secret(s3: S3Server, tmp_path: Path) -> None:
    bucket = s3.bucket()
    result = _tile(f"s3://AKIAXX:{SECRET}@{bucket}/slides/", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and SECRET not in result.output and "K7MDENG" not in result.output
