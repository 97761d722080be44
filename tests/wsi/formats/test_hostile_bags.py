"""Generated hostile bags (tests/helpers/hostile.py) fail alone, with a message naming them, in bounded
memory.

Each example is a bag built from adversarial parts: links into other files, external or virtual storage,
soft-link loops, 10^12 declared rows, integer/complex/string/record features, NaN, wrong shapes, truncated
bytes. Every reader path is asked (train's preflight, load, stream, embed's re-run check, `wsi info`), and
`wsi predict` and `wsi train` through the CLI: the bad bag is named, the good ones are untouched, and no
value of another file ever comes back.
"""

from __future__ import annotations

import csv
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import make_bag, make_cohort, write_task
from hostile import SECRET, bounded_memory, hostile_bags, write_hostile_bag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wsi.cli.main import cli
from wsi.core.errors import BagFormatError
from wsi.formats.bags import (
    available_memory,
    check_finite,
    finite_chunks,
    is_complete_bag,
    open_bag_stream,
    read_bag,
    scan_bag,
)
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bags import BagInput
from wsi.pipelines.train import train
from wsi.pipelines.train.preflight import refuse_unusable

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FEW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _no_secret(value: Any) -> None:
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        assert not np.any(value == SECRET), "values of another file were read"


def _refused(exc: BaseException, path: Path) -> None:
    assert isinstance(exc, BagFormatError), f"{type(exc).__name__}: {exc}"
    assert path.name in str(exc), str(exc)


@given(spec=hostile_bags())
@FEW
def test_every_reader_refuses_a_hostile_bag_naming_it(spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        folder = Path(tmp)
        good = folder / "good.h5"
        make_bag(good, label=0, rng=np.random.default_rng(0), n=6)
        path = write_hostile_bag(spec, folder / "hostile.h5", folder / "elsewhere")
        bad = scan_bag(path)  # train's preflight scan
        assert bad is not None and path.name in bad.reason, spec
        reads = {  # name -> (read, the kinds it may let through: NaN is found where features are checked)
            "whole": (lambda: check_finite(read_bag(path)), ()),
            "stream": (lambda: _stream_all(path), ()),
            "one row": (lambda: read_bag(path, rows=[0]), ("nan_feats", "nan_coords")),
        }
        for name, (read, may_pass) in reads.items():
            try:
                _no_secret(read())
            except Exception as exc:
                _refused(exc, path)
            else:
                assert spec["kind"] in may_pass, (name, spec)
        assert not is_complete_bag(path, encoder="test-encoder", weights_sha256="0" * 64)  # embed redoes it
        items = [Item(id="good", path=good, label=0), Item(id="hostile", path=path, label=1)]
        with pytest.raises(BagFormatError) as info:
            refuse_unusable(BagInput(), items)
        assert "hostile.h5" in str(info.value) and "good.h5" not in str(info.value)
        res = CliRunner().invoke(cli, ["info", str(path)])  # refused by train and predict: not exit 0
        assert res.exit_code in (1, 2) and not isinstance(res.exception, Exception | MemoryError), res.output
        assert "hostile.h5" in res.output


def _stream_all(path: Path) -> None:
    stream = open_bag_stream(path)
    for chunk in finite_chunks(stream, 7):
        _no_secret(chunk)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_cohort(tmp_path_factory.mktemp("hostile-cohort"), n_patients=4)


@pytest.fixture(scope="module")
def trained(cohort: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hostile-run")
    task = write_task(root / "task.yaml", epochs=1)
    result = train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run",
                   progress=False)  # fmt: skip
    return cohort, result.run_dir


@pytest.mark.slow  # trains a tiny model, then a few `wsi predict` runs (~30 s on 2 idle cores)
@given(specs=st.lists(hostile_bags(), min_size=1, max_size=3))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_predict_fails_only_the_hostile_bags(trained: tuple[Any, Path], specs: list[dict[str, Any]]) -> None:
    cohort, run = trained
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        bags = Path(tmp) / "bags"
        bags.mkdir()
        for slide in cohort.slides[:2]:
            shutil.copy(cohort.bags / f"{slide}.h5", bags)
        helpers = Path(tmp) / "elsewhere"  # the files the links point into: not bags to predict
        hostile = [
            write_hostile_bag(spec, bags / f"hostile{i}.h5", helpers).stem for i, spec in enumerate(specs)
        ]
        out = Path(tmp) / "out"
        res = CliRunner().invoke(
            cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(out), "--no-progress"]
        )
        assert res.exit_code == 1, (specs, res.output)
        with (out / "manifest.csv").open() as fh:
            manifest = {r["slide"]: r for r in csv.DictReader(fh)}
        for slide in cohort.slides[:2]:
            assert manifest[slide]["status"] == "ok"
        for stem in hostile:
            assert manifest[stem]["status"] == "failed" and f"{stem}.h5" in manifest[stem]["error"], manifest
        with (out / "predictions.csv").open() as fh:
            assert sorted(r["slide"] for r in csv.DictReader(fh)) == sorted(cohort.slides[:2])


@given(spec=hostile_bags())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_train_names_the_hostile_bag_and_trains_nothing(cohort: Any, spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        bags = Path(tmp) / "bags"
        shutil.copytree(cohort.bags, bags)
        victim = cohort.slides[0]
        (bags / f"{victim}.h5").unlink()
        write_hostile_bag(spec, bags / f"{victim}.h5", Path(tmp) / "elsewhere")
        task = write_task(Path(tmp) / "task.yaml", epochs=1)
        res = CliRunner().invoke(cli, ["train", "--task", str(task), "--labels", str(cohort.labels),
                                       "--features", str(bags), "--out", str(Path(tmp) / "run")])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert f"{victim}.h5" in res.output and "Traceback" not in res.output
        others = [s for s in cohort.slides if s != victim]
        assert not any(f"{s}.h5:" in res.output for s in others), res.output
        assert not (Path(tmp) / "run" / "best.safetensors").exists()


def test_a_bag_larger_than_the_memory_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A real (stored, compressed) bag whose features would take more than half of the memory left:
    read_bag refuses it with the size, streaming reads it in bounded chunks."""
    path = tmp_path / "big.h5"
    make_bag(path, label=0, rng=np.random.default_rng(1), n=20)
    with bounded_memory(extra=64 << 20):
        room = available_memory()
        assert room is not None and room <= 64 << 20
        with pytest.raises(BagFormatError, match=r"big\.h5: reading 20 tiles") as info:
            import wsi.formats.bags.safe as safe

            old = safe.MEMORY_SHARE
            safe.MEMORY_SHARE = 1e-9  # as if the bag were far larger than the room
            try:
                read_bag(path)
            finally:
                safe.MEMORY_SHARE = old
        assert "--stream-above-tiles" in str(info.value)
