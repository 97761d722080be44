"""The statistics report of a run, a cross-validation or an external cohort: report.html + report/*.csv.

`report.html` is one self-contained file (inline CSS, every plot a base64 PNG, no script; its only links
open each slide in `wsi view`), so it opens anywhere and can be archived with the run; `report/` holds
the numbers behind it, one CSV per figure (docs/formats.md). A set is a test split, a fold, the pooled
folds or an external cohort; the metrics table's figures are metrics.json's, so the two never disagree.
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
