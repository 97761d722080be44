"""The figures of every task kind against well-kept libraries on the same numbers: scikit-learn and
SciPy (AUROC, average precision, regression figures, weighted AUC), lifelines (C-index, Kaplan-Meier,
log-rank, the Efron Cox log-likelihood)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wsi.pipelines.stats import classification as cls
from wsi.pipelines.stats import regression as reg
from wsi.pipelines.stats import survival as surv
from wsi.pipelines.stats.bootstrap import bootstrap_cis
from wsi.pipelines.study.kinds.losses import cox_partial_nll, masked_regression_loss


def _lifelines() -> None:
    pytest.importorskip("lifelines", reason="lifelines is a test dependency (pip install -e '.[dev]')")


def _area(y: np.ndarray, x: np.ndarray) -> float:
    """Trapezoid rule (numpy's name for it changed between 1.x and 2.x)."""
    return float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum())


def _survival_data(n: int, seed: int, *, ties: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    t = rng.exponential(1.0 / np.exp(0.8 * x)) * 10
    c = rng.uniform(0, 25, n)
    time = np.minimum(t, c)
    if ties:
        time = np.ceil(time)  # whole months: many tied times
    return time, (t <= c).astype(float), x


@pytest.mark.parametrize("ties", [False, True])
def test_concordance_index_equals_lifelines(ties: bool) -> None:
    _lifelines()
    from lifelines.utils import concordance_index

    time, event, x = _survival_data(300, 0, ties=ties)
    risk = np.round(x + np.random.default_rng(1).normal(0, 1, len(x)), 1)  # tied risks too
    # lifelines ranks predicted survival times (higher = longer): the negative risk
    assert surv.concordance_index(time, event, risk) == pytest.approx(
        concordance_index(time, -risk, event), abs=1e-12
    )
    assert surv.concordance_index(time, event, x) > 0.6  # the true covariate ranks well


def test_kaplan_meier_and_log_rank_equal_lifelines() -> None:
    _lifelines()
    from lifelines import KaplanMeierFitter
    from lifelines.statistics import logrank_test

    time, event, x = _survival_data(200, 2, ties=True)
    km = surv.kaplan_meier(time, event > 0)
    expected = KaplanMeierFitter().fit(time, event).survival_function_at_times(km.time).to_numpy()
    np.testing.assert_allclose(km.at(km.time), expected, atol=1e-12)
    assert km.at_risk[0] == len(time) and km.events.sum() == event.sum()
    high = x > np.median(x)
    stat, p = surv.logrank_test(time, event, high)
    ref = logrank_test(time[high], time[~high], event[high], event[~high])
    assert stat == pytest.approx(ref.test_statistic, rel=1e-9) and p == pytest.approx(ref.p_value, rel=1e-9)
    assert math.isnan(surv.logrank_test(time, event, np.ones(len(time), bool))[1])  # one group: undefined


def test_time_dependent_auc_is_a_weighted_auroc() -> None:
    """AUC(t) = AUROC of cases (event by t, weighted 1/G(T-)) against controls (still at risk after t),
    computed by scikit-learn with sample weights."""
    from sklearn.metrics import roc_auc_score

    time, event, x = _survival_data(250, 3, ties=False)
    horizons = np.array([3.0, 8.0])
    got = surv.time_dependent_auc(time, event, x, horizons)
    censoring = surv.kaplan_meier(time, event < 0.5)
    for t, auc in zip(horizons, got, strict=True):
        cases, controls = (event > 0.5) & (time <= t), time > t
        keep = cases | controls
        weights = np.where(cases, 1.0 / censoring.at(time, left=True), 1.0)[keep]
        assert auc == pytest.approx(roc_auc_score(cases[keep], x[keep], sample_weight=weights), abs=1e-12)
    assert np.isnan(surv.time_dependent_auc(time, event, x, np.array([1e9]))[0])  # no control left


def test_efron_cox_loss_equals_lifelines_log_likelihood() -> None:
    _lifelines()
    from lifelines import CoxPHFitter
    from lifelines.datasets import load_rossi

    rossi = load_rossi()  # many tied weeks
    cph = CoxPHFitter().fit(rossi, duration_col="week", event_col="arrest")
    x = rossi.drop(columns=["week", "arrest"]).to_numpy(dtype=np.float64)
    risk = torch.tensor(x @ cph.params_.to_numpy(), dtype=torch.float64)
    time = torch.tensor(rossi["week"].to_numpy(), dtype=torch.float64)
    event = torch.tensor(rossi["arrest"].to_numpy(), dtype=torch.float64)
    nll = cox_partial_nll(risk.double(), time, event, ties="efron").double()
    # the loss is float32 (training precision): -mean per event of the log partial likelihood
    assert float(-nll * event.sum()) == pytest.approx(cph.log_likelihood_, rel=2e-5)


def _breslow_loop(risk: np.ndarray, time: np.ndarray, event: np.ndarray) -> float:
    total = 0.0
    for i in np.flatnonzero(event):
        total += risk[i] - np.log(np.exp(risk[time >= time[i]]).sum())
    return -total / event.sum()


def test_breslow_is_the_textbook_sum_and_equals_efron_without_ties() -> None:
    time, event, x = _survival_data(80, 4, ties=True)
    risk = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    t, e = torch.tensor(time), torch.tensor(event)
    loss = cox_partial_nll(risk, t, e, ties="breslow")
    assert loss.item() == pytest.approx(_breslow_loop(x, time, event), rel=1e-5)
    loss.backward()  # a gradient for every bag of the set
    assert risk.grad is not None and torch.isfinite(risk.grad).all() and risk.grad.abs().sum() > 0
    time2, event2, x2 = _survival_data(80, 5, ties=False)
    args = (torch.tensor(x2), torch.tensor(time2), torch.tensor(event2))
    assert float(cox_partial_nll(*args, ties="efron")) == pytest.approx(
        float(cox_partial_nll(*args, ties="breslow"))
    )
    # a set with no event says nothing: zero loss, zero gradient
    none = cox_partial_nll(risk, t, torch.zeros_like(e))
    assert none.item() == 0.0


def test_masked_regression_loss_ignores_missing_labels() -> None:
    pred = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    target = torch.tensor([[1.5, float("nan")], [2.0, 5.0], [float("nan"), float("nan")]])
    loss = masked_regression_loss(pred, target, torch.tensor([1.0, 2.0]))
    assert loss.item() == pytest.approx(((1 - 1.5) ** 2 + (3 - 2) ** 2) / 2 + 2 * (4 - 5) ** 2)
    loss.backward()
    assert pred.grad is not None
    assert pred.grad[2].abs().sum() == 0 and pred.grad[0, 1] == 0  # no gradient from a missing label


def test_regression_figures_equal_scipy_and_sklearn() -> None:
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import mean_absolute_error, r2_score

    rng = np.random.default_rng(0)
    y = rng.normal(size=150)
    p = (0.7 * y + rng.normal(0, 0.5, 150)).round(1)  # tied predictions
    assert reg.pearson_r(y, p) == pytest.approx(pearsonr(y, p)[0])
    assert reg.spearman_rho(y, p) == pytest.approx(spearmanr(y, p)[0])
    assert reg.r2(y, p) == pytest.approx(r2_score(y, p))
    assert reg.mae(y, p) == pytest.approx(mean_absolute_error(y, p))
    y_missing = y.copy()
    y_missing[:10] = np.nan
    figures = reg.evaluate_regression(y_missing, p, n_bootstrap=200, seed=1)
    assert figures["n"] == 140 and figures["pearson_r"] == pytest.approx(pearsonr(y[10:], p[10:])[0])
    for name in reg.FIGURES:
        lo, hi = figures[f"{name}_ci95"]
        assert lo <= figures[name] <= hi
    assert math.isnan(reg.pearson_r(np.ones(5), p[:5]))  # no variance: undefined, not an error


def test_classification_extras_and_curves_match_sklearn() -> None:
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, 200)
    score = np.clip(labels * 0.35 + rng.random(200) * 0.65, 0, 1)
    probs = np.stack([1 - score, score], axis=1)
    extra = cls.extra_figures(labels, probs, n_bootstrap=200, seed=0)
    assert extra["average_precision"] == pytest.approx(average_precision_score(labels, score))
    lo, hi = extra["average_precision_ci95"]
    assert lo < extra["average_precision"] < hi
    band = cls.roc_band(labels == 1, score, n_resamples=100, seed=0)
    # the area under the curve read on the grid is close to the exact AUROC; the band brackets the curve
    assert _area(band["tpr"], band["fpr"]) == pytest.approx(roc_auc_score(labels, score), abs=0.01)
    assert (band["tpr_low"] <= band["tpr"] + 1e-12).all() and (band["tpr"] <= band["tpr_high"] + 1e-12).all()
    pr = cls.pr_band(labels == 1, score, n_resamples=100, seed=0)
    assert pr["precision"][0] == pytest.approx(1.0) or pr["precision"][0] >= pr["precision"][-1]
    assert np.all(np.diff(pr["precision"]) <= 1e-12)  # interpolated precision never rises with recall
    cal = cls.calibration_bins(labels == 1, score, n_bins=5)
    assert cal["n"].sum() == 200 and ((cal["mean_predicted"] >= 0) & (cal["mean_predicted"] <= 1)).all()


def test_bootstrap_intervals_are_reproducible_and_share_resamples() -> None:
    x = np.random.default_rng(0).normal(size=50)
    stats = {"mean": lambda idx: float(x[idx].mean()), "twice": lambda idx: float(2 * x[idx].mean())}
    a = bootstrap_cis(stats, 50, n_resamples=300, seed=4)
    assert a == bootstrap_cis(stats, 50, n_resamples=300, seed=4)
    assert a["twice"] == pytest.approx(tuple(2 * v for v in a["mean"]))  # same resamples for both
    assert a["mean"][0] < x.mean() < a["mean"][1]


def test_survival_evaluation_brackets_its_figures() -> None:
    time, event, x = _survival_data(150, 6, ties=False)
    figures = surv.evaluate_survival(time, event, x, high_risk=x > 0, horizons=None, n_bootstrap=100, seed=0)
    lo, hi = figures["c_index_ci95"]
    assert lo <= figures["c_index"] <= hi and figures["n_events"] == int(event.sum())
    assert len(figures["td_auc"]) == 3 and all(0.5 < p["auc"] <= 1 for p in figures["td_auc"])
    assert figures["logrank_p"] < 0.05 and figures["n_high_risk"] == int((x > 0).sum())
