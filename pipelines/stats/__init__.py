"""The figures a study reports, with their 95% bootstrap intervals, in NumPy (no model, no torch).

Training, `wsi predict --labels` and the statistics report all compute their numbers here, so a figure
in metrics.json, in report.html and in an external validation is the same code on the same numbers.

  bootstrap        one set of case resamples shared by several figures -> percentile intervals
  classification   AUROC, average precision, accuracy, confusion matrix, ROC / PR bands, calibration
  regression       Pearson r, Spearman rho, R^2, MAE
  survival         Harrell's C-index, time-dependent AUC, Kaplan-Meier curves, the log-rank test

Each is checked against a well-kept library on the same numbers in the tests (scikit-learn, SciPy,
lifelines).
"""
