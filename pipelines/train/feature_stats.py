"""The per-feature mean and sd of a training split's tiles, for `standardize_features: true`.

Fitted on the fold's training cases only (never validation or test), by streaming over their bags one
at a time and each bag in row blocks: a block's float64 mean and sum of squared deviations are merged
into the running ones by Chan et al.'s pairwise update (numerically stable where sum(x^2) - n mean^2
cancels), so a cohort of a million tiles needs memory for one bag and a block, not for its tiles.
The result goes into the model (`models.standardize`) before training, and so into its weights.

A feature whose sd is ~0 over the training tiles (TINY_SD relative to its size: what float32 features
cannot tell from rounding) is centred but left unscaled (scale 1), and the log says how many: dividing
by ~0 would turn rounding noise, or any variation an unseen slide brings, into huge inputs. The sd is
numpy's default (ddof 0).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from wsi.core.errors import ConfigError
from wsi.pipelines.inputs import InputAdapter, Item
from wsi.pipelines.study.cases import make_loader

log = logging.getLogger(__name__)

#: sd at or below this share of max(1, |mean|) counts as ~0: the feature is centred, not scaled
TINY_SD = 1e-6
#: rows cast to float64 at a time (2048-d: 128 MB)
BLOCK_ROWS = 8192


@dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations (M2) per feature, merged block by block in float64."""

    n: int = 0
    mean: np.ndarray | None = None  # (D,) float64
    m2: np.ndarray | None = None  # (D,) float64

    def add(self, rows: np.ndarray) -> None:
        """Merge a block of rows (n, D) of any float dtype (Chan, Golub & LeVeque 1979: pairwise)."""
        if rows.ndim != 2:
            raise ValueError(f"rows must be (n, D), got {rows.shape}")
        for start in range(0, len(rows), BLOCK_ROWS):
            block = np.asarray(rows[start : start + BLOCK_ROWS], dtype=np.float64)
            n_b = len(block)
            if n_b == 0:
                continue
            mean_b = block.mean(axis=0)
            m2_b = ((block - mean_b) ** 2).sum(axis=0)
            if self.mean is None or self.m2 is None:
                self.n, self.mean, self.m2 = n_b, mean_b, m2_b
                continue
            if mean_b.shape != self.mean.shape:
                raise ConfigError(
                    f"bags of different feature widths ({self.mean.shape[0]} and {mean_b.shape[0]}) "
                    "cannot share one standardisation"
                )
            n = self.n + n_b
            delta = mean_b - self.mean
            self.mean = self.mean + delta * (n_b / n)
            self.m2 = self.m2 + m2_b + delta**2 * (self.n * n_b / n)
            self.n = n

    def sd(self) -> np.ndarray:
        """The population sd (ddof 0) per feature."""
        if self.m2 is None or self.n == 0:
            raise ValueError("no rows were added")
        return np.sqrt(np.maximum(self.m2 / self.n, 0.0))


@dataclass(frozen=True)
class FeatureStats:
    """What a training split's tiles give the model's input standardisation."""

    mean: np.ndarray  # (D,) float64
    sd: np.ndarray  # (D,) float64, ddof 0
    n_tiles: int

    @property
    def unscaled(self) -> np.ndarray:
        """(D,) bool: features whose sd is ~0 (centred, left unscaled)."""
        return self.sd <= TINY_SD * np.maximum(1.0, np.abs(self.mean))

    @property
    def scale(self) -> np.ndarray:
        """(D,) the divisor: the sd, or 1 where it is ~0."""
        return np.where(self.unscaled, 1.0, self.sd)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, scale) as float32 tensors for `models.standardize.attach_standardizer`."""
        return torch.from_numpy(self.mean).float(), torch.from_numpy(self.scale).float()


def fit_feature_stats(
    adapter: InputAdapter, items: Sequence[Item], *, num_workers: int = 0, where: str = "training split"
) -> FeatureStats:
    """Mean and sd per feature over every tile (or slide embedding) of `items`' whole inputs."""
    loader = make_loader(
        adapter, items, train=False, batch_size=1, num_workers=num_workers, device=torch.device("cpu"),
        n_targets=0,
    )  # fmt: skip
    moments = RunningMoments()
    for batch in loader:
        x = batch.x
        if x.ndim != 3:
            raise ConfigError(
                f"standardize_features z-scores the features of bags or slide embeddings; input "
                f"{adapter.name!r} gives {x.ndim - 1}-d samples. Set standardize_features: false"
            )
        rows = x.reshape(-1, x.shape[-1]) if batch.mask is None else x[batch.mask.bool()]
        moments.add(rows.numpy())
    if moments.mean is None or moments.n == 0:
        raise ConfigError(f"the {where} holds no tiles: no feature mean and sd can be fitted")
    stats = FeatureStats(mean=moments.mean, sd=moments.sd(), n_tiles=moments.n)
    n_unscaled = int(stats.unscaled.sum())
    log.info(
        "standardised %d features with the mean and sd of %d tiles of the %s (%d case(s))",
        len(stats.mean), stats.n_tiles, where, len(items),
    )  # fmt: skip
    if n_unscaled:
        log.warning(
            "%d of %d features have sd ~0 over the %s's %d tiles: centred, left unscaled",
            n_unscaled, len(stats.mean), where, stats.n_tiles,
        )  # fmt: skip
    return stats


__all__ = ["BLOCK_ROWS", "TINY_SD", "FeatureStats", "RunningMoments", "fit_feature_stats"]
