"""Every bag preset learns: a planted MIL signal (a few witness tiles in each positive bag, none in the
negatives) is found above chance within a few epochs, trained through `train()` with the model's own
objective (CLAM's instance loss, DSMIL's streams and sigmoid output, DTFD-MIL's tiers) and scored on a
held-out cohort the run never saw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from cohorts import write_task

from wsi.formats.bags import BagProvenance, write_bag
from wsi.pipelines.predict.stage import load_run
from wsi.pipelines.stats.classification import auroc
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DIM = 16
TINY = {
    "vit-wsi-small": {"dim": 32, "attn_dim": 32, "mlp_dim": 32, "pool_dim": 16},
    "abmil": {"hidden_dim": 32, "attn_dim": 16},
    "transmil": {"dim": 32, "heads": 2, "landmarks": 16},
    "clam-sb": {"hidden_dim": 32, "attn_dim": 16, "k_sample": 2},
    "clam-mb": {"hidden_dim": 32, "attn_dim": 16, "k_sample": 2},
    "dsmil": {"query_dim": 16},
    "dtfd": {"hidden_dim": 32, "attn_dim": 16},
}


def _bags(folder: Path, n: int, seed: int) -> tuple[list[np.ndarray], list[int]]:
    """n bags of 8-16 noise tiles; every second bag has 2-3 witness tiles (+2.5 on features 0-3)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    feats, labels = [], []
    for i in range(n):
        label, size = i % 2, int(rng.integers(8, 17))
        x = rng.normal(size=(size, DIM)).astype(np.float32)
        if label:
            x[rng.permutation(size)[: int(rng.integers(2, 4))], :4] += 2.5
        grid = rng.permutation(64)[:size]
        coords = np.stack([grid % 8, grid // 8], 1).astype(np.float32) * 256.0
        prov = BagProvenance(slide_id=f"b{i:03d}", encoder="planted", weights_sha256="0" * 64,
                             tile_um=256.0, tile_px=256, mpp=0.5, level0_width=4096,
                             level0_height=4096, tile_params={"tile_um": 256.0, "tile_px": 256})  # fmt: skip
        write_bag(folder / f"b{i:03d}.h5", feats=x, coords_um=coords,
                  coords_px=(coords / 0.5).astype(np.int64), provenance=prov)  # fmt: skip
        feats.append(x)
        labels.append(label)
    return feats, labels


@pytest.mark.parametrize("preset", list(TINY))
def test_each_preset_finds_a_planted_signal_above_chance(preset: str, tmp_path: Path) -> None:
    _bags(tmp_path / "train", 32, seed=0)
    labels = tmp_path / "labels.csv"
    rows = "".join(f"b{i:03d},{'LUSC' if i % 2 else 'LUAD'},p{i}\n" for i in range(32))
    labels.write_text("slide,label,patient\n" + rows)
    task = write_task(
        tmp_path / "task.yaml", model={"preset": preset, "overrides": TINY[preset]}, epochs=6, patience=0,
        optimizer={"lr": 2e-3, "weight_decay": 1e-4, "schedule": "none"},
        split={"train": 0.75, "val": 0.25, "test": 0.0}, bootstrap=20,
    )  # fmt: skip
    train(task=task, labels_csv=labels, features_dir=tmp_path / "train", out_dir=tmp_path / "run",
          progress=False)  # fmt: skip
    held_out, truth = _bags(tmp_path / "test", 40, seed=1)
    run = load_run(tmp_path / "run", device="cpu")
    with torch.no_grad():
        model = run.models[0]
        probs = np.stack([run.kind.outputs(model(torch.from_numpy(x)[None]))[0].numpy() for x in held_out])
    assert auroc(np.array(truth), probs) > 0.75, preset
