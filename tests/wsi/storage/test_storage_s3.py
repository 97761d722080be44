"""Slides, tiles, bags and runs in a real S3-compatible server (moto's server mode, its own process, IAM
authentication on): tile, embed, train and predict from and to the bucket give the files a local run
gives; a dask cluster of separate processes tiles from the bucket without a shared file system; stored
outputs never hold a credential. Kills during uploads and refused credentials: test_storage_failures.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from cohorts import make_cohort, write_task
from s3_server import S3Server
from s3_server import s3 as s3  # a fixture
from s3_server import s3_server as s3_server  # a fixture
from safetensors.numpy import load_file

from wsi.cli.main import cli
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.tile.stage import tile_slides
from wsi.pipelines.train import train
from wsi.slides.sources import find_slides
from wsi.storage import local_folder, local_view
from wsi.tiling.params import TileParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENCODER = "timm:test_resnet"  # ~0.4 M parameters, random weights: the stages' plumbing, not the model
PARAMS = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
OPTIONS = EmbedOptions(
    encoder=ENCODER, random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32", threads=1
)
TILE_ARGS = ["--backend", "tiffslide", "--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0",
             "--threads", "1"]  # fmt: skip
EMBED_ARGS = ["--encoder", ENCODER, "--random-init", "--input-px", "64", "--batch-size", "8",
              "--readers", "0", "--dtype", "float32", "--threads", "1"]  # fmt: skip
BAGS = "features/timm-test_resnet"
#: attributes that name where the slide or tile file was (a path here, its URL there) or when a bag was made
WHERE = {"slide_path", "tile_file", "created", "slide_version"}  # a local mtime vs an ETag
#: the same for a tile file: where its slide was and the slide file's version
SLIDE_WHERE = {"slide_path", "slide_version"}


@pytest.fixture(scope="module")
def slides(make_slide: Any, s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two small slides (1 um/px) in a local folder and under s3://BUCKET/slides/: (folder, bucket)."""
    folder = tmp_path_factory.mktemp("slides")
    bucket = s3.bucket()
    specs = {
        "s3-a": {"size_um": 1000.0, "seed": 3},
        "s3-b": {"size_um": (800.0, 600.0), "seed": 4, "style": "b"},
    }
    for name, kwargs in specs.items():
        path = make_slide(name=name, mpp=1.0, **kwargs).path
        (folder / path.name).write_bytes(path.read_bytes())
        s3.client().upload_file(str(path), bucket, f"slides/{path.name}")
    return folder, bucket


@pytest.fixture(scope="module")
def local_run(slides: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local-run")
    tiled = tile_slides(find_slides([slides[0]]), out_dir=out, params=PARAMS, backend="tiffslide", threads=1)
    assert [r.status for r in tiled] == ["ok", "ok"], tiled
    bags = embed_tiles(tiles_dir=out, out_dir=out, options=OPTIONS, progress=False)
    assert [r.status for r in bags] == ["ok", "ok"], bags
    return out


def _h5(path_or_bytes: Path | bytes) -> dict[str, Any]:
    """Every dataset's values and every attribute of an HDF5 file (a local file or an object's bytes)."""
    import io

    source = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    out: dict[str, Any] = {}
    with h5py.File(source, "r") as h5:
        h5.visititems(
            lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
        for name, value in h5.attrs.items():
            out[f"@{name}"] = value
        for name, obj in h5.items():
            for key, value in obj.attrs.items():
                out[f"{name}@{key}"] = value
    return out


def _same_h5(remote: bytes, local: Path, *, differ: set[str]) -> None:
    """Equal datasets (exactly) and attributes, but for `differ`, which must name the URL, not a path."""
    got, want = _h5(remote), _h5(local)
    assert set(got) == set(want)
    for key, value in want.items():
        if key.lstrip("@") in differ:
            if key.lstrip("@") == "slide_version":  # the slide's version: an ETag, not a local mtime
                assert str(got[key]).startswith("etag:"), (key, got[key])
            elif key.lstrip("@") != "created":
                assert str(got[key]).startswith("s3://"), (key, got[key])
            continue
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            assert got[key] == value, key


def _csv_rows(text: str, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    import csv
    import io

    return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(io.StringIO(text))]


def test_tile_and_embed_from_and_to_the_bucket_equal_a_local_run(
    s3: S3Server, slides: tuple[Path, str], local_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bucket = slides
    runner = CliRunner()
    run = f"s3://{bucket}/run/"
    tiled = runner.invoke(cli, ["-q", "tile", f"s3://{bucket}/slides/", "--out", run, *TILE_ARGS])
    assert tiled.exit_code == 0, tiled.output
    embedded = runner.invoke(cli, ["-q", "embed", "--tiles", run, "--out", run, *EMBED_ARGS])
    assert embedded.exit_code == 0, embedded.output
    stored = s3.objects(bucket, "run/")
    assert {k for k in stored if not k.startswith("run/.")} == {
        "run/tiles/manifest.csv", "run/tiles/s3-a.h5", "run/tiles/s3-b.h5", "run/qc/s3-a.png",
        "run/qc/s3-b.png", "run/qc/s3-a.geojson", "run/qc/s3-b.geojson", f"run/{BAGS}/s3-a.h5",
        f"run/{BAGS}/s3-b.h5", f"run/{BAGS}/manifest.csv",
    }  # fmt: skip
    for slide in ("s3-a", "s3-b"):
        _same_h5(stored[f"run/tiles/{slide}.h5"], local_run / "tiles" / f"{slide}.h5", differ=SLIDE_WHERE)
        _same_h5(stored[f"run/{BAGS}/{slide}.h5"], local_run / BAGS / f"{slide}.h5", differ=WHERE)
        assert _h5(stored[f"run/tiles/{slide}.h5"])["@slide_path"] == f"s3://{bucket}/slides/{slide}.svs"
        assert _h5(stored[f"run/{BAGS}/{slide}.h5"])["@tile_file"] == f"s3://{bucket}/run/tiles/{slide}.h5"
        assert stored[f"run/qc/{slide}.png"] == (local_run / "qc" / f"{slide}.png").read_bytes()
        assert stored[f"run/qc/{slide}.geojson"] == (local_run / "qc" / f"{slide}.geojson").read_bytes()
    drop = ("path", "seconds")
    for manifest in ("tiles/manifest.csv", f"{BAGS}/manifest.csv"):
        remote_rows = _csv_rows(stored[f"run/{manifest}"].decode())
        assert _csv_rows(stored[f"run/{manifest}"].decode(), drop) == _csv_rows(
            (local_run / manifest).read_text(), drop
        )
        assert {r["path"] for r in remote_rows} == {f"s3://{bucket}/slides/s3-{x}.svs" for x in "ab"}

    # another machine (a cache of its own) resumes from the bucket alone: everything is done already
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "other-machine"))
    again = runner.invoke(cli, ["tile", f"s3://{bucket}/slides/", "--out", run, *TILE_ARGS])
    assert again.exit_code == 0 and "2 already done" in again.output, again.output
    again = runner.invoke(cli, ["embed", "--tiles", run, "--out", run, *EMBED_ARGS])
    assert again.exit_code == 0 and "2 skipped" in again.output, again.output
    assert s3.objects(bucket, f"run/{BAGS}/s3-a.h5") == {f"run/{BAGS}/s3-a.h5": stored[f"run/{BAGS}/s3-a.h5"]}
    _no_credentials(s3, bucket, tiled.output + embedded.output + again.output)

    # `wsi view s3://.../run/`: the folder pulled, its slides opened from their URLs by ranges
    from wsi.view.catalog import Catalog
    from wsi.view.dzi import open_deepzoom

    entry = Catalog(local_folder(run)).slides["s3-a"]
    assert entry.path == f"s3://{bucket}/slides/s3-a.svs"
    view = open_deepzoom(entry.path, "tiffslide")
    assert view.generator.level_dimensions[-1] == (1000, 1000)
    view.handle.close()


def _no_credentials(s3: S3Server, bucket: str, *logs: str) -> None:
    """No object of the bucket and no log holds the secret key, the key id or a user:password URL."""
    secrets = [s3.secret.encode(), s3.key_id.encode()]
    for key, data in s3.objects(bucket).items():
        for secret in secrets:
            assert secret not in data, f"{key} holds a credential"
    for log in logs:
        assert s3.secret not in log and s3.key_id not in log


@pytest.fixture(scope="module")
def cohort(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, str]:
    """A labelled cohort of synthetic bags, locally and in a bucket (bags/, labels.csv): (cohort, task,
    bucket)."""
    root = tmp_path_factory.mktemp("cohort")
    made = make_cohort(root, n_patients=12)
    task = write_task(root / "task.yaml", epochs=3, bootstrap=20)
    bucket = s3.bucket("train")
    s3.client().upload_file(str(made.labels), bucket, "labels.csv")
    for bag in sorted(made.bags.glob("*.h5")):
        s3.client().upload_file(str(bag), bucket, f"bags/{bag.name}")
    return made, task, bucket


@pytest.mark.slow  # two trainings and two predictions: 10-20 s on two shared cores
def test_train_and_predict_from_and_to_the_bucket_equal_a_local_run(
    s3: S3Server, cohort: tuple[Any, Path, str], tmp_path: Path
) -> None:
    made, task, bucket = cohort
    local = train(task=task, labels_csv=made.labels, features_dir=made.bags, out_dir=tmp_path / "run",
                  progress=False)  # fmt: skip
    runner = CliRunner()
    trained = runner.invoke(cli, [
        "-q", "train", "--task", str(task), "--features", f"s3://{bucket}/bags/", "--labels",
        f"s3://{bucket}/labels.csv", "--out", f"s3://{bucket}/run/", "--no-progress",
    ])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert f"run folder: s3://{bucket}/run" in trained.output
    stored = s3.objects(bucket, "run/")
    here = {p.relative_to(local.run_dir).as_posix() for p in local.run_dir.rglob("*") if p.is_file()}
    assert {k[len("run/") :] for k in stored if "/." not in k} == here
    for name in ("best.safetensors", "last.safetensors"):
        theirs, ours = load_file_bytes(stored[f"run/{name}"]), load_file(local.run_dir / name)
        assert theirs.keys() == ours.keys()
        for key in ours:
            np.testing.assert_array_equal(theirs[key], ours[key], err_msg=f"{name}: {key}")
    for name in ("test_predictions.csv", "splits.csv", "metrics.json"):
        assert stored[f"run/{name}"] == (local.run_dir / name).read_bytes(), name
    config = json.loads(stored["run/config.json"])
    assert config["source"] == f"s3://{bucket}/bags" and config["labels_csv"] == f"s3://{bucket}/labels.csv"
    assert stored["run/resume/.wsi-unit.json"]  # the resume state went up as a whole

    mine = predict(
        model_dir=local.run_dir,
        features_dir=made.bags,
        out_dir=tmp_path / "pred",
        progress=False,
        heatmaps=False,
    )
    done = runner.invoke(cli, [
        "-q", "predict", "--model", f"s3://{bucket}/run/", "--features", f"s3://{bucket}/bags/", "--out",
        f"s3://{bucket}/pred/", "--no-progress", "--no-heatmaps",
    ])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert f"s3://{bucket}/pred/predictions.csv" in done.output
    stored = s3.objects(bucket, "pred/")
    drop = ("path", "seconds")
    want = _csv_rows(mine.predictions_csv.read_text(), drop)
    assert _csv_rows(stored["pred/predictions.csv"].decode(), drop) == want
    assert _csv_rows(stored["pred/manifest.csv"].decode(), drop) == _csv_rows(
        (tmp_path / "pred" / "manifest.csv").read_text(), drop
    )
    _no_credentials(s3, bucket, trained.output, done.output)


def load_file_bytes(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return load(data)


@pytest.mark.slow  # two worker processes start (and import torch): 10-30 s on two shared cores
def test_a_dask_cluster_of_separate_processes_tiles_from_the_bucket(
    s3: S3Server, slides: tuple[Path, str], local_run: Path, tmp_path: Path
) -> None:
    """Two worker processes whose cache folder is not the client's: each pulls and uploads on its own."""
    from distributed import LocalCluster

    from wsi.pipelines.scheduling.jobs import close_local_cluster

    _, bucket = slides
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        env={"WSI_CACHE_DIR": str(tmp_path / "workers"), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        results = tile_slides(
            find_slides([f"s3://{bucket}/slides/"]), out_dir=f"s3://{bucket}/cluster/", params=PARAMS,
            backend="tiffslide", threads=1, scheduler=cluster.scheduler_address,
        )  # fmt: skip
    finally:
        # not `with LocalCluster(...)`: under load its close() raises TimeoutError when a worker process is
        # slow to exit, after every result is in (bdd0e01: the CV-on-dask test failed that way)
        close_local_cluster(cluster)
    assert [r.status for r in results] == ["ok", "ok"], results
    stored = s3.objects(bucket, "cluster/")
    for slide in ("s3-a", "s3-b"):
        _same_h5(
            stored[f"cluster/tiles/{slide}.h5"], local_run / "tiles" / f"{slide}.h5", differ=SLIDE_WHERE
        )
    workers = tmp_path / "workers" / "outputs"
    assert len(list(workers.rglob("tiles/*.h5"))) == 2  # written where the workers run, then uploaded
    client = local_view(f"s3://{bucket}/cluster/")  # the client's own mirror never held them
    assert not list(client.rglob("*.h5")) and (client / "tiles" / "manifest.csv").is_file()


def test_openslide_and_dicom_series_read_local_copies_within_the_cache_limit(
    s3: S3Server, slides: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    import logging

    from wsi.slides.slide import open_slide
    from wsi.synthetic.dicom import write_dicom_series

    folder, bucket = slides
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.svs")}
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WSI_CACHE_GB", str(max(sizes.values()) * 1.2 / 1e9))  # room for one copy
    caplog.set_level(logging.INFO, logger="wsi.storage")
    for name in ("s3-a.svs", "s3-b.svs", "s3-b.svs"):
        with open_slide(f"s3://{bucket}/slides/{name}") as slide, open_slide(folder / name) as here:
            np.testing.assert_array_equal(
                slide.read_level(1, 0, 0, 300, 200), here.read_level(1, 0, 0, 300, 200)
            )
            assert slide.path == f"s3://{bucket}/slides/{name}"
    copies = [r.getMessage() for r in caplog.records if "copying it" in r.getMessage()]
    assert len(copies) == 2 and "openslide reads local files only" in copies[0]  # b's copy was reused
    held = [p for p in (tmp_path / "cache" / "files").rglob("*.svs")]
    assert [p.name for p in held] == ["s3-b.svs"]  # a's copy went to make room

    rng = np.random.default_rng(0)
    levels = [rng.integers(0, 255, (512, 768, 3), dtype=np.uint8)]
    levels.append(levels[0][::2, ::2].copy())
    series = write_dicom_series(tmp_path / "case-1", levels, mpp=0.5)
    for path in series:
        s3.client().upload_file(str(path), bucket, f"dicom/case-1/{path.name}")
    [source] = find_slides([f"s3://{bucket}/dicom/"])
    assert source.slide_id == "case-1" and str(source.path).startswith(f"s3://{bucket}/dicom/case-1/")
    caplog.clear()
    with open_slide(source.path) as slide, open_slide(tmp_path / "case-1" / Path(source.path).name) as here:
        assert slide.dimensions == here.dimensions == (768, 512)
        np.testing.assert_array_equal(slide.read_level(0, 0, 0, 256, 256), here.read_level(0, 0, 0, 256, 256))
    assert any("2 files" in r.getMessage() and "DICOM series" in r.getMessage() for r in caplog.records)


def test_a_copy_openslide_holds_open_is_not_evicted(
    s3: S3Server, slides: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """openslide re-opens its file between reads: a copy an open slide reads stays until it is closed."""
    from wsi.slides.slide import open_slide

    folder, bucket = slides
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.svs")}
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WSI_CACHE_GB", str(max(sizes.values()) * 1.2 / 1e9))  # room for one copy
    a_url = f"s3://{bucket}/slides/s3-a.svs"
    with open_slide(a_url, direct_jpeg=False) as a, open_slide(folder / "s3-a.svs") as here:
        with open_slide(f"s3://{bucket}/slides/s3-b.svs", direct_jpeg=False):
            pass  # b's copy needs a's room, but a is open
        held = sorted(p.name for p in (tmp_path / "cache" / "files").rglob("*.svs"))
        assert held == ["s3-a.svs", "s3-b.svs"]
        np.testing.assert_array_equal(a.read_level(0, 0, 0, 300, 200), here.read_level(0, 0, 0, 300, 200))
    # a new folder (s3fs caches listings)
    s3.client().upload_file(str(folder / "s3-a.svs"), bucket, "later/s3-c.svs")
    with open_slide(f"s3://{bucket}/later/s3-c.svs", direct_jpeg=False):  # a and b closed: both may go
        pass
    assert [p.name for p in (tmp_path / "cache" / "files").rglob("*.svs")] == ["s3-c.svs"]


def test_a_copy_is_held_before_its_entry_lock_is_let_go(
    s3: S3Server, slides: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No moment between the check that a copy is valid and the reader's hold: an eviction by another
    process (which needs the entry lock and no hold) in that moment would remove the copy being opened."""
    import fcntl

    from wsi.storage import cache
    from wsi.storage.urls import parse_url

    _, bucket = slides
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    url = parse_url(f"s3://{bucket}/slides/s3-a.svs", what="slide")
    seen: list[bool] = []
    take = cache.hold_entry

    def hold_and_look(where: Path) -> Any:
        with open(where / ".lock", "a+") as other:  # another process's eviction would try this first
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append(False)
                fcntl.flock(other, fcntl.LOCK_UN)
            except BlockingIOError:
                seen.append(True)
        return take(where)

    monkeypatch.setattr(cache, "hold_entry", hold_and_look)
    for _ in range(2):  # copied now, then found in the cache
        paths, hold = cache.held_local_copies(url.parent, [url.name], why="a test")
        with hold, cache.entry_unheld(cache.entry_dir(url, cache.storage_settings())) as free:
            assert paths[0].is_file() and not free  # held: eviction passes over it
    assert seen == [True, True]  # the entry lock was still held when the hold was taken
    with cache.entry_unheld(cache.entry_dir(url, cache.storage_settings())) as free:
        assert free  # closed: evictable again
