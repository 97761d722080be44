"""Prediction stage: a trained run over bags or raw slides -> predictions, heatmaps, reports."""
