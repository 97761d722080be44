"""Tiling stage: slides -> tile files, QC pictures and the manifest."""
