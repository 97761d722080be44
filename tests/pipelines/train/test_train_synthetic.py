"""A separable synthetic cohort of feature bags (written with wsi.formats.bags) for the training/predict
tests.

Imported by test_train.py, test_predict.py and test_labels_splits.py; the tests here check that the
cohort is what they assume.
"""

from __future__ import annotations

from pathlib import Path

from cohorts import IN_DIM, make_cohort

from wsi.formats.bags import read_bag, read_bag_attrs


def test_cohort_bags_load_with_their_labels(tmp_path: Path) -> None:
    cohort = make_cohort(tmp_path, n_patients=4)
    assert len(cohort.slides) == 6  # patients 0 and 3 have two slides
    bag = read_bag(cohort.bags / f"{cohort.slides[0]}.h5")
    assert bag.feats.shape[1] == IN_DIM and bag.coords_um.shape == (len(bag), 2)
    assert read_bag_attrs(bag.path)["encoder"] == "test-encoder"
    # the class signal: features 0-3 have the class's sign on average
    for slide in cohort.slides:
        mean = read_bag(cohort.bags / f"{slide}.h5").feats[:, :4].mean()
        assert (mean > 0) == (cohort.labels_of[slide] == "LUSC")
