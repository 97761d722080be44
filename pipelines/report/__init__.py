"""The statistics report of a run, a cross-validation or an external cohort: report.html + report/*.csv.

`report.html` is one self-contained file (inline CSS, every plot a base64 PNG; no script; its only links
are relative ones to each slide's view, `./?slide=<id>`, that open when `wsi view` serves the folder),
so it opens anywhere and can be archived with the run. `report/` holds the numbers behind it:

  metrics.csv       every figure of every set with its 95% interval (set, target, metric, value, ci)
  roc.csv, pr.csv   categorical targets: curves read on a common axis, with 95% bootstrap bands
  calibration.csv   categorical targets: reliability bins
  confusion.csv     categorical targets: confusion matrix counts
  scatter.csv       continuous targets: true and predicted value per case
  km.csv            survival: Kaplan-Meier estimate per risk group
  td_auc.csv        survival: time-dependent AUC per horizon

A set is a test split, a cross-validation fold, the pooled folds, or an external cohort; the figures
in the metrics table are those of metrics.json, so the report and the JSON never disagree.
"""

from wsi.pipelines.report.page import (
    METRIC_HEADER,
    REPORT_NAME,
    fmt_value,
    kind_sections,
    metric_rows,
    render_html,
    write_report,
)

__all__ = [
    "METRIC_HEADER",
    "REPORT_NAME",
    "fmt_value",
    "kind_sections",
    "metric_rows",
    "render_html",
    "write_report",
]
