"""Generated hostile text inputs: label and slide-list CSVs, task and encoder YAML, stain references,
weights files. Each is built from adversarial parts (duplicate or case-twin columns, BOMs, Latin-1 bytes,
anchor/alias bombs, deep nesting, NaN and degenerate matrices) and must either be read correctly or
refused with a message naming the file, in bounded memory, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hostile import bounded_memory
from hypothesis import given, settings
from hypothesis import strategies as st

from wsi.cli.main import cli
from wsi.configs import load_yaml
from wsi.core.errors import ConfigError, LabelError, WeightsError, WsiError
from wsi.models.encoders.recipe import load_recipe_yaml
from wsi.models.encoders.stain import load_reference
from wsi.models.encoders.weights import load_state_dict_file
from wsi.pipelines.study.labels import read_labels
from wsi.pipelines.study.tasks import LabelColumns
from wsi.slides.sources import find_slides

FEW = settings(max_examples=30, deadline=None)
CLASSES = ("LUAD", "LUSC")


@st.composite
def label_tables(draw: st.DrawFn, seps: tuple[str, ...] = (",", ";", "\t")) -> tuple[bytes, str]:
    """(CSV bytes, what must happen: "ok" | "ambiguous" | "encoding") from adversarial parts."""
    sep = draw(st.sampled_from(seps))
    header = ["slide", "label"]
    twin = draw(st.sampled_from([None, "label", "Label", " label ", "SLIDE", "slide"]))
    if twin is not None:
        header.insert(draw(st.integers(0, 2)), twin)
    extra = draw(st.sampled_from([None, "note", ""]))
    if extra is not None:
        header.append(extra)
    n = draw(st.integers(1, 6))
    rows = [[f"S{i}" if h.strip().casefold() == "slide" else CLASSES[i % 2] if h.strip().casefold() == "label"
             else "x" for h in header] for i in range(n)]  # fmt: skip
    text = "\n".join(sep.join(r) for r in [header, *rows]) + "\n"
    data = text.encode()
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data  # a spreadsheet's BOM: read as UTF-8, not as part of "slide"
    latin = draw(st.booleans())
    if latin:  # a Latin-1 note cell: "café" saved by a legacy editor
        data = data.replace(b"\n", sep.encode() + "café".encode("latin-1") + b"\n", 1) if extra is None else \
            data.replace(b"x", "é".encode("latin-1"), 1)  # fmt: skip
    keys = [h.strip().casefold() for h in header if h.strip()]
    ambiguous = len(keys) != len(set(keys))
    return data, "encoding" if latin else "ambiguous" if ambiguous else "ok"


@given(table=label_tables())
@FEW
def test_label_tables_are_read_right_or_refused_by_name(table: tuple[bytes, str]) -> None:
    data, expect = table
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "labels.csv"
        path.write_bytes(data)
        try:
            rows = read_labels(path, classes=CLASSES, columns=LabelColumns())
        except LabelError as exc:
            assert expect != "ok", exc
            assert "labels.csv" in str(exc)
            assert ("byte" in str(exc)) if expect == "encoding" else ("ambiguous" in str(exc)), exc
        else:
            assert expect == "ok", (data, rows)
            assert [(r.slide, r.label) for r in rows] == [(f"S{i}", CLASSES[i % 2]) for i in range(len(rows))]


@given(table=label_tables(seps=(",",)))  # slide lists are comma-separated
@settings(max_examples=10, deadline=None)
def test_slide_lists_refuse_twin_columns_and_non_utf8(table: tuple[bytes, str]) -> None:
    data, expect = table
    data = data.replace(b"slide", b"path", 1).replace(b"SLIDE", b"PATH", 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "slides.csv"
        path.write_bytes(data)
        try:
            find_slides([path])
        except WsiError as exc:  # a good list names slides that do not exist: also a WsiError
            if expect != "ok":
                assert "slides.csv" in str(exc) and ("byte" in str(exc) or "ambiguous" in str(exc)), exc


@st.composite
def yaml_files(draw: st.DrawFn) -> tuple[bytes, str]:
    """(YAML bytes, "ok" | "alias" | "deep" | "encoding"): a valid task body with hostile parts mixed in."""
    body = "name: toy\nclasses: [LUAD, LUSC]\ninput: bags\n"
    part = draw(st.sampled_from(["none", "bomb", "merge", "deep", "latin", "bom"]))
    if part == "bomb":  # "billion laughs": level k holds `fan` aliases of level k-1
        levels, fan = draw(st.integers(2, 12)), draw(st.integers(2, 12))
        lines = ['l0: &l0 "lol"'] + [
            f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * fan)}]" for k in range(1, levels)
        ]
        return (body + "\n".join(lines) + "\n").encode(), "alias"
    if part == "merge":
        return (body + "base: &b {lr: 1}\nopt:\n  <<: *b\n").encode(), "alias"
    if part == "deep":
        depth = draw(st.integers(65, 200_000))  # quadratic in PyYAML's scanner, unless bounded
        return (body + "x: " + "[" * depth + "]" * depth + "\n").encode(), "deep"
    if part == "latin":
        return (body + "note: Müller\n").encode("latin-1"), "encoding"  # 0xfc: not UTF-8
    if part == "bom":
        return b"\xef\xbb\xbf" + body.encode(), "ok"
    return body.encode(), "ok"


@given(doc=yaml_files())
@FEW
def test_yaml_configs_bound_aliases_depth_and_encoding(doc: tuple[bytes, str]) -> None:
    data, expect = doc
    with tempfile.TemporaryDirectory() as tmp, bounded_memory():
        path = Path(tmp) / "task.yaml"
        path.write_bytes(data)
        for load in (lambda: load_yaml("tasks", path)[0], lambda: load_recipe_yaml(path)):
            try:
                loaded = load()
            except ConfigError as exc:
                text = str(exc)
                assert "task.yaml" in text, text
                want = {"alias": "aliases", "deep": "nested deeper", "encoding": "not UTF-8", "ok": ""}[
                    expect
                ]
                assert want in text, text
            else:
                assert expect == "ok" and loaded is not None
        res = CliRunner().invoke(cli, ["encoders", str(path)])  # the CLI: a message, exit 2, no traceback
        assert res.exit_code == 2 and "Error:" in res.output and "Traceback" not in res.output, res.output


def test_a_task_bomb_through_wsi_train_is_a_message(tmp_path: Path) -> None:
    bomb = "\n".join(
        ['a0: &a0 "x"', *(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 12))]
    )
    (tmp_path / "task.yaml").write_text("name: t\n" + bomb + "\n")
    (tmp_path / "labels.csv").write_text("slide,label\nA,x\n")
    with bounded_memory():
        res = CliRunner().invoke(cli, ["train", "--task", str(tmp_path / "task.yaml"), "--labels",
                                       str(tmp_path / "labels.csv"), "--features", str(tmp_path),
                                       "--out", str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 2 and "aliases" in res.output, res.output


finite = st.floats(0.05, 1.0)


@st.composite
def stain_references(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """(reference JSON, usable?): Macenko matrices and Reinhard statistics with NaN, zeros, negative
    optical densities, one stain twice, zero spreads mixed in."""
    if draw(st.booleans()):
        h = [draw(finite) for _ in range(3)]
        e = [draw(finite) for _ in range(3)]
        flaw = draw(st.sampled_from(["none", "nan", "zero", "negative", "twin", "conc"]))
        if flaw == "nan":
            h[draw(st.integers(0, 2))] = float("nan")
        elif flaw == "zero":
            h = [0.0, 0.0, 0.0]
        elif flaw == "negative":
            e[draw(st.integers(0, 2))] = -draw(finite)
        elif flaw == "twin":
            k = draw(st.floats(0.5, 2.0))
            e = [v * k for v in h]
        conc = [draw(finite), 0.0 if flaw == "conc" else draw(finite)]
        cos = sum(a * b for a, b in zip(h, e, strict=True)) / max(
            1e-12, (sum(a * a for a in h) * sum(b * b for b in e)) ** 0.5
        )
        usable = flaw == "none" and cos <= 0.9995
        return {"method": "macenko", "stain_matrix": [[a, b] for a, b in zip(h, e, strict=True)],
                "max_concentrations": conc}, usable  # fmt: skip
    mean = [draw(st.floats(0, 100)), draw(st.floats(-50, 50)), draw(st.floats(-50, 50))]
    std = [draw(st.floats(0.5, 30)) for _ in range(3)]
    flaw = draw(st.sampled_from(["none", "nan", "zero_std", "inf"]))
    if flaw == "nan":
        mean[1] = float("nan")
    elif flaw == "zero_std":
        std[draw(st.integers(0, 2))] = 0.0
    elif flaw == "inf":
        std[0] = float("inf")
    return {"method": "reinhard", "lab_mean": mean, "lab_std": std}, flaw == "none"


@given(ref=stain_references())
@FEW
def test_stain_references_must_be_finite_and_non_degenerate(ref: tuple[dict[str, Any], bool]) -> None:
    data, usable = ref
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ref.json"
        path.write_text(json.dumps(data))  # json writes NaN / Infinity, as numpy users' files hold them
        if usable:
            assert load_reference(path).method == data["method"]
        else:
            with pytest.raises(ConfigError, match=r"ref\.json.*(unusable|finite number)"):
                load_reference(path)


@given(text=st.text(min_size=1, max_size=300).filter(lambda t: t.strip() and "\0" not in t))
@settings(max_examples=20, deadline=None)
def test_a_text_file_given_as_weights_is_named(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("weights.pth", "model.bin", "w.safetensors"):
            path = Path(tmp) / name
            path.write_text(text, encoding="utf-8")
            with pytest.raises(WeightsError, match=name.replace(".", r"\.")):
                load_state_dict_file(path)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("kwargs:\n  pretrained: true\n", "load or download weights"),
        ("kwargs:\n  checkpoint_path: /tmp/other.pth\n", "checkpoint_path"),
        ("kwargs:\n  pretrained_cfg_overlay: {file: /tmp/other.pth}\n", "pretrained_cfg_overlay"),
    ],
)
def test_encoder_yaml_that_loads_its_own_weights_is_refused(tmp_path: Path, extra: str, match: str) -> None:
    path = tmp_path / "enc.yaml"
    path.write_text("arch: resnet18\ndim: 512\ninput_px: 64\n" + extra)
    with pytest.raises(ConfigError, match=match):
        load_recipe_yaml(path)
    path.write_text("arch: hf-hub:timm/resnet18.a1_in1k\ndim: 512\ninput_px: 64\n")
    with pytest.raises(ConfigError, match="hub repository"):
        load_recipe_yaml(path)


def test_encoder_yaml_width_is_checked_against_the_model(tmp_path: Path) -> None:
    from wsi.models.encoders import build_encoder

    path = tmp_path / "enc.yaml"
    path.write_text("arch: resnet18\ndim: 256\ninput_px: 32\n")
    with pytest.raises(ConfigError, match=r"declares dim 256, but its model gives 512-d"):
        build_encoder(str(path), random_init=True)
    path.write_text("arch: resnet18\ndim: 512\ninput_px: 32\n")
    assert build_encoder(str(path), random_init=True).dim == 512
