"""Training overhead on small bags: `wsi train`'s loop beside a plain PyTorch loop, same model and bags.

A Musk1-like cohort (92 bags of about 5 tiles, 166-d features; `benchmarks.mil_data`, generated: no
network) is written as `wsi` bag files and trained by `pipelines.train.train` (the user's path: task
YAML that names only its classes, the small-cohort recipe, HDF5 bags, validation, best/last weights,
log and resume state). The plain loop trains the same architecture (rebuilt from the run's
config.json) on the same training bags held in memory as tensors: shuffle, forward, cross-entropy,
backward, AdamW step per bag, then one forward pass over the validation bags. Both are timed per
epoch (median over the epochs after the first two); the two run alternately, `--repeats` times each,
in one process, so a noisy shared machine hits both alike. The figure to read is the ratio.

    python benchmarks/train_overhead.py                 # 92 bags, 30 epochs, 3 repeats, CPU
    python benchmarks/train_throughput.py --small-bags  # the same, from the throughput script

Prints a markdown table (seconds per training bag per epoch, validation included, and the ratio).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mil_data import MILCohort, load_public, public_sets_available, synthetic_cohort

log = logging.getLogger("train_overhead")
CLASSES = ("negative", "positive")


def cohort(n_bags: int) -> MILCohort:
    """Musk1 when the public sets are installed, else a generated cohort of the same shape."""
    if public_sets_available() and n_bags == 92:
        return load_public("musk1")
    # log-uniform sizes in [2, 12]: median about 5 tiles, as Musk1 (476 instances in 92 bags)
    return synthetic_cohort(n_bags, dim=166, min_size=2, max_size=12, seed=0, name="musk1-like")


def time_wsi_train(bags: Path, labels: Path, out: Path, *, epochs: int) -> tuple[float, int, Path]:
    """Median seconds per epoch of `wsi train` (train + validation + saving), and the training bag count."""
    from wsi.pipelines.study.tasks import parse_task
    from wsi.pipelines.train import train

    task = parse_task(
        {"name": "overhead", "classes": list(CLASSES), "seed": 0, "epochs": epochs, "patience": 0,
         "bootstrap": 20},
        source="train_overhead",
    )  # fmt: skip
    stamps: list[float] = []
    result = train(
        task=task, labels_csv=labels, features_dir=bags, out_dir=out, device="cpu", progress=False,
        on_epoch_end=lambda row: stamps.append(time.perf_counter()),
    )  # fmt: skip
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]  # epoch 3 onwards
    n_train = sum(1 for line in (out / "splits.csv").read_text().splitlines()[1:] if line.endswith(",train"))
    return statistics.median(gaps), n_train, result.run_dir


def time_plain(run_dir: Path, cohort: MILCohort, *, epochs: int) -> float:
    """Median seconds per epoch of a plain loop over the run's training and validation bags."""
    import torch
    import torch.nn.functional as F

    from wsi.models.presets import build_model_from_config
    from wsi.pipelines.runs.record import read_run_record

    record = read_run_record(run_dir)
    by_id = dict(zip(cohort.ids, range(len(cohort.ids)), strict=True))
    split = record.splits[0]

    def tensors(ids: tuple[str, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (torch.from_numpy(cohort.bags[by_id[i]])[None], torch.tensor([int(cohort.labels[by_id[i]])]))
            for i in ids
        ]

    train_set, val_set = tensors(split.train), tensors(split.val)
    torch.manual_seed(0)
    model = build_model_from_config(record.model, source="train_overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-2)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        total = torch.zeros(())
        for k in torch.randperm(len(train_set)).tolist():
            x, y = train_set[k]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
        model.eval()
        with torch.inference_mode():
            val_logits = torch.cat([model(x) for x, _ in val_set])
            F.cross_entropy(val_logits, torch.cat([y for _, y in val_set])).item()
        total.item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    import torch

    from mil_data import write_cohort

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bags", type=int, default=92)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny bags: 1 is fastest)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(args.threads)
    data = cohort(args.bags)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bags, labels = write_cohort(data, Path(tmp) / "cohort", classes=CLASSES)
        for r in range(args.repeats):
            wsi_s, n_train, run_dir = time_wsi_train(bags, labels, Path(tmp) / f"run{r}", epochs=args.epochs)
            plain_s = time_plain(run_dir, data, epochs=args.epochs)
            rows.append({"repeat": r + 1, "n_train": n_train, "wsi": wsi_s, "plain": plain_s})
    sizes = data.sizes
    median = int(statistics.median(sizes.tolist()))
    print(f"\n{data.name}: {len(data.bags)} bags, {int(sizes.sum())} tiles (median {median}), {data.dim}-d; "
          f"{args.epochs} epochs, median epoch from epoch 3, {args.threads} thread(s)")  # fmt: skip
    print("| repeat | training bags | plain loop s/bag/epoch | wsi train s/bag/epoch | ratio |")
    print("|---|---|---|---|---|")
    for row in rows:
        n = row["n_train"]
        print(f"| {row['repeat']} | {n} | {row['plain'] / n:.5f} | {row['wsi'] / n:.5f} "
              f"| {row['wsi'] / row['plain']:.2f} |")  # fmt: skip
    ratios = [row["wsi"] / row["plain"] for row in rows]
    print(f"\nmedian ratio wsi train / plain loop: {statistics.median(ratios):.2f}")
    return rows


if __name__ == "__main__":
    main()
