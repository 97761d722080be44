"""Label tables: CSV rows (slide, label, patient) checked against the task and matched to inputs.

Mistakes a user can fix are errors naming the file and rows: a missing column, a label outside the
task's classes, the same slide twice, a class with fewer than two patients. Slides listed without an
input file and inputs without a label are only counted, logged and left out: a cohort is rarely complete.
"""

from __future__ import annotations

import csv
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.inputs import Item
from pipelines.tasks import LabelColumns
from wsi.errors import LabelError
from wsi.files import sanitize_slide_id
from wsi.suffixes import strip_suffix  # the suffixes a slide column may carry

log = logging.getLogger(__name__)

_SLIDE_ALIASES = ("slide", "slide_id", "FILENAME", "filename", "file", "image", "image_id", "path")
_PATIENT_ALIASES = ("patient", "PATIENT", "patient_id", "case_id", "case", "subject")
_TCGA = re.compile(r"^TCGA-[A-Z0-9]{2}-[A-Z0-9]{4}", re.IGNORECASE)


@dataclass(frozen=True)
class LabelRow:
    slide: str  # as written in the CSV
    label: str
    patient: str
    row: int  # 1-based line number in the file, header = 1


@dataclass(frozen=True)
class Matched:
    items: list[Item]
    missing_inputs: list[str]  # labelled slides with no input file
    unlabelled: list[str]  # input files with no label row


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
    """Parse and check a label CSV (comma, semicolon or tab separated)."""
    path = Path(path)
    if not path.is_file():
        raise LabelError(f"label table {path} does not exist")
    text = path.read_text(encoding="utf-8-sig")
    try:
        dialect = csv.Sniffer().sniff(text.splitlines()[0] if text else ",", delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.DictReader(text.splitlines(), dialect=dialect)
    header = reader.fieldnames or []
    slide_col = _pick(header, columns.slide, _SLIDE_ALIASES)
    label_col = columns.label if columns.label in header else None
    patient_col = _pick(header, columns.patient, _PATIENT_ALIASES) if columns.patient else None
    if slide_col is None or label_col is None:
        raise LabelError(
            f"{path}: needs a slide column ({columns.slide!r} or one of {', '.join(_SLIDE_ALIASES)}) and a "
            f"label column {columns.label!r}; found columns: {', '.join(header) or 'none'}"
        )
    rows: list[LabelRow] = []
    bad_labels: list[str] = []
    for i, rec in enumerate(reader, start=2):
        slide = (rec.get(slide_col) or "").strip()
        label = (rec.get(label_col) or "").strip()
        if not slide:
            continue
        if label not in classes:
            bad_labels.append(f"row {i} ({slide}: {label!r})")
            continue
        patient = (rec.get(patient_col) or "").strip() if patient_col else ""
        rows.append(LabelRow(slide=slide, label=label, patient=patient or default_patient(slide), row=i))
    if bad_labels:
        raise LabelError(
            f"{path}: {len(bad_labels)} label(s) outside the task's classes {list(classes)}: "
            + ", ".join(bad_labels[:10])
            + (", ..." if len(bad_labels) > 10 else "")
            + "; fix the labels or use a task with these classes"
        )
    by_key: dict[str, list[LabelRow]] = defaultdict(list)
    for r in rows:
        by_key[slide_keys(r.slide)[-1]].append(r)
    dups = [rs for rs in by_key.values() if len(rs) > 1]
    if dups:
        desc = "; ".join(f"{rs[0].slide} on rows {', '.join(str(r.row) for r in rs)}" for rs in dups[:10])
        raise LabelError(f"{path}: {len(dups)} slide(s) listed more than once: {desc}; keep one row each")
    if not rows:
        raise LabelError(f"{path}: no labelled rows")
    return rows


def match_items(
    rows: Sequence[LabelRow],
    found: Mapping[str, Path],
    *,
    classes: Sequence[str],
    labels_path: str | Path = "labels",
) -> Matched:
    """Pair label rows with the input files found (by id or file name); check classes still have patients."""
    items: list[Item] = []
    missing: list[str] = []
    used: set[str] = set()
    for r in rows:
        key = next((k for k in slide_keys(r.slide) if k in found), None)
        if key is None:
            missing.append(r.slide)
            continue
        used.add(key)
        items.append(Item(id=key, path=found[key], label=classes.index(r.label), patient=r.patient))
    unlabelled = sorted(set(found) - used)
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
    patients: dict[int, set[str]] = defaultdict(set)
    for it in items:
        patients[it.label].add(it.group)
    few = [f"{c} ({len(patients[i])})" for i, c in enumerate(classes) if len(patients[i]) < 2]
    if few:
        raise LabelError(
            f"{labels_path}: class(es) with fewer than two patients that have an input file: "
            f"{', '.join(few)}; a patient-grouped split needs at least two per class"
        )
    counts = Counter(classes[it.label] for it in items)
    log.info("%d slides from %d patients: %s", len(items), len({it.group for it in items}), dict(counts))
    return Matched(items=items, missing_inputs=missing, unlabelled=unlabelled)
