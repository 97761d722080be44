"""Label tables: CSV rows (slide, label or targets, patient) checked against the task, matched to inputs.

Mistakes a user can fix are errors naming the file and rows: a missing column, a label outside the
task's classes, a time that is not a number, the same slide twice, a class with fewer than two
patients. Slides listed without an input file and inputs without a label are only counted, logged and
left out: a cohort is rarely complete.

What a row's label is depends on the task's kind (`pipelines.kinds`): a class, continuous targets,
time and event, or several targets with blanks allowed. A `level: patient` task may also give one row
per patient and no slide column (a clinical table): every input whose id is the patient id, or starts
with it followed by a separator (TCGA-05-4244 -> TCGA-05-4244-01Z-00-DX1), is that patient's.
An optional `mpp` column gives a slide's level-0 um/px (blank = unknown): bags that store level-0 pixel
coordinates (CLAM, TRIDENT) need it when the model uses tile positions; it wins over `--mpp`.
Shared by training and `wsi predict --labels`.
"""

from __future__ import annotations

import csv
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from wsi.core.config import MAX_MPP
from wsi.core.errors import LabelError
from wsi.core.files import sanitize_slide_id
from wsi.core.suffixes import strip_suffix  # the suffixes a slide column may carry
from wsi.core.user_text import check_header, read_utf8
from wsi.pipelines.inputs import Item
from wsi.pipelines.study.tasks import LabelColumns, TaskConfig

if TYPE_CHECKING:
    from wsi.pipelines.study.kinds import TaskKind

log = logging.getLogger(__name__)

_SLIDE_ALIASES = ("slide", "slide_id", "FILENAME", "filename", "file", "image", "image_id", "path")
_PATIENT_ALIASES = ("patient", "PATIENT", "patient_id", "case_id", "case", "subject")
#: the column of a slide's level-0 um/px (as in a slide list for `wsi tile`)
MPP_COLUMN = "mpp"
_TCGA = re.compile(r"^TCGA-[A-Z0-9]{2}-[A-Z0-9]{4}", re.IGNORECASE)


@dataclass(frozen=True)
class LabelRow:
    slide: str  # as written in the CSV; "" in a table of patients (level: patient, no slide column)
    label: str  # categorical: the class name; other kinds: ""
    patient: str
    row: int  # 1-based line number in the file, header = 1
    target: tuple[float, ...] = ()  # the label as the kind's target vector (NaN = missing)
    mpp: float | None = None  # the `mpp` column: the slide's level-0 um/px, when given


@dataclass(frozen=True)
class Matched:
    items: list[Item]
    missing_inputs: list[str]  # labelled slides with no input file
    unlabelled: list[str]  # input files with no label row
    mpp_by_slide: dict[str, float] = field(default_factory=dict)  # item id -> the row's `mpp`, when given


def default_patient(slide: str) -> str:
    """First 12 characters of a TCGA barcode (TCGA-XX-XXXX), else the slide id itself."""
    name = Path(slide).name
    return name[:12] if _TCGA.match(name) else strip_suffix(name)


def slide_keys(value: str) -> list[str]:
    """Ids a slide-column value may match, best first: as written, then without a known file suffix."""
    name = Path(value.strip()).name
    keys = [name, strip_suffix(name)]
    out: list[str] = []
    for key in keys:
        for k in (key, _safe(key)):
            if k and k not in out:
                out.append(k)
    return out


def _safe(name: str) -> str:
    try:
        return sanitize_slide_id(name)
    except ValueError:
        return ""


def _pick(header: Sequence[str], wanted: str | None, aliases: Sequence[str]) -> str | None:
    if wanted and wanted in header:
        return wanted
    for alias in aliases:
        if alias in header:
            return alias
    return None


def read_labels(path: str | Path, *, classes: Sequence[str], columns: LabelColumns) -> list[LabelRow]:
    """Parse and check a categorical label CSV (comma, semicolon or tab separated)."""
    classes = tuple(classes)

    def parse(rec: Mapping[str, str | None]) -> tuple[float, ...]:
        label = (rec.get(columns.label) or "").strip()
        if label not in classes:
            raise ValueError(repr(label))
        return (float(classes.index(label)),)

    return _read_table(path, columns=columns, required=(columns.label,), parse=parse, classes=classes)


def read_label_table(path: str | Path, *, task: TaskConfig, kind: TaskKind) -> list[LabelRow]:
    """Parse and check the label CSV of any task kind; at `level: patient` the slide column may be
    left out (one row per patient). Rows without any label (every target blank) are left out."""
    return _read_table(
        path, columns=task.columns, required=kind.label_columns(), parse=kind.parse_labels,
        classes=task.classes if task.kind == "categorical" else None, patient_table=task.level == "patient",
    )  # fmt: skip


def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    if not path.is_file():
        raise LabelError(f"label table {path} does not exist")
    text = read_utf8(path, what="label table", error=LabelError)  # no silent Latin-1: names the byte
    try:  # the header line decides the delimiter; a megabyte "line" is not sniffed whole
        dialect = csv.Sniffer().sniff(text[:65536].splitlines()[0] if text else ",", delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.DictReader(text.splitlines(), dialect=dialect)
    try:
        header = check_header(reader.fieldnames, str(path), error=LabelError)  # "label" twice: refused
        return header, [(i, rec) for i, rec in enumerate(reader, start=2)]
    except csv.Error as exc:  # a cell over csv's field limit (128 KiB), a quote never closed
        raise LabelError(f"{path} after line {reader.line_num}: not a readable CSV row ({exc})") from None


def _read_table(
    path: str | Path,
    *,
    columns: LabelColumns,
    required: Sequence[str],
    parse: Callable[[Mapping[str, str | None]], tuple[float, ...]],
    classes: Sequence[str] | None,
    patient_table: bool = False,
) -> list[LabelRow]:
    path = Path(path)
    header, records = _read_rows(path)
    slide_col = _pick(header, columns.slide, _SLIDE_ALIASES)
    patient_col = _pick(header, columns.patient, _PATIENT_ALIASES) if columns.patient else None
    missing = [c for c in required if c not in header]
    if (slide_col is None and not (patient_table and patient_col)) or missing:
        what = (
            f"a label column {columns.label!r}"
            if classes is not None
            else f"the columns {', '.join(required)}"
        )
        raise LabelError(
            f"{path}: needs a slide column ({columns.slide!r} or one of {', '.join(_SLIDE_ALIASES)})"
            + (
                f" or, for a patient-level task, a patient column ({columns.patient!r})"
                if patient_table
                else ""
            )
            + f" and {what}; found columns: {', '.join(header) or 'none'}. Rename the columns, or name "
            "yours under `columns:` in a task YAML (configs/tasks/*.yaml show how)"
        )
    rows: list[LabelRow] = []
    bad: list[str] = []
    bad_mpp: list[str] = []
    unlabelled = 0
    for i, rec in records:
        slide = (rec.get(slide_col) or "").strip() if slide_col else ""
        patient = (rec.get(patient_col) or "").strip() if patient_col else ""
        key = slide or patient
        if not key:
            continue
        try:
            target = parse(rec)
        except ValueError as exc:
            bad.append(f"row {i} ({key}: {exc})")
            continue
        if all(math.isnan(v) for v in target):
            unlabelled += 1
            continue
        label = (rec.get(columns.label) or "").strip() if classes is not None else ""
        try:
            mpp = _parse_mpp(rec.get(MPP_COLUMN))
        except ValueError as exc:
            bad_mpp.append(f"row {i} ({key}: {exc})")
            continue
        rows.append(
            LabelRow(
                slide=slide, label=label, patient=patient or default_patient(slide), row=i, target=target,
                mpp=mpp,
            )
        )
    if bad:
        listed = ", ".join(bad[:10]) + (", ..." if len(bad) > 10 else "")
        if classes is not None:
            raise LabelError(
                f"{path}: {len(bad)} label(s) outside the task's classes {list(classes)}: {listed}"
                "; fix the labels or use a task with these classes"
            )
        raise LabelError(f"{path}: {len(bad)} row(s) with labels the task cannot read: {listed}; fix them")
    if bad_mpp:
        listed = ", ".join(bad_mpp[:10]) + (", ..." if len(bad_mpp) > 10 else "")
        raise LabelError(
            f"{path}: {len(bad_mpp)} row(s) whose `{MPP_COLUMN}` is not a positive number of um/px "
            f"(level 0): {listed}; fix them or leave the cell blank"
        )
    if unlabelled:
        log.warning("%s: %d row(s) without any label are left out", path, unlabelled)
    _refuse_duplicates(path, rows)
    if not rows:
        raise LabelError(f"{path}: no labelled rows")
    return rows


def _parse_mpp(text: str | None) -> float | None:
    """A cell of the `mpp` column: blank = unknown, else a positive finite number (ValueError)."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_MPP):
        raise ValueError(f"mpp {text!r}")
    return value


def _refuse_duplicates(path: Path, rows: Sequence[LabelRow]) -> None:
    by_key: dict[str, list[LabelRow]] = defaultdict(list)
    for r in rows:
        by_key[slide_keys(r.slide)[-1] if r.slide else f"patient {r.patient}"].append(r)
    dups = [rs for rs in by_key.values() if len(rs) > 1]
    if dups:
        desc = "; ".join(
            f"{rs[0].slide or rs[0].patient} on rows {', '.join(str(r.row) for r in rs)}" for rs in dups[:10]
        )
        raise LabelError(f"{path}: {len(dups)} slide(s) listed more than once: {desc}; keep one row each")


def _patient_of(slide_id: str, patients: Mapping[str, LabelRow]) -> str | None:
    """The listed patient a slide id belongs to: equal to it, or a prefix followed by a separator."""
    best = None
    for patient in patients:
        belongs = slide_id == patient or (
            slide_id.startswith(patient) and not slide_id[len(patient)].isalnum()
        )
        if belongs and (best is None or len(patient) > len(best)):
            best = patient
    return best


def match_items(
    rows: Sequence[LabelRow],
    found: Mapping[str, Path],
    *,
    classes: Sequence[str] = (),
    labels_path: str | Path = "labels",
    kind: TaskKind | None = None,
    check: bool = True,
) -> Matched:
    """Pair label rows with the input files found (by id or file name; rows of a patient table with
    every input of that patient); with `check`, refuse a cohort that cannot be split and trained on
    (a class without two patients, too few events). An external cohort is scored as it is."""
    items: list[Item] = []
    missing: list[str] = []
    used: set[str] = set()
    mpp_by_slide: dict[str, float] = {}
    by_patient = {r.patient: r for r in rows if not r.slide}
    for r in rows:
        if not r.slide:
            continue
        key = next((k for k in slide_keys(r.slide) if k in found), None)
        if key is None:
            missing.append(r.slide)
            continue
        used.add(key)
        items.append(_item(key, found[key], r, classes, kind))
        if r.mpp is not None:
            mpp_by_slide[key] = r.mpp
    if by_patient:
        matched_patients: set[str] = set()
        for key in sorted(set(found) - used):
            patient = _patient_of(key, by_patient)
            if patient is not None:
                used.add(key)
                matched_patients.add(patient)
                items.append(_item(key, found[key], by_patient[patient], classes, kind))
                patient_mpp = by_patient[patient].mpp
                if patient_mpp is not None:
                    mpp_by_slide[key] = patient_mpp
        missing += [f"patient {p}" for p in by_patient if p not in matched_patients]
    unlabelled = sorted(set(found) - used)
    if not items and rows:
        raise LabelError(_none_matched(labels_path, rows, found))
    if missing:
        log.warning(
            "%d labelled slide(s) have no input file and are left out (e.g. %s)",
            len(missing), ", ".join(missing[:3]),
        )  # fmt: skip
    if unlabelled:
        log.warning(
            "%d input file(s) have no label row and are left out (e.g. %s)",
            len(unlabelled), ", ".join(unlabelled[:3]),
        )  # fmt: skip
    if kind is not None and kind.name != "categorical":
        kind.set_strata(items)
        items = [replace(it, label=kind.stratum(it.target)) for it in items]
        if check:
            kind.check_cohort(items, str(labels_path))
        log.info("%d slides from %d patients", len(items), len({it.group for it in items}))
        return Matched(items, missing, unlabelled, mpp_by_slide)
    patients: dict[int, set[str]] = defaultdict(set)
    for it in items:
        patients[it.label].add(it.group)
    few = [f"{c} ({len(patients[i])})" for i, c in enumerate(classes) if len(patients[i]) < 2]
    if few and check:
        raise LabelError(
            f"{labels_path}: class(es) with fewer than two patients that have an input file: "
            f"{', '.join(few)}; a patient-grouped split needs at least two per class"
        )
    counts = Counter(classes[it.label] for it in items)
    log.info("%d slides from %d patients: %s", len(items), len({it.group for it in items}), dict(counts))
    return Matched(items, missing, unlabelled, mpp_by_slide)


def _none_matched(labels_path: str | Path, rows: Sequence[LabelRow], found: Mapping[str, Path]) -> str:
    """Why no label row met an input file, with both sides' ids and, when they differ only by letter
    case or a prefix, that."""
    named = [r.slide or f"patient {r.patient}" for r in rows]
    inputs = sorted(found)
    if not inputs:
        return f"{labels_path}: its {len(rows)} row(s) have no input file to match (none was found)"
    lowered = {k.lower() for k in inputs}
    case_only = [r.slide for r in rows if r.slide and any(k.lower() in lowered for k in slide_keys(r.slide))]
    hint = (
        f"; ids differ only by letter case (e.g. {case_only[0]!r}): write them as the files are named"
        if case_only
        else "; the slide column must hold the input files' names (with or without their suffix), or the "
        "patient column the patients"
    )
    return (
        f"{labels_path}: none of its {len(rows)} row(s) matches one of the {len(inputs)} input file(s): "
        f"rows name e.g. {', '.join(named[:3])}; inputs are e.g. {', '.join(inputs[:3])}{hint}"
    )


def _item(key: str, path: Path, row: LabelRow, classes: Sequence[str], kind: TaskKind | None) -> Item:
    if kind is None or kind.name == "categorical":
        label = tuple(classes).index(row.label) if kind is None else int(row.target[0])
        return Item(id=key, path=path, label=label, patient=row.patient, target=(float(label),))
    return Item(id=key, path=path, label=-1, patient=row.patient, target=row.target)
