"""The tables, CSVs, expectations and plots of benchmarks/attention_scaling.py (its measuring half stays
there): rows in, files and markdown out."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from wsi.core.files import atomic_path

VARIANTS = ("seqnorm", "softmax", "sima", "gdla")
MODELS = ("mil", "vit2d")
FIELDS = (
    "mode",
    "model",
    "attention",
    "tokens",
    "status",
    "fwd_bwd_s",
    "peak_mem_mb",
    "base_mem_mb",
    "kb_per_token",
    "est_s",
    "device",
    "dtype",
)  # fwd_bwd_s: the timed step (forward only in --mode infer)


def fmt_row(row: dict[str, Any]) -> str:
    if row["status"] == "ok":
        per_token = (
            f" ({row['kb_per_token']:.1f} KB/token)" if row.get("kb_per_token") not in (None, "") else ""
        )
        return f"{row['fwd_bwd_s']:.3g} s / {row['peak_mem_mb']:.0f} MB{per_token}"
    if row["status"] == "skipped":
        return f"skipped (est. {row['est_s']:.0f} s)"
    return row["status"]


def read_rows(path: Path, device: str, dtype: str, mode: str = "train") -> list[dict[str, Any]]:
    """Measured rows of an earlier run (same mode, device and dtype), for --resume."""
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        rows = [
            r
            for r in csv.DictReader(fh)
            if r["status"] == "ok"
            and (r.get("mode") or "train", r["device"], r["dtype"]) == (mode, device, dtype)
        ]
    for r in rows:
        r["mode"], r["tokens"] = mode, int(r["tokens"])
        for key in ("fwd_bwd_s", "peak_mem_mb", "base_mem_mb", "kb_per_token"):
            r[key] = float(r[key]) if r.get(key) not in (None, "") else ""
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    order = {m: i for i, m in enumerate(MODELS)} | {v: i for i, v in enumerate(VARIANTS)}
    rows = sorted(rows, key=lambda r: (order[r["model"]], order[r["attention"]], r["tokens"]))
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def markdown(rows: list[dict[str, Any]]) -> str:
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    variants = [v for v in VARIANTS if any(r["attention"] == v for r in rows)]
    lines = []
    for model in models:
        sub = [r for r in rows if r["model"] == model]
        if not sub:
            continue
        what = (
            "forward time / peak memory, bag streamed in chunks"
            if sub[0].get("mode") == "infer"
            else "fwd+bwd time / peak memory"
        )
        lines += [f"**{model}** ({what}, batch 1)", ""]
        lines.append("| tokens | " + " | ".join(variants) + " |")
        lines.append("|---:|" + "---|" * len(variants))
        for n in sorted({r["tokens"] for r in sub}):
            cells = {r["attention"]: fmt_row(r) for r in sub if r["tokens"] == n}
            lines.append(f"| {n:,} | " + " | ".join(cells.get(v, "") for v in variants) + " |")
        lines.append("")
    return "\n".join(lines)


def expectations(rows: list[dict[str, Any]]) -> list[str]:
    def t(model: str, att: str, n: int) -> float | None:
        for r in rows:
            if (r["model"], r["attention"], r["tokens"], r["status"]) == (model, att, n, "ok"):
                return float(r["fwd_bwd_s"])
        return None

    out = []
    for model in MODELS:
        a, b = t(model, "seqnorm", 65536), t(model, "seqnorm", 16384)
        if a and b:
            out.append(f"{model}: seqnorm time(65,536)/time(16,384) = {a / b:.2f} (linear 4, quadratic 16)")
        s, q = t(model, "seqnorm", 32768), t(model, "softmax", 32768)
        if s and q:
            out.append(f"{model}: softmax/seqnorm time at 32,768 tokens = {q / s:.1f}x")
        elif s:
            skipped = [
                r for r in rows if (r["model"], r["attention"], r["tokens"]) == (model, "softmax", 32768)
            ]
            if skipped and skipped[0]["est_s"]:
                ratio = float(skipped[0]["est_s"]) / s
                out.append(f"{model}: softmax at 32,768 not run; estimated {ratio:.1f}x seqnorm")
    return out


def plot(rows: list[dict[str, Any]], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 4 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for att in VARIANTS:
            ok = sorted(
                (r["tokens"], r["fwd_bwd_s"], r["peak_mem_mb"])
                for r in rows
                if r["model"] == model and r["attention"] == att and r["status"] == "ok"
            )
            if ok:
                n, t, m = zip(*ok, strict=True)
                axes[i][0].loglog(n, t, "o-", label=att)
                axes[i][1].loglog(n, m, "o-", label=att)
        step = "forward time (s)" if rows[0].get("mode") == "infer" else "fwd+bwd time (s)"
        for j, what in enumerate((step, "peak memory (MB)")):
            axes[i][j].set(xlabel="tokens N", ylabel=what, title=f"{model} on {device}")
            axes[i][j].grid(True, which="both", alpha=0.3)
            axes[i][j].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
