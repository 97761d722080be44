"""Every GPU figure docs/benchmarks.md claims, measured in one run of under 8 minutes on one GPU.

Sections (benchmarks/gpu_sections.py; each reuses the functions of the benchmark script named):
  gpu-tests     `pytest -m gpu` (nvjpeg device decode against libjpeg, CUDA embedding, ...): read from
                --gpu-tests-junit when the tests already ran (benchmarks/gpu_run.sh), else run here
  feed          the device-decode feed step by step (embed_feed.py): each read per reader process against
                the os.pread loop and the reader before issue 34, to device, decode, crop/resize, the bound
  decoders      torchvision / nvImageCodec / DALI on the feed's JPEG batches, cuCIM against openslide
                (jpeg_codecs.py; what is not installed is a "skipped" row)
  long-1m       (only when named) RetCCL end to end over 1,000,000 tiles in one process
  embed         per named encoder, random weights: forward tiles/s with TFLOP/s and model FLOP
                utilisation, end to end through `embed_works`, end2end/forward (embed_throughput.py);
                the feed (read + device decode) once
  attention-1m  no-grad forward of vit-wsi over a bag streamed in chunks to 1,000,000 tokens, each
                variant (attention_scaling.py --mode infer)
  train-1m      one forward + backward step on a 1,000,000-tile bag, activation checkpointing on by
                the model's own defaults (attention_scaling.py --mode train)
  train-epoch   one epoch on 1,000 TCGA-NSCLC-like bags per variant (train_throughput.py)

Each section runs in its own process group with a hard time budget (its share of --budget-s): a section
that fails, crashes or runs out of time is a row saying why and the others still run. Writes
gpu_suite.csv and gpu_suite.md into --out, and with --docs replaces the part of that file between
`<!-- gpu-suite:start -->` and `<!-- gpu-suite:end -->` with the table, the device, torch and CUDA
versions, the date and the aims met or not. Exit status 1 when a section failed.

    python benchmarks/gpu_suite.py --out /tmp/gpu-suite --docs docs/benchmarks.md   # one GPU, 6 min
    python benchmarks/gpu_suite.py --smoke --out /tmp/gpu-suite-smoke               # every section tiny, CPU
    make gpu-check                                                                   # the first line
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_sections import EMBED_AIMS, EXTRA_SECTIONS, SECTIONS, SHARES, make_plan

ALL_SECTIONS = {**SECTIONS, **EXTRA_SECTIONS}

log = logging.getLogger("gpu_suite")
FIELDS = ("section", "name", "measure", "value", "unit", "status", "detail")
START, END = "<!-- gpu-suite:start -->", "<!-- gpu-suite:end -->"


# ------------------------------------------------------------------------------------- the child side
def _child(section: str, rows_path: Path, smoke: bool, junit: str, budget_s: float, fail: bool) -> int:
    """Run one section in this process, appending each row to rows_path as a JSON line."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)

    def emit(section: str, name: str, measure: str, value: Any, unit: str, status: str, detail: str) -> None:
        row = dict(zip(FIELDS, (section, name, measure, value, unit, status, detail), strict=True))
        with rows_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        log.info("%s | %s | %s = %s %s (%s) %s", section, name, measure, value, unit, status, detail)

    plan = make_plan(smoke)
    try:
        if fail:
            raise RuntimeError("failure injected with --fail (a test of the report path)")
        if section == "gpu-tests":
            SECTIONS[section](plan, emit, junit=Path(junit) if junit else None, budget_s=budget_s)
        else:
            ALL_SECTIONS[section](plan, emit)
    except Exception as exc:  # the section's row says why; the suite goes on with the next
        log.exception("section %s failed", section)
        emit(section, "(section)", "-", "", "", f"failed: {type(exc).__name__}: {exc}"[:240], "")
        return 1
    return 0


# ------------------------------------------------------------------------------------ the parent side
def run_section(section: str, out: Path, budget_s: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The section in a child process (its own session, so a timeout kills its workers too); its rows,
    plus one saying why when it timed out, crashed or measured nothing."""
    rows_path = out / f".rows-{section}.jsonl"
    rows_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", section, "--rows", str(rows_path),
           "--section-budget-s", str(budget_s)]  # fmt: skip
    cmd += ["--gpu-tests-junit", str(args.gpu_tests_junit)] if args.gpu_tests_junit else []
    cmd += ["--smoke"] if args.smoke else []
    cmd += ["--fail", section] if section in args.fail else []
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)
    why = ""
    try:
        rc = proc.wait(timeout=budget_s)
        if rc != 0:
            why = f"failed: exit {rc}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        why = f"timeout: stopped at its budget of {budget_s:.0f} s"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    rows_path.unlink(missing_ok=True)
    reported = any(r["status"].startswith("failed") for r in rows)
    if (why and not reported) or not rows:
        rows.append(
            dict(zip(FIELDS, (section, "(section)", "-", "", "", why or "failed: no rows", ""), strict=True))
        )
    log.info("section %s: %d rows in %.0f s%s", section, len(rows), time.perf_counter() - started,
             f" ({why})" if why else "")  # fmt: skip
    return rows


def budgets(total_s: float, sections: list[str], tests_s: float) -> dict[str, float]:
    """Seconds per section: gpu-tests a fixed amount, the rest split by SHARES among those chosen."""
    rest = total_s - (tests_s if "gpu-tests" in sections else 0.0)
    share = sum(SHARES[s] for s in sections if s != "gpu-tests") or 1.0
    return {s: tests_s if s == "gpu-tests" else max(10.0, rest * SHARES[s] / share) for s in sections}


def device_info(smoke: bool) -> dict[str, str]:
    import torch

    from _machine import cpu_model

    cuda = torch.cuda.is_available() and not smoke
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU: {cpu_model()} (smoke run)",
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda) if cuda else "-",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def aims(rows: list[dict[str, Any]], info: dict[str, str]) -> list[str]:
    """The aims of issues 11, 12, 14 and 22 against the rows, one line each: met, NOT met or not measured."""

    def value(section: str, name: str, measure: str) -> float | None:
        for r in rows:
            if (r["section"], r["name"], r["measure"], r["status"] != "skipped") == (
                section,
                name,
                measure,
                True,
            ):
                return float(r["value"]) if r["value"] not in ("", None) else None
        return None

    def line(what: str, got: float | None, ok: bool, fmt: str = "{:,.0f}") -> str:
        verdict = "not measured" if got is None else ("met" if ok else "**NOT met**")
        return f"{what}: {'-' if got is None else fmt.format(got)} ({verdict})"

    h100 = "" if "H100" in info["device"] else " (the aim is set for one H100)"
    out = []
    for name in dict.fromkeys(r["name"] for r in rows if r["section"] == "embed" and r["name"][0] != "("):
        ratio = value("embed", name, "end2end/forward")
        out.append(
            line(f"{name} end2end / forward >= 0.8", ratio, ratio is not None and ratio >= 0.8, "{:.2f}")
        )
        if name in EMBED_AIMS:
            e2e = value("embed", name, "end2end")
            aim = EMBED_AIMS[name]
            out.append(
                line(f"{name} end to end >= {aim:,} tiles/s{h100}", e2e, e2e is not None and e2e >= aim)
            )
    passed = [r for r in rows if r["section"] == "gpu-tests" and r["measure"] == "passed"]
    if passed:
        out.append(f"gpu tests all pass: {passed[0]['value']} passed, {passed[0]['detail']} "
                   f"({'met' if passed[0]['status'] == 'ok' else '**NOT met**'})")  # fmt: skip
    for section, what in (("attention-1m", "forward"), ("train-1m", "fwd+bwd")):
        for r in rows:
            if r["section"] == section and r["name"].endswith("1,000,000 tokens"):
                ok = r["status"] == "ok"
                out.append(
                    f"{section} {r['name']} {what}: {r['value'] or '-'} s ({'met' if ok else r['status']})"
                )
    seq = [r for r in rows if r["section"] == "train-epoch" and r["name"].startswith("seqnorm")]
    if seq:
        got = float(seq[0]["value"]) if seq[0]["value"] != "" else None
        out.append(
            line(f"seqnorm epoch of 1,000 bags <= 30 s{h100}", got, got is not None and got <= 30, "{:.1f} s")
        )
    return out


def markdown(rows: list[dict[str, Any]], info: dict[str, str], total_s: float, command: str) -> str:
    lines = [
        f"`{command}` on **{info['device']}**, torch {info['torch']}, CUDA {info['cuda']}, {info['date']}; "
        f"{total_s:.0f} s in all. Random weights (speed does not depend on them); bf16 autocast on CUDA.",
        "",
        "| section | name | measure | value | unit | status | detail |",
        "|---|---|---|---:|---|---|---|",
    ]
    for r in rows:
        value = f"{r['value']:,}" if isinstance(r["value"], int | float) else str(r["value"])
        lines.append("| " + " | ".join([r["section"], r["name"], r["measure"], value, r["unit"], r["status"],
                                         r["detail"]]) + " |")  # fmt: skip
    lines += ["", "Aims:", ""] + [f"- {a}" for a in aims(rows, info)]
    return "\n".join(lines) + "\n"


def replace_marked(doc: Path, body: str) -> None:
    """Put body between the gpu-suite markers of doc (a section with markers is appended when there are
    none), atomically."""
    from wsi.core.files import write_text_atomic

    text = doc.read_text()
    block = f"{START}\n{body}{END}"
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n## GPU suite (`benchmarks/gpu_suite.py`)\n\n" + block + "\n"
    write_text_atomic(doc, text)


def write_outputs(rows: list[dict[str, Any]], out: Path, md: str) -> tuple[Path, Path]:
    from wsi.core.files import write_text_atomic

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(out / "gpu_suite.csv", buf.getvalue())
    write_text_atomic(out / "gpu_suite.md", md)
    return out / "gpu_suite.csv", out / "gpu_suite.md"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-suite-out"), help="folder for the CSV and table")
    p.add_argument("--docs", type=Path, default=None, help="replace the gpu-suite part of this markdown file")
    p.add_argument("--smoke", action="store_true", help="every section tiny, on the CPU (1-4 min)")
    p.add_argument("--budget-s", type=float, default=None, help="total seconds [GPU 360, smoke 600]")
    p.add_argument(
        "--tests-budget-s", type=float, default=None, help="gpu-tests seconds [30 with a junit, else 120]"
    )
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated [{','.join(SECTIONS)}]; or {','.join(EXTRA_SECTIONS)}")  # fmt: skip
    p.add_argument(
        "--gpu-tests-junit", type=Path, default=None, help="JUnit XML of `pytest -m gpu --junitxml`"
    )
    p.add_argument(
        "--fail", action="append", default=[], help="make this section fail (tests the report path)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--section-budget-s", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        junit = str(args.gpu_tests_junit or "")
        return _child(
            args.child, args.rows, args.smoke, junit, args.section_budget_s, args.child in args.fail
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(ALL_SECTIONS))
    if unknown:
        print(
            f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(ALL_SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    if args.docs and not args.docs.is_file():
        print(f"error: --docs {args.docs} does not exist; give the markdown file to update", file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA device; run on a GPU machine, or --smoke for the CPU check", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    total = args.budget_s or (600.0 if args.smoke else 360.0)
    tests_s = args.tests_budget_s or (30.0 if args.gpu_tests_junit else 120.0)
    plan_s = budgets(total, sections, tests_s)
    info = device_info(args.smoke)
    log.info("%s, torch %s, CUDA %s; budgets %s", info["device"], info["torch"], info["cuda"],
             {k: round(v) for k, v in plan_s.items()})  # fmt: skip
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, section in enumerate(sections):
        left = total - (time.perf_counter() - started)
        slack = max(0.0, left - sum(plan_s[s] for s in sections[i:]))  # seconds earlier sections left unused
        rows += run_section(section, args.out, max(10.0, min(left, plan_s[section] + slack)), args)
    command = "python benchmarks/gpu_suite.py" + (" --smoke" if args.smoke else "")
    md = markdown(rows, info, time.perf_counter() - started, command)
    csv_path, md_path = write_outputs(rows, args.out, md)
    if args.docs:
        replace_marked(args.docs, md)
        log.info("replaced the gpu-suite section of %s", args.docs)
    print(md)
    log.info("wrote %s and %s", csv_path, md_path)
    failed = [r for r in rows if r["status"].startswith(("failed", "timeout"))]
    if failed:
        log.error("%d row(s) failed or timed out: %s", len(failed),
                  "; ".join(f"{r['section']} {r['name']}: {r['status']}" for r in failed[:5]))  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
