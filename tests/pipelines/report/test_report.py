"""The statistics report: one self-contained HTML page whose every image is a PNG and whose metrics
table holds the numbers of metrics.json, with the CSVs behind every figure; rendered headless by
Chromium when it is installed."""

from __future__ import annotations

import base64
import csv
import io
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from cohorts import make_cohort, write_task
from kinds_cohorts import make_kind_cohort, write_kind_task
from PIL import Image

from wsi.pipelines.report import fmt_value, metric_rows
from wsi.pipelines.train import train

PNG = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """Images, table rows and any reference to another resource."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self.external: list[str] = []
        self.scripts = 0
        self.heads: dict[str, str] = {}  # <title> and <h1> text
        self._head: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag == "script":
            self.scripts += 1
        for key in ("href", "src"):
            if (a.get(key) or "").startswith(("http:", "https:", "//", "file:")):
                self.external.append(a[key] or "")
        if tag in ("title", "h1"):
            self._head = tag
            self.heads[tag] = ""
        if tag == "tr":
            self._row = []
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == self._head:
            self._head = None
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._head is not None:
            self.heads[self._head] += data
        if self._cell is not None:
            self._cell.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _check_report(folder: Path, by_set: dict[str, dict], csvs: set[str]) -> _Page:
    """Every image a decodable PNG, nothing fetched from elsewhere, every figure of metrics.json in the
    metrics table (as the report prints it) and in report/metrics.csv, and the curve CSVs present."""
    page = _parse(folder / "report.html")
    # a real title: the browser tab and the page's heading name the task and the set
    assert page.heads.get("title", "").strip() and page.heads["title"] == page.heads.get("h1")
    assert page.heads["title"].split(":")[0].strip(), page.heads
    assert page.images and not page.external and page.scripts == 0
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data[:8] == PNG
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    table = {tuple(r[:3]): r[3:] for r in page.rows if len(r) == 7}
    expected = metric_rows(by_set)
    assert expected
    for set_name, target, metric, value, lo, hi, why in expected:
        shown = table[(set_name, target, metric)]
        assert shown[0] == fmt_value(value), (set_name, target, metric)
        assert shown[1:] == [*(fmt_value(v) if v is not None else "" for v in (lo, hi)), why]
    with (folder / "report" / "metrics.csv").open(newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(expected)
    assert csvs <= {p.name for p in (folder / "report").iterdir()}
    return page


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def categorical_cv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("report")
    cohort = make_cohort(root, n_patients=12)
    task = write_task(root / "task.yaml", epochs=2, patience=0)
    train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=root / "cv",
        cv=2,
        progress=False,
    )
    return root / "cv"


def test_categorical_cross_validation_report(categorical_cv: Path) -> None:
    summary = json.loads((categorical_cv / "metrics.json").read_text())
    by_set = {f"fold-{k + 1}": m for k, m in enumerate(summary["per_fold"])} | {"pooled": summary["pooled"]}
    page = _check_report(categorical_cv, by_set, {"roc.csv", "pr.csv", "calibration.csv", "confusion.csv"})
    assert page.heads["title"].endswith(": 2-fold cross-validation"), page.heads
    assert len(page.images) == 3  # ROC, PR and calibration of the positive class, each fold + pooled
    with (categorical_cv / "report" / "roc.csv").open(newline="") as fh:
        roc = list(csv.DictReader(fh))
    assert {r["set"] for r in roc} == {"fold-1", "fold-2", "pooled"}
    pooled = [r for r in roc if r["set"] == "pooled"]
    fpr, tpr = np.array([[float(r["fpr"]), float(r["tpr"])] for r in pooled]).T
    area = float(((tpr[1:] + tpr[:-1]) / 2 * np.diff(fpr)).sum())
    assert area == pytest.approx(summary["pooled"]["auroc"], abs=0.02)
    # the pooled set is every fold's test predictions: its confusion matrix counts every slide once
    with (categorical_cv / "report" / "confusion.csv").open(newline="") as fh:
        pooled_counts = sum(int(r["count"]) for r in csv.DictReader(fh) if r["set"] == "pooled")
    assert pooled_counts == summary["pooled"]["n"] == sum(f["n"] for f in summary["per_fold"])
    # the fold runs have their own report of their test split
    fold = json.loads((categorical_cv / "fold-1" / "metrics.json").read_text())
    _check_report(categorical_cv / "fold-1", {"test": fold}, {"roc.csv", "pr.csv"})


def test_regression_and_survival_reports(tmp_path: Path) -> None:
    cohort = make_kind_cohort(tmp_path / "r", kind="regression", n_patients=30, seed=8)
    task = write_kind_task(tmp_path / "r.yaml", "regression", epochs=2)
    train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "reg",
        progress=False,
    )
    metrics = json.loads((tmp_path / "reg" / "metrics.json").read_text())
    _check_report(tmp_path / "reg", {"test": metrics}, {"scatter.csv"})
    cohort = make_kind_cohort(tmp_path / "s", kind="survival", n_patients=40, seed=9)
    task = write_kind_task(tmp_path / "s.yaml", "survival", epochs=2)
    train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "surv",
        progress=False,
    )
    metrics = json.loads((tmp_path / "surv" / "metrics.json").read_text())
    page = _check_report(tmp_path / "surv", {"test": metrics}, {"km.csv", "td_auc.csv"})
    assert any(r[2] == "c_index" for r in page.rows) and any(r[2].startswith("td_auc@") for r in page.rows)
    with (tmp_path / "surv" / "report" / "km.csv").open(newline="") as fh:
        km = list(csv.DictReader(fh))
    assert {r["group"] for r in km} == {"high risk", "low risk"}
    assert sum(int(r["events"]) for r in km) == metrics["n_events"]


def _chromium() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(_chromium() is None, reason="needs Chromium on PATH to render the report headless")
def test_report_renders_in_headless_chromium(categorical_cv: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    browser = _chromium()
    assert browser is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1600"]
    page = (categorical_cv / "report.html").resolve().as_uri()
    command = [browser, *flags, f"--screenshot={shot}", page]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    with Image.open(shot) as img:
        pixels = np.asarray(img.convert("L"), dtype=np.float32)
    assert pixels.shape == (1600, 1200)
    assert (pixels < 128).mean() > 0.005  # text, tables and plots were drawn, not a blank page


def test_a_perfect_roc_curve_shows_inside_its_frame(tmp_path: Path) -> None:
    """At AUROC 1.0 the curve runs along x = 0 and y = 1: drawn on limits (0, 1) it lay under the frame
    and the plot looked empty. Both ROC figures (roc.png and the report's) keep a margin inside the
    frame, so the curve's own colour shows along both edges."""
    from wsi.pipelines.report import figures
    from wsi.pipelines.stats.classification import plot_roc

    labels = np.array([0, 0, 0, 1, 1, 1])
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.2, 0.8], [0.1, 0.9], [0.05, 0.95]])
    assert plot_roc(labels, probs, ["LUAD", "LUSC"], tmp_path / "roc.png", title="t")
    curve = {"fpr": np.array([0.0, 0.0, 1.0]), "tpr": np.array([0.0, 1.0, 1.0])}
    curve |= {"tpr_low": curve["tpr"], "tpr_high": curve["tpr"]}
    band = figures.band_plot([("fold-1", curve)], x="fpr", y="tpr", title="ROC", xlabel="x", ylabel="y",
                             diagonal=True, area=[1.0])  # fmt: skip
    blue = np.asarray((31, 119, 180))  # matplotlib's C0: the curve of roc.png and of a fold
    for png in (Image.open(tmp_path / "roc.png"), Image.open(io.BytesIO(band))):
        pixels = np.asarray(png.convert("RGB")).astype(int)
        line = np.abs(pixels - blue).sum(axis=-1) < 40
        cols, rows = line.sum(axis=0), line.sum(axis=1)  # a vertical and a horizontal run of the curve
        assert (cols > 0.3 * pixels.shape[0]).any() and (rows > 0.3 * pixels.shape[1]).any()
