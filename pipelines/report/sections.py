"""The report's sections per kind of target: figures (PNG bytes), tables, and the CSV rows behind them.

A classification target gets ROC and precision-recall curves with 95% bootstrap bands, a calibration
plot and confusion matrices; a continuous target a scatter plot; survival Kaplan-Meier curves of the
high- and low-risk groups and the time-dependent AUC. Every number drawn is also a CSV row (the
`Tables` it fills), so a figure can be redrawn elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import confusion_matrix

from wsi.pipelines.report import figures
from wsi.pipelines.stats import classification as cls_stats
from wsi.pipelines.stats.regression import pearson_r
from wsi.pipelines.stats.survival import kaplan_meier

#: bootstrap resamples for the curve bands (each resample draws a whole curve; 200 steady the 2.5% tail)
BAND_RESAMPLES = 200


@dataclass
class Section:
    """One titled part of the report: blocks of ("figure", (png, caption)), ("table", (header, rows))
    or ("text", str), in order."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class Tables:
    """CSV name -> (header, rows): the numbers behind the figures."""

    csvs: dict[str, tuple[list[str], list[list[Any]]]] = field(default_factory=dict)

    def add(self, name: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.csvs.setdefault(name, (list(header), []))[1].extend(list(r) for r in rows)


def _rows(keys: Sequence[Any], columns: Mapping[str, np.ndarray], names: Sequence[str]) -> list[list[Any]]:
    """CSV rows: `keys` then the named columns, one row per point."""
    return [[*keys, *row] for row in zip(*(columns[n] for n in names), strict=True)]


ROC_COLUMNS = ("fpr", "tpr", "tpr_low", "tpr_high")
PR_COLUMNS = ("recall", "precision", "precision_low", "precision_high")
CALIBRATION_COLUMNS = ("bin", "mean_predicted", "observed", "n")


def _area(metrics: Mapping[str, Any] | None, key: str, n_classes: int) -> float | None:
    """The headline area of a set's metrics for the legend (binary tasks only: one number per curve)."""
    if metrics is None or n_classes != 2:
        return None
    value = metrics.get(key)
    return None if value is None else float(value)


Curves = list[tuple[str, dict[str, np.ndarray]]]  # (set name, a curve's columns) per set


def classification_sections(
    target: str,
    classes: Sequence[str],
    sets: Sequence[tuple[str, np.ndarray, np.ndarray]],
    metrics: Mapping[str, Mapping[str, Any]],
    tables: Tables,
    *,
    seed: int,
) -> list[Section]:
    """ROC and PR curves with bands, calibration and confusion matrices of one categorical target.

    sets: (name, labels (n,) int, probs (n, C)); metrics: each set's figures (for the legends)."""
    prefix = f"{target}: " if target else ""
    curves = Section(f"{prefix}ROC and precision-recall curves")
    calibration: list[Section] = []
    for c in cls_stats.positive_targets(len(classes)):
        rocs, prs, calib = _class_curves(target, classes, c, sets, tables, seed)
        if not rocs:
            continue
        label = f"{prefix}{classes[c]}" + ("" if len(classes) == 2 else " vs rest")
        curves.blocks += _curve_figures(label, rocs, prs, metrics, len(classes))
        cal_png = figures.calibration_plot(calib, title=f"Calibration: {label}")
        caption = f"Observed frequency of {label} per bin of predicted probability"
        calibration.append(Section(f"{prefix}calibration: {classes[c]}", [("figure", (cal_png, caption))]))
    return [curves, *calibration, _confusion_section(prefix, target, classes, sets, tables)]


def _class_curves(
    target: str,
    classes: Sequence[str],
    c: int,
    sets: Sequence[tuple[str, np.ndarray, np.ndarray]],
    tables: Tables,
    seed: int,
) -> tuple[Curves, Curves, Curves]:
    """Class `c` against the rest in every non-empty set: (ROC bands, PR bands, calibration bins), each
    also added to its CSV."""
    rocs: Curves = []
    prs: Curves = []
    calib: Curves = []
    for name, labels, probs in sets:
        positive = labels == c
        if len(labels) == 0:
            continue
        roc = cls_stats.roc_band(positive, probs[:, c], n_resamples=BAND_RESAMPLES, seed=seed)
        pr = cls_stats.pr_band(positive, probs[:, c], n_resamples=BAND_RESAMPLES, seed=seed)
        cal = cls_stats.calibration_bins(positive, probs[:, c])
        rocs.append((name, roc))
        prs.append((name, pr))
        calib.append((name, cal))
        keys = [name, target, classes[c]]
        head = ["set", "target", "class"]
        tables.add("roc.csv", [*head, *ROC_COLUMNS], _rows(keys, roc, ROC_COLUMNS))
        tables.add("pr.csv", [*head, *PR_COLUMNS], _rows(keys, pr, PR_COLUMNS))
        tables.add("calibration.csv", [*head, *CALIBRATION_COLUMNS], _rows(keys, cal, CALIBRATION_COLUMNS))
    return rocs, prs, calib


def _curve_figures(
    label: str, rocs: Curves, prs: Curves, metrics: Mapping[str, Mapping[str, Any]], n_cls: int
) -> list[tuple[str, Any]]:
    """The ROC and precision-recall figures of one class, each set's area in the legend (binary tasks)."""
    roc_png = figures.band_plot(
        rocs, x="fpr", y="tpr", title=f"ROC: {label}", xlabel="False positive rate",
        ylabel="True positive rate", diagonal=True,
        area=[_area(metrics.get(n), "auroc", n_cls) for n, _ in rocs],
    )  # fmt: skip
    pr_png = figures.band_plot(
        prs, x="recall", y="precision", title=f"Precision-recall: {label}", xlabel="Recall",
        ylabel="Precision", diagonal=False,
        area=[_area(metrics.get(n), "average_precision", n_cls) for n, _ in prs],
    )  # fmt: skip
    return [
        ("figure", (roc_png, f"ROC curve of {label} (95% band)")),
        ("figure", (pr_png, f"Precision-recall curve of {label} (95% band)")),
    ]


def _confusion_section(
    prefix: str,
    target: str,
    classes: Sequence[str],
    sets: Sequence[tuple[str, np.ndarray, np.ndarray]],
    tables: Tables,
) -> Section:
    """Each non-empty set's confusion matrix (rows: true class), also added to confusion.csv."""
    confusion = Section(f"{prefix}confusion matrices (rows: true class, columns: predicted)")
    for name, labels, probs in sets:
        if not len(labels):
            continue
        cm = confusion_matrix(labels, probs.argmax(1), labels=list(range(len(classes))))
        rows = [[classes[i], *[int(v) for v in cm[i]]] for i in range(len(classes))]
        confusion.blocks.append(("table", ([f"{name}: true \\ predicted", *classes], rows)))
        cells = [(i, j) for i in range(len(classes)) for j in range(len(classes))]
        tables.add(
            "confusion.csv",
            ["set", "target", "true", "predicted", "count"],
            [[name, target, classes[i], classes[j], int(cm[i, j])] for i, j in cells],
        )
    return confusion


def regression_sections(
    target: str, sets: Sequence[tuple[str, np.ndarray, np.ndarray, list[str]]], tables: Tables
) -> list[Section]:
    """Scatter of predicted against true values of one continuous target (sets: name, y, p, ids)."""
    points = [(name, y, p) for name, y, p, _ in sets]
    all_y = np.concatenate([y for _, y, _ in points]) if points else np.zeros(0)
    all_p = np.concatenate([p for _, _, p in points]) if points else np.zeros(0)
    r = pearson_r(all_y, all_p) if len(all_y) > 1 else None
    png = figures.scatter_plot(points, title=target, label=target, r=r)
    rows = [
        [name, target, cid, float(a), float(b)]
        for name, y, p, ids in sets
        for cid, a, b in zip(ids, y, p, strict=True)
    ]
    tables.add("scatter.csv", ["set", "target", "case", "true", "predicted"], rows)
    return [
        Section(f"{target}: predicted against true", [("figure", (png, f"Predicted against true {target}"))])
    ]


def survival_sections(
    sets: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]],
    metrics: Mapping[str, Mapping[str, Any]],
    tables: Tables,
    *,
    time_unit: str,
) -> list[Section]:
    """Kaplan-Meier curves split at the training median risk, and time-dependent AUCs.

    sets: (name, time (n,), event (n,), high_risk (n,) bool or None)."""
    panels = []
    km_header = ["set", "group", "time", "survival", "at_risk", "events", "censored"]
    for name, time, event, high in sets:
        keep = np.isfinite(time)
        if high is None or not keep.any():
            continue
        curves = {}
        for group, mask in (("high risk", high), ("low risk", ~high)):
            sel = keep & mask
            if sel.any():
                km = kaplan_meier(time[sel], event[sel] > 0.5)
                curves[group] = km
                columns = {"time": km.time, "survival": km.survival, "at_risk": km.at_risk,
                           "events": km.events, "censored": km.censored}  # fmt: skip
                tables.add("km.csv", km_header, _rows([name, group], columns, km_header[2:]))
        panels.append((name, curves, (metrics.get(name) or {}).get("logrank_p")))
    out = []
    if panels:
        png = figures.km_plot(
            panels, title="Kaplan-Meier: split at the training median risk", time_unit=time_unit
        )
        out.append(
            Section("Kaplan-Meier curves (high against low risk)", [("figure", (png, "Kaplan-Meier curves"))])
        )
    else:
        out.append(Section("Kaplan-Meier curves", [("text", "no risk cut-off known for these predictions")]))
    series = [(name, list((metrics.get(name) or {}).get("td_auc") or [])) for name, *_ in sets]
    rows = [
        [name, p["time"], p["auc"], *(p.get("auc_ci95") or [None, None])] for name, pts in series for p in pts
    ]
    tables.add("td_auc.csv", ["set", "time", "auc", "auc_low", "auc_high"], rows)
    if rows:
        png = figures.td_auc_plot(series, title="Time-dependent AUC (95% CI)", time_unit=time_unit)
        out.append(
            Section("Time-dependent AUC", [("figure", (png, "Cumulative/dynamic AUC at each horizon"))])
        )
    return out


__all__ = [
    "BAND_RESAMPLES",
    "Section",
    "Tables",
    "classification_sections",
    "regression_sections",
    "survival_sections",
]
