"""Every reader of a user's file turns what its parser can raise into one error naming the file (issue 31).

Hypothesis builds hostile documents from adversarial parts (nesting 200,000 levels deep, files larger
than any config, numbers beyond a float, wrong types at the top and inside, binary junk, empty files)
and gives each to every reader of that format: `--roi` GeoJSON, task / preset / encoder YAML, labels
CSV, slide lists, run records and fitted values, stain references and tile values. Each must refuse it
(or read it, where it is valid) with its own WsiError naming the file, in bounded memory, never a
RecursionError, MemoryError or TypeError; and the commands say it in one line with exit 2.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hostile import bounded_memory
from hypothesis import given, settings
from hypothesis import strategies as st

from wsi.cli.main import cli
from wsi.configs import load_yaml
from wsi.core.errors import ConfigError, LabelError, RoiError, WsiError
from wsi.core.user_text import MAX_JSON_BYTES, MAX_TEXT_BYTES, MAX_YAML_BYTES
from wsi.formats.qupath import read_roi
from wsi.formats.tile_values import read_tile_values
from wsi.models.encoders.recipe import load_recipe_yaml
from wsi.models.encoders.stain import load_reference
from wsi.models.presets import build_model
from wsi.pipelines.runs.record import read_fitted, read_run_record
from wsi.pipelines.study.labels import read_labels
from wsi.pipelines.study.tasks import LabelColumns, load_task
from wsi.slides.sources import find_slides

FEW = settings(max_examples=40, deadline=None)
HUGE = "huge"  # a sparse file larger than the reader's cap: its size is refused before a byte is read


@st.composite
def json_documents(draw: st.DrawFn) -> bytes | str:
    """Hostile JSON text, or HUGE."""
    part = draw(st.sampled_from(["deep_list", "deep_object", "huge", "big_number", "nan", "wrong_top",
                                 "wrong_inside", "junk", "empty", "cut"]))  # fmt: skip
    if part == "deep_list":
        depth = draw(st.integers(1_000, 200_000))
        return ("[" * depth + "]" * depth).encode()
    if part == "deep_object":
        depth = draw(st.integers(1_000, 50_000))
        return ('{"a":' * depth + "1" + "}" * depth).encode()
    if part == "huge":
        return HUGE
    if part == "big_number":
        return json.dumps({"type": "FeatureCollection", "x": 1}).replace("1", "1e999").encode()
    if part == "nan":
        return b'{"type": "FeatureCollection", "features": [], "method": NaN, "coords_um": [Infinity]}'
    if part == "wrong_top":
        return json.dumps(draw(st.sampled_from([[], [1, 2], "text", 3.5, None, True]))).encode()
    if part == "wrong_inside":
        return json.dumps(
            {"type": "FeatureCollection", "features": {"a": 1}, "task": [1], "model": "x", "format": 5,
             "coords_um": "x", "outputs": [None], "method": {"x": 1}, "target_scaling": [1, 2]}
        ).encode()  # fmt: skip
    if part == "junk":
        return draw(st.binary(min_size=1, max_size=256))
    if part == "cut":
        return b'{"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {"type": "Pol'
    return b""


def _write(folder: Path, name: str, doc: bytes | str, cap: int) -> Path:
    path = folder / name
    if doc == HUGE:
        with open(path, "wb") as fh:
            fh.truncate(cap + 1)  # sparse: no disk, no time
    else:
        assert isinstance(doc, bytes)
        path.write_bytes(doc)
    return path


def _run_dir(folder: Path, name: str, doc: bytes | str) -> Path:
    run = folder / "run"
    run.mkdir(exist_ok=True)
    _write(run, name, doc, MAX_JSON_BYTES)
    return run


#: (file name, reader, the error it raises) for every JSON document reader
JSON_READERS: list[tuple[str, Callable[[Path, Path], Any], type[WsiError]]] = [
    ("roi.geojson", lambda tmp, p: read_roi(p), RoiError),
    ("stain.json", lambda tmp, p: load_reference(p), ConfigError),
    ("config.json", lambda tmp, p: read_run_record(p.parent), ConfigError),
    ("fitted.json", lambda tmp, p: read_fitted(p.parent), ConfigError),
    ("values.json", lambda tmp, p: read_tile_values(p), WsiError),
]


def _refused_by_name(exc: BaseException, error: type[WsiError], name: str) -> None:
    assert isinstance(exc, error), f"{type(exc).__name__}: {exc}"
    assert name in str(exc), str(exc)
    assert len(str(exc)) < 2000, "a message, not the document"


@given(doc=json_documents())
@FEW
def test_json_readers_name_the_file_whatever_it_holds(doc: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        for name, read, error in JSON_READERS:
            folder = Path(tmp) / name.replace(".", "_")
            folder.mkdir()
            path = _write(folder, name, doc, MAX_JSON_BYTES)
            try:
                read(folder, path)
            except Exception as exc:
                _refused_by_name(exc, error, name)
            else:
                pytest.fail(f"{name} read a hostile document: {doc!r:.200}")


@st.composite
def yaml_documents(draw: st.DrawFn) -> bytes | str:
    """Hostile YAML text for task, preset and encoder files, or HUGE."""
    part = draw(st.sampled_from(["deep_flow", "deep_block", "huge", "big_number", "wrong_top", "wrong_inside",
                                 "junk", "empty", "tabs"]))  # fmt: skip
    if part == "deep_flow":
        depth = draw(st.integers(65, 100_000))
        return ("x: " + "[" * depth + "]" * depth + "\n").encode()
    if part == "deep_block":
        depth = draw(st.integers(65, 400))
        return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)).encode() + b"  " * depth + b"v\n"
    if part == "huge":
        return HUGE
    if part == "big_number":  # YAML reads 1e999 as inf and 10**400 as an int: both out of every range
        inf = b"name: t\nclasses: [a, b]\nseed: 1e999\ndim: .inf\narch: x\ninput_px: 1e999\n"
        big = "9" * 400
        huge_int = f"name: t\nclasses: [a, b]\nseed: {big}\ndim: {big}\narch: x\ninput_px: 224\n".encode()
        return draw(st.sampled_from([inf, huge_int]))
    if part == "wrong_top":
        return draw(st.sampled_from([b"- a\n- b\n", b"just text\n", b"42\n", b"null\n"]))
    if part == "wrong_inside":
        return b"name: [1, 2]\nclasses: {a: 1}\nepochs: many\nmodel: 5\ndim: [1]\narch: {x: 1}\ninput_px: x\n"
    if part == "junk":
        return draw(st.binary(min_size=1, max_size=256))
    if part == "tabs":
        return b"name: t\n\tclasses: [a\n"
    return b""


YAML_READERS: list[tuple[str, Callable[[Path], Any]]] = [
    ("task.yaml", load_task),
    ("preset.yaml", lambda p: build_model(p)),
    ("encoder.yaml", load_recipe_yaml),
    ("config.yaml", lambda p: load_yaml("tasks", p)),
]


@given(doc=yaml_documents())
@FEW
def test_yaml_readers_name_the_file_whatever_it_holds(doc: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        for name, read in YAML_READERS:
            path = _write(Path(tmp), name, doc, MAX_YAML_BYTES)
            try:
                read(path)
            except Exception as exc:
                _refused_by_name(exc, ConfigError, name)
            else:
                # an empty or comment-only file, or a mapping the reader takes whole (`load_yaml`)
                assert name == "config.yaml" and doc not in (HUGE, b""), doc


@st.composite
def csv_documents(draw: st.DrawFn) -> bytes | str:
    """Hostile label tables and slide lists, or HUGE."""
    part = draw(st.sampled_from(["huge_cell", "huge", "junk", "json", "quote", "empty", "nul"]))
    if part == "huge_cell":  # over csv's field limit (128 KiB)
        return b"slide,label,path\nS1," + b"x" * draw(st.integers(131_073, 400_000)) + b",a.svs\n"
    if part == "huge":
        return HUGE
    if part == "junk":
        return b"slide,label,path\n" + draw(st.binary(min_size=1, max_size=256))
    if part == "json":
        return b'{"slide": "S1", "label": "a"}'
    if part == "quote":
        return b'slide,label,path\n"S1,a,a.svs\n' + b"x" * 200_000
    if part == "nul":
        return b"slide,label,path\nS1\x00,a,a.svs\n"
    return b""


@given(doc=csv_documents())
@settings(max_examples=25, deadline=None)
def test_table_readers_name_the_file_whatever_it_holds(doc: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        labels = _write(Path(tmp), "labels.csv", doc, MAX_TEXT_BYTES)
        try:
            read_labels(labels, classes=("a", "b"), columns=LabelColumns())
        except Exception as exc:
            _refused_by_name(exc, LabelError, "labels.csv")
        slides = _write(Path(tmp), "slides.csv", doc, MAX_TEXT_BYTES)
        try:
            find_slides([slides])
        except Exception as exc:  # a valid list names slides that do not exist: also a WsiError
            _refused_by_name(exc, WsiError, "slides.csv")


# ------------------------------------------------------------------------------- through the commands
def test_a_deep_roi_is_a_failed_slide_naming_the_file(sample_slide: Any, tmp_path: Path) -> None:
    roi = tmp_path / "deep.geojson"
    roi.write_text("[" * 200_000 + "]" * 200_000)
    with bounded_memory():
        args = ["tile", str(sample_slide.path), "--out", str(tmp_path / "out"), "--roi", str(roi)]
        res = CliRunner().invoke(cli, args)
    out = res.output
    assert res.exit_code == 1 and "deep.geojson" in out and "nested too deeply" in out, res.output
    assert "RecursionError" not in res.output


@pytest.mark.parametrize("what", ["task", "labels"])
def test_hostile_train_inputs_are_exit_2(what: str, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump({"name": "t", "classes": ["a", "b"], "input": "bags"}))
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\nS1,a\nS2,b\n")
    if what == "task":
        task.write_text("name: t\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    else:
        labels.write_text("slide,label\nS1," + "x" * 200_000 + "\n")
    (tmp_path / "bags").mkdir()
    args = ["train", "--task", str(task), "--labels", str(labels), "--features", str(tmp_path / "bags"),
            "--out", str(tmp_path / "out")]  # fmt: skip
    with bounded_memory():
        res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and f"{what}" in res.output and "Traceback" not in res.output, res.output


def test_a_deep_run_record_is_exit_2(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (tmp_path / "bags").mkdir()
    res = CliRunner().invoke(cli, ["predict", "--model", str(run), "--features", str(tmp_path / "bags"),
                                   "--out", str(tmp_path / "out")])  # fmt: skip
    assert res.exit_code == 2 and "config.json" in res.output and "nested too deeply" in res.output, (
        res.output
    )
