"""The figures a study reports, with their 95% bootstrap intervals, in NumPy (no model, no torch).

Training, `wsi predict --labels` and the statistics report all compute their numbers here, so a figure
in metrics.json, report.html and an external validation is the same code on the same numbers:
bootstrap (case resamples shared by several figures), classification, regression, survival, each
checked in the tests against a well-kept library on the same numbers (scikit-learn, SciPy, lifelines).
"""
