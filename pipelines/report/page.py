"""The report page: the metrics table from each set's metrics.json figures, the kind's sections, and
the self-contained HTML around them; `write_report` writes it with the CSVs (see `pipelines.report`)."""

from __future__ import annotations

import base64
import html
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.files import write_bytes_atomic, write_csv_atomic, write_text_atomic
from wsi.pipelines.report.sections import (
    Section,
    Tables,
    classification_sections,
    regression_sections,
    survival_sections,
)
from wsi.pipelines.stats.estimable import NOT_ESTIMABLE
from wsi.pipelines.study.kinds import PredictionSet, TaskKind

REPORT_NAME = "report.html"
METRIC_HEADER = ["set", "target", "metric", "value", "ci95_low", "ci95_high", "not_estimable"]
#: the kind's main figure, also written as its own PNG beside metrics.json (categorical: roc.png,
#: drawn by training as it always was)
MAIN_FIGURE = {
    "regression": ("scatter.png", "predicted against true"),
    "survival": ("km.png", "Kaplan-Meier"),
}


def metric_rows(metrics: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """Every numeric figure of each set's metrics as [set, target, metric, value, ci_low, ci_high]."""
    return [[name, *row] for name, figures in metrics.items() for row in _flatten(figures, "")]


def _flatten(figures: Mapping[str, Any], target: str) -> Iterator[list[Any]]:
    """Rows of one set's (or target's) figures; the last cell says why a figure or its interval is not
    estimable (pipelines.stats.estimable), "" when it is."""
    reasons = figures.get(NOT_ESTIMABLE) or {}

    def why(key: str) -> str:
        return str(reasons.get(key) or reasons.get(f"{key}_ci95") or "")

    for key, value in figures.items():
        if key.endswith("_ci95"):
            continue
        if key == "targets" and isinstance(value, Mapping):
            for column, sub in value.items():
                yield from _flatten(sub, column)
        elif key == "td_auc" and isinstance(value, list):
            for point in value:
                lo, hi = point.get("auc_ci95") or [None, None]
                yield [target, f"td_auc@{point['time']:.4g}", point.get("auc"), lo, hi, why("td_auc")]
        elif _is_figure(key, value):
            lo, hi = figures.get(f"{key}_ci95") or [None, None]
            yield [target, key, value, lo, hi, why(key)]


def _is_figure(key: str, value: Any) -> bool:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return numeric or (value is None and key in _NULLABLE)


#: figures that may be undefined (None) on a small set and still belong in the table
_NULLABLE = {
    "auroc", "accuracy", "balanced_accuracy", "average_precision", "pearson_r", "spearman_rho", "r2", "mae",
    "c_index", "logrank_p", "logrank_chi2", "score",
}  # fmt: skip


def kind_sections(
    kind: TaskKind,
    sets: Sequence[PredictionSet],
    metrics: Mapping[str, Mapping[str, Any]],
    tables: Tables,
    *,
    seed: int,
) -> list[Section]:
    """The figure sections of a kind's prediction sets: survival's own, else one group per target."""
    if kind.name == "survival":
        survival = [(s.name, s.targets[:, 0], s.targets[:, 1], kind.high_risk(s)) for s in sets]
        return survival_sections(survival, metrics, tables, time_unit=kind.task.survival_options.time_unit)
    out: list[Section] = []
    views = [kind.target_views(s) for s in sets]  # per set, per target
    for t, first in enumerate(views[0] if views else []):
        per_set = [(s.name, v[t]) for s, v in zip(sets, views, strict=True)]
        if first.type == "categorical":
            labelled = [(name, v.y.astype(np.int64), v.outputs) for name, v in per_set]
            sub = {name: first.metrics_of(m) for name, m in metrics.items()}
            out += classification_sections(first.column, first.classes, labelled, sub, tables, seed=seed + t)
        else:
            points = [(name, v.y, v.outputs[:, 0], v.ids) for name, v in per_set]
            out += regression_sections(first.column, points, tables)
    return out


def write_report(
    out_dir: str | Path,
    *,
    kind: TaskKind,
    sets: Sequence[PredictionSet],
    metrics: Mapping[str, Mapping[str, Any]],
    title: str,
    summary: Sequence[Sequence[Any]] = (),
    seed: int = 0,
) -> Path:
    """report.html and report/*.csv in `out_dir` for these sets (metrics keyed by set name; `summary`:
    extra rows [figure, mean, std] of a cross-validation). Returns the HTML's path."""
    out = Path(out_dir)
    tables = Tables()
    rows = metric_rows(metrics)
    tables.add("metrics.csv", METRIC_HEADER, rows)
    sections = kind_sections(kind, sets, metrics, tables, seed=seed)
    for name, (header, csv_rows) in tables.csvs.items():
        write_csv_atomic(out / "report" / name, header, ([_cell(v) for v in r] for r in csv_rows))
    main, section = MAIN_FIGURE.get(kind.name, ("", ""))
    figure = next(
        (b[1][0] for s in sections if section and section in s.title for b in s.blocks if b[0] == "figure"),
        None,
    )
    if figure is not None:
        write_bytes_atomic(out / main, figure)
    page = render_html(title, kind, sets, rows, sections, summary)
    path = out / REPORT_NAME
    write_text_atomic(path, page)
    return path


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{float(value):.6g}"
    return value


def fmt_value(value: Any) -> str:
    """A figure as the report shows it: 4 decimals (integers whole), n/a when undefined."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"
    if isinstance(value, int | np.integer):
        return str(int(value))
    return f"{float(value):.4f}"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;
max-width:1200px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 16px 8px 0;font-size:13px;display:inline-table;vertical-align:top}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right} th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:8px 16px 8px 0} figcaption{font-size:12px;color:#555}
img{max-width:100%;border:1px solid #eee} .meta{color:#555;font-size:13px}
"""


def _table(header: Sequence[Any], rows: Sequence[Sequence[Any]], cls: str = "", blank_from: int = 99) -> str:
    """An HTML table; cells from column `blank_from` on stay empty when undefined (no interval)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)

    def cell(j: int, v: Any) -> str:
        text = v if isinstance(v, str) else ("" if v is None and j >= blank_from else fmt_value(v))
        return f"<td>{html.escape(text)}</td>"

    body = "".join("<tr>" + "".join(cell(j, v) for j, v in enumerate(r)) + "</tr>" for r in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(
    title: str,
    kind: TaskKind,
    sets: Sequence[PredictionSet],
    rows: Sequence[Sequence[Any]],
    sections: Sequence[Section],
    summary: Sequence[Sequence[Any]] = (),
) -> str:
    """The report as one HTML page (nothing fetched from elsewhere)."""
    sizes = ", ".join(f"{s.name}: {len(s)} cases" for s in sets)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">Task kind: {html.escape(kind.name)}. Sets: {html.escape(sizes)}. '
        "Intervals are 95% percentile bootstrap intervals over cases.</p>",
    ]
    if summary:
        parts += ["<h2>Cross-validation summary</h2>", _table(["figure", "mean", "std"], summary, "summary")]
    header = ["set", "target", "metric", "value", "95% CI low", "95% CI high", "not estimable: why"]
    parts += ["<h2>Metrics</h2>", _table(header, rows, "metrics", blank_from=4)]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        for what, content in section.blocks:
            if what == "figure":
                png, caption = content
                data = base64.b64encode(png).decode("ascii")
                parts.append(
                    f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
            elif what == "table":
                header, table_rows = content
                parts.append(_table(header, table_rows, "confusion"))
            else:
                parts.append(f"<p>{html.escape(str(content))}</p>")
    parts += slide_links(kind, sets)
    parts.append("</body></html>")
    return "\n".join(parts)


def slide_links(kind: TaskKind, sets: Sequence[PredictionSet]) -> list[str]:
    """Each slide linked to its view in `wsi view` (relative, `./?slide=<id>`: it opens when the viewer
    serves the folder this report is in). Slide-level runs on bags only: patients and images have no
    slide to show."""
    task = kind.task
    if getattr(task, "level", "slide") != "slide" or getattr(task, "input", "bags") != "bags":
        return []
    ids = list(dict.fromkeys(i for s in sets if s.name != "pooled" for i in s.ids))
    if not ids:
        return []
    links = ", ".join(
        f'<a href="./?slide={urllib.parse.quote(str(i), safe="")}">{html.escape(str(i))}</a>' for i in ids
    )
    return [
        "<h2>Slides</h2>",
        '<p class="meta">Each slide at full resolution with its heatmap and tiles: run <code>wsi view</code> '
        f'on this folder and follow a link.</p><p class="slides">{links}</p>',
    ]


__all__ = [
    "METRIC_HEADER",
    "REPORT_NAME",
    "fmt_value",
    "kind_sections",
    "metric_rows",
    "render_html",
    "slide_links",
    "write_report",
]
