"""Every number a user can give is finite and in a range its meaning allows (issue 31).

Three layers, each over everything there is, found rather than listed:
- every numeric field of every config model (`@config_model`: tasks, presets, tile / embed / predict
  options, encoder recipes, stain references, the records read back from files) declares a lower and an
  upper bound (`wsi.core.config.numeric_leaves`);
- hypothesis draws a field and a value outside its range (below, above, NaN, +-inf): parsing refuses it
  with a ConfigError that names the field, never a traceback from torch or numpy later;
- every numeric option of every `wsi` command is bounded and refuses NaN and infinities (exit 2, naming
  the option), and the task YAML a user writes meets the same checks end to end (`wsi train` exit 2).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from config_classes import config_classes
from hypothesis import given, settings
from hypothesis import strategies as st

from wsi.cli.main import COMMANDS, cli, load_command
from wsi.core.config import NumericLeaf, numeric_leaves, parse_config
from wsi.core.errors import ConfigError
from wsi.pipelines.study.tasks import load_task

FEW = settings(max_examples=60, deadline=None)


def _leaves() -> list[tuple[type, NumericLeaf]]:
    return [(cls, leaf) for cls in config_classes() for leaf in numeric_leaves(cls)]


def _finite(cls: type) -> bool:
    return bool(getattr(cls, "__wsi_finite__", True))


def test_config_models_are_found() -> None:
    """The discovery the other tests rely on sees the configs users write and the records read back."""
    names = {c.__name__ for c in config_classes()}
    assert {"TaskConfig", "OptimizerConfig", "TileParams", "TissueParams", "EmbedOptions", "PredictOptions",
            "MILConfig", "ABMILConfig", "EncoderRecipe", "StainReference", "RunRecord", "BagProvenance",
            "TileFileMeta", "ImageSpec"} <= names  # fmt: skip
    assert len(_leaves()) > 150


def test_every_number_of_every_config_is_bounded_on_both_sides() -> None:
    unbounded = []
    for cls, leaf in _leaves():
        lo = [leaf.bounds[k] for k in ("ge", "gt") if k in leaf.bounds]
        hi = [leaf.bounds[k] for k in ("le", "lt") if k in leaf.bounds]
        if not _finite(cls) and leaf.kind is float:
            continue  # a record that holds -inf on purpose (the resume state's best score)
        if not (lo and hi and all(math.isfinite(b) for b in lo + hi)):
            unbounded.append(f"{cls.__module__}.{cls.__name__}.{leaf.where} {leaf.bounds}")
    assert not unbounded, "numbers without a finite range on both sides:\n" + "\n".join(unbounded)


def _inside(leaf: NumericLeaf) -> float | int:
    """A value the leaf takes (for the other elements of a tuple)."""
    b = leaf.bounds
    lo = b.get("ge", b.get("gt", 0))
    hi = b.get("le", b.get("lt", lo + 2))
    value = lo if "ge" in b else (lo + hi) / 2
    return math.ceil(value) if leaf.kind is int else float(value)


def _outside(leaf: NumericLeaf, finite: bool) -> list[Any]:
    """Values the leaf must refuse: just past each bound, and (where finite) NaN and the infinities."""
    b = leaf.bounds
    out: list[Any] = []
    if "ge" in b or "gt" in b:
        lo = b.get("ge", b.get("gt"))
        out.append(lo - (1 if leaf.kind is int else max(abs(lo), 1.0)) if "ge" in b else lo)
    if "le" in b or "lt" in b:
        hi = b.get("le", b.get("lt"))
        out.append((hi + 1 if leaf.kind is int else hi * 2 + 1.0) if "le" in b else hi)
    if finite:
        out += [math.nan, math.inf, -math.inf]
    return out


def _value_at(cls: type, path: str, value: Any, bad_path: str) -> Any:
    """The value of the sub-structure at `path` (a where-path prefix): `value` at `bad_path`, a value
    each other leaf takes everywhere else (tuples get their full length, mappings one key)."""
    leaves = {leaf.where: leaf for leaf in numeric_leaves(cls)}
    if path in leaves and path == bad_path:
        return value
    below = {w[len(path) :].split("]")[0] + "]" for w in leaves if w.startswith(path + "[")}
    if not below:
        return _inside(leaves[path])
    if below == {"[key]"}:
        return {"k": _value_at(cls, path + "[key]", value, bad_path)}
    if below == {"[*]"}:
        return [_value_at(cls, path + "[*]", value, bad_path)]
    n = max(int(seg[1:-1]) for seg in below if seg[1:-1].isdigit()) + 1
    return [_value_at(cls, f"{path}[{i}]", value, bad_path) for i in range(n)]


@st.composite
def bad_numbers(draw: st.DrawFn) -> tuple[type, NumericLeaf, Any]:
    cls, leaf = draw(st.sampled_from(_leaves()))
    return cls, leaf, draw(st.sampled_from(_outside(leaf, _finite(cls)) or [None]))


def test_every_number_out_of_its_range_is_refused_naming_the_field() -> None:
    """Exhaustive: each leaf of each config, just past each bound, NaN and the infinities."""
    for cls, leaf in _leaves():
        for value in _outside(leaf, _finite(cls)):
            _check_refused((cls, leaf, value))


@st.composite
def far_numbers(draw: st.DrawFn) -> tuple[type, NumericLeaf, Any]:
    """Any value beyond a bound of a drawn leaf (not only the one just past it)."""
    bounded = [(c, leaf) for c, leaf in _leaves() if leaf.bounds]  # the resume state's score has none
    cls, leaf = draw(st.sampled_from(bounded))
    b = leaf.bounds
    lo, hi = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    if leaf.kind is int:
        below = st.integers(max_value=int(lo) - 1) if "ge" in b else st.integers(max_value=int(lo))
        above = st.integers(min_value=int(hi) + 1) if "le" in b else st.integers(min_value=int(hi))
    else:
        below = st.floats(max_value=lo, exclude_max="ge" in b, allow_nan=False, allow_infinity=False)
        above = st.floats(min_value=hi, exclude_min="le" in b, allow_nan=False, allow_infinity=False)
    return cls, leaf, draw(st.one_of(below, above))


@given(case=far_numbers())
@FEW
def test_a_number_anywhere_out_of_its_range_is_refused(case: tuple[type, NumericLeaf, Any]) -> None:
    _check_refused(case)


def _check_refused(case: tuple[type, NumericLeaf, Any]) -> None:
    cls, leaf, value = case
    if value is None:
        return  # an unbounded leaf: the test above fails for it
    data = {leaf.field: _value_at(cls, leaf.field, value, leaf.where)}
    with pytest.raises(ConfigError) as err:
        parse_config(cls, data, source="hostile.yaml")
    message = str(err.value)
    where = leaf.where.replace("[key]", ".k").replace("[*]", ".0").replace("[", ".").replace("]", "")
    # the exact place (`stain_matrix.1.0`); a union field names the arm it tried (`patch_size.list[...]`)
    arms = (f"'{where}", f"'{leaf.field}.list[", f"'{leaf.field}.constrained")
    assert message.startswith("hostile.yaml") and any(a in message for a in arms), (leaf, value, message)


@given(case=bad_numbers())
@settings(max_examples=30, deadline=None)
def test_direct_construction_refuses_the_same_scalars(case: tuple[type, NumericLeaf, Any]) -> None:
    """A library call that builds a config directly meets the same ranges (wsi.core.config.check_bounds)."""
    cls, leaf, value = case
    if value is None or leaf.where != leaf.field:
        return
    try:
        base = parse_config(cls, {}, source="defaults")
    except ConfigError:
        return  # a class with required fields: parsing (above) is its path
    with pytest.raises((ValueError, ConfigError), match=leaf.field):
        dataclasses.replace(base, **{leaf.field: value})


# ------------------------------------------------------------------------------------- command lines
def _numeric_options() -> list[tuple[str, click.Option]]:
    found = []
    for name in COMMANDS:
        for param in load_command(name).params:
            if isinstance(param, click.Option) and isinstance(
                param.type, click.types.IntParamType | click.types.FloatParamType
            ):
                found.append((name, param))
    return found


def _refuses(opt: click.Option, raw: str) -> bool:
    try:
        opt.type.convert(raw, opt, None)
    except click.BadParameter:
        return True
    return False


def test_every_numeric_option_is_bounded_and_finite() -> None:
    loose = []
    for name, opt in _numeric_options():
        t = opt.type
        bounded = isinstance(t, click.IntRange | click.FloatRange) and t.min is not None and t.max is not None
        if not (bounded and _refuses(opt, "nan") and _refuses(opt, "inf") and _refuses(opt, "-inf")):
            loose.append(f"wsi {name} {opt.opts[0]}")
    assert not loose, f"options without a finite range: {loose}"


def test_every_numeric_option_is_found() -> None:
    seen = {(name, opt.opts[0]) for name, opt in _numeric_options()}
    wanted = {("train", "--seed"), ("tile", "--tile-um"), ("tile", "--thumb-mpp"), ("embed", "--readers"),
              ("make-slides", "--size-um"), ("make-slides", "--seed"), ("predict", "--mpp")}  # fmt: skip
    assert wanted <= seen


@st.composite
def bad_options(draw: st.DrawFn) -> tuple[str, click.Option, str]:
    name, opt = draw(st.sampled_from(_numeric_options()))
    t = opt.type
    assert isinstance(t, click.IntRange | click.FloatRange)
    values = [str(t.min - 1), str(t.max + 1), "1e999"]
    if isinstance(t, click.FloatRange):
        values += ["nan", "inf", "-inf", str(t.max * 2 + 1)]
    else:
        values += ["1.5", str(2**64)]
    return name, opt, draw(st.sampled_from(values))


@given(case=bad_options())
@FEW
def test_a_number_out_of_an_options_range_is_a_usage_error_naming_it(
    case: tuple[str, click.Option, str],
) -> None:
    name, opt, raw = case
    ctx = click.Context(load_command(name))
    with pytest.raises(click.BadParameter) as err:
        opt.process_value(ctx, raw)
    message = err.value.format_message()
    assert err.value.exit_code == 2 and opt.opts[0] in message, message


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--seed", "-1"],
        ["train", "--seed", str(2**64)],
        ["train", "--epochs", "nan"],
        ["tile", "--tile-um", "inf"],
        ["tile", "--tile-um", "0.001"],
        ["tile", "--thumb-mpp", "1e-4"],
        ["make-slides", "--size-um", "5000000"],
        ["predict", "--mpp", "nan"],
    ],
    ids=lambda a: " ".join(a),
)
def test_the_reported_values_are_refused_by_the_cli(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and args[1] in result.output and "Traceback" not in result.output, (
        result.output
    )


# ---------------------------------------------------------------------------------------- task YAML
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"optimizer": {"grad_clip": -1.0}}, "optimizer.grad_clip"),  # trained backwards before
        ({"optimizer": {"lr": float("nan")}}, "optimizer.lr"),
        ({"optimizer": {"weight_decay": float("inf")}}, "optimizer.weight_decay"),
        ({"split": {"train": float("nan"), "val": 0.2, "test": 0.2}}, "split.train"),
        ({"seed": -1}, "seed"),  # crashed in the bootstrap after training
        ({"seed": 2**64}, "seed"),
        ({"bootstrap": 1_000_000_000}, "bootstrap"),
        ({"epochs": 10**9}, "epochs"),
        ({"augment": {"tile_fraction": [0.5, float("inf")]}}, "augment.tile_fraction"),
    ],
    ids=lambda v: str(v),
)
def test_task_yaml_numbers_are_checked_when_read(change: dict[str, Any], field: str, tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "classes": ["a", "b"], "input": "bags", **change}))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        load_task(path)
    assert str(path) in str(err.value)


def test_a_bad_task_number_is_exit_2_before_any_work(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump({"name": "t", "classes": ["a", "b"], "input": "bags", "seed": -5}))
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\ns1,a\n")
    (tmp_path / "bags").mkdir()
    args = ["train", "--task", str(task), "--labels", str(labels), "--features", str(tmp_path / "bags"),
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "seed" in result.output and "task.yaml" in result.output, result.output
