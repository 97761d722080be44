"""benchmarks/tile_ceiling.py: its counterfactual stages really take the filters and the QC outputs out
(so "neither" is a true ceiling for faster filters and QC) and leave the library as it was."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import tile_ceiling
import wsi.pipelines.tile.filters as filters
import wsi.pipelines.tile.steps as steps
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import find_slides


def _run(slide: Path, out: Path) -> tuple[np.ndarray, Path, Path]:
    res = tile_slides(find_slides([slide]), out_dir=out, overwrite=True, threads=1)
    assert res[0].status == "ok", res[0].error
    paths = output_paths(out, res[0].slide_id)
    with h5py.File(paths.h5, "r") as fh:
        reasons = fh["candidate_reasons"][()]  # every candidate's verdict
    return reasons, paths.qc, paths.geojson


def test_the_counterfactuals_take_out_what_they_say(sample_slide, tmp_path: Path) -> None:
    reasons, qc, geojson = _run(sample_slide.path, tmp_path / "stage")
    assert (reasons != 0).any(), "the sample slide has a blurred box and background: the filters drop some"
    assert qc.stat().st_size > 0 and geojson.is_file()

    with tile_ceiling.variant(filters=False, qc=True):
        kept_all, qc_on, _ = _run(sample_slide.path, tmp_path / "no-filters")
    assert len(kept_all) == len(reasons) and (kept_all == 0).all()  # every candidate read and kept
    assert qc_on.stat().st_size > 0

    with tile_ceiling.variant(filters=True, qc=False):
        same, qc_off, geojson_off = _run(sample_slide.path, tmp_path / "no-qc")
    assert np.array_equal(same, reasons)  # the filters as they are
    assert qc_off.stat().st_size == 0 and not geojson_off.exists()


def test_the_library_is_restored_and_a_renamed_step_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    before = (filters.classified_chunks, steps.tile_qc_image, steps.save_png, steps.write_qc_geojson)
    with tile_ceiling.variant(filters=False, qc=False):
        assert filters.classified_chunks is not before[0] and steps.save_png is not before[2]
    assert (filters.classified_chunks, steps.tile_qc_image, steps.save_png, steps.write_qc_geojson) == before
    monkeypatch.delattr(steps, "write_qc_geojson")
    gone = pytest.raises(SystemExit, match="write_qc_geojson is gone")
    with gone, tile_ceiling.variant(filters=True, qc=False):
        pass
    assert steps.tile_qc_image is before[1]  # what was swapped before the failure is put back
