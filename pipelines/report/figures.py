"""The report's plots as PNG bytes (matplotlib, Agg): curves with bands, scatter, Kaplan-Meier.

Each function draws one figure from numbers already computed (`pipelines.stats`), one line or panel
per prediction set (a fold, the pooled folds, a cohort), and returns the PNG; the report embeds it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from wsi.pipelines.stats.classification import UNIT_LIMITS
from wsi.pipelines.stats.survival import KaplanMeier, TdAucPoint

_DPI = 110


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    _plt().close(fig)
    return buf.getvalue()


class _Style(TypedDict):
    color: str
    lw: float  # line width, points


def _style(i: int, name: str) -> _Style:
    """Pooled / the only set: a strong black line; folds: thin coloured ones."""
    if name == "pooled":
        return {"color": "black", "lw": 2.0}
    return {"color": f"C{i % 10}", "lw": 1.2}


def band_plot(
    curves: Sequence[tuple[str, dict[str, np.ndarray]]],
    *,
    x: str,
    y: str,
    title: str,
    xlabel: str,
    ylabel: str,
    diagonal: bool,
    area: Sequence[float | None],
) -> bytes:
    """Curves (name, {x, y, y_low, y_high}) with their 95% bands; `area` labels each (AUROC / AP)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    for i, ((name, c), a) in enumerate(zip(curves, area, strict=True)):
        style = _style(i, name)
        label = name if a is None else f"{name} ({a:.3f})"
        ax.plot(c[x], c[y], label=label, zorder=3, **style)
        ax.fill_between(c[x], c[f"{y}_low"], c[f"{y}_high"], color=style["color"], alpha=0.12, lw=0)
    if diagonal:
        ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    # a margin inside the frame: a perfect curve (AUROC 1) runs along x = 0 and y = 1, which it would hide
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, xlim=UNIT_LIMITS, ylim=UNIT_LIMITS)
    ax.legend(loc="lower right" if diagonal else "lower left", fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def calibration_plot(tables: Sequence[tuple[str, dict[str, np.ndarray]]], *, title: str) -> bytes:
    """Observed frequency against mean predicted probability per bin; marker size ~ cases in the bin."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    for i, (name, t) in enumerate(tables):
        style = _style(i, name)
        ax.plot(t["mean_predicted"], t["observed"], marker="o", ms=3, label=name, **style)
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    ax.set(xlabel="Mean predicted probability", ylabel="Observed frequency", title=title, xlim=UNIT_LIMITS,
           ylim=UNIT_LIMITS)  # fmt: skip
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def scatter_plot(
    points: Sequence[tuple[str, np.ndarray, np.ndarray]], *, title: str, label: str, r: float | None
) -> bytes:
    """Predicted against true value per set, with the identity line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    values = [v for _, y, p in points for v in (y, p) if len(v)]
    lo, hi = (
        (float(np.min(np.concatenate(values))), float(np.max(np.concatenate(values)))) if values else (0, 1)
    )
    for i, (name, y, p) in enumerate(points):
        ax.scatter(y, p, s=12, alpha=0.7, color=f"C{i % 10}", label=name, edgecolors="none")
    ax.plot([lo, hi], [lo, hi], ls="--", c="grey", lw=0.8)
    suffix = "" if r is None else f" (Pearson r {r:.3f})"
    ax.set(xlabel=f"true {label}", ylabel=f"predicted {label}", title=title + suffix)
    if len(points) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def km_plot(
    panels: Sequence[tuple[str, dict[str, KaplanMeier], float | None]], *, title: str, time_unit: str
) -> bytes:
    """One panel per set: Kaplan-Meier curves of the high- and low-risk groups, log-rank p in the title."""
    plt = _plt()
    n = max(1, len(panels))
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, curves, p) in zip(axes.flat, panels, strict=False):
        for group, color in (("low risk", "C0"), ("high risk", "C3")):
            km = curves.get(group)
            if km is None or not len(km.time):
                continue
            t = np.concatenate([[0.0], km.time])
            s = np.concatenate([[1.0], km.survival])
            ax.step(t, s, where="post", color=color, label=f"{group} (n={int(km.at_risk[0])})")
            censored = km.censored > 0
            ax.plot(km.time[censored], km.survival[censored], "|", color=color, ms=6)
        ax.set(xlabel=f"time ({time_unit})", ylabel="survival", ylim=(0, 1.02),
               title=f"{name}" + ("" if p is None else f": log-rank p = {p:.3g}"))  # fmt: skip
        ax.legend(fontsize=7, loc="lower left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_axis_off()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def td_auc_plot(series: Sequence[tuple[str, list[TdAucPoint]]], *, title: str, time_unit: str) -> bytes:
    """Time-dependent AUC with its 95% interval at each horizon, per set."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 3.8))
    for i, (name, points) in enumerate(series):
        pts = [p for p in points if p.get("auc") is not None]
        if not pts:
            continue
        t = np.array([p["time"] for p in pts])
        a = np.array([p["auc"] for p in pts])
        ci = np.array([[p["auc_ci95"][0] or np.nan, p["auc_ci95"][1] or np.nan] for p in pts])
        err = np.abs(np.stack([a - ci[:, 0], ci[:, 1] - a]))
        ax.errorbar(t, a, yerr=np.nan_to_num(err), marker="o", capsize=3, label=name, **_style(i, name))
    ax.axhline(0.5, ls="--", c="grey", lw=0.8)
    ax.set(xlabel=f"time ({time_unit})", ylabel="AUC(t)", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


__all__ = ["band_plot", "calibration_plot", "km_plot", "png_bytes", "scatter_plot", "td_auc_plot"]
