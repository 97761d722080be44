"""benchmarks/gpu_suite.py: sections fail alone (a row says why, the rest still runs), a section past its
budget is stopped, the table and CSV are written and the docs' marked part is replaced. The GPU figures
themselves come from the device run; here every section runs tiny on the CPU (--smoke)."""

from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

import pytest

from gpu_sections import SECTIONS, junit_rows
from gpu_suite import END, START, aims, budgets, main, replace_marked, run_section

REPO = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_gpu_decode" name="test_nvjpeg_tiles_equal_the_cpu_decode" time="1.0"/>
<testcase classname="tests.test_embed" name="test_cuda_embed" time="2.0"/>
<testcase classname="tests.test_train" name="test_cuda_train" time="1.0"><failure message="boom"/></testcase>
<testcase classname="tests.test_gpu_decode" name="test_other" time="0"><skipped message="needs x"/></testcase>
</testsuite></testsuites>"""


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_marked_part_of_the_docs_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", doc)
    before = doc.read_text()
    assert before.count(START) == 1 and before.count(END) == 1
    replace_marked(doc, "| a | b |\n")
    replace_marked(doc, "| new table |\n")  # a second run replaces the first
    after = doc.read_text()
    assert after.count(START) == 1 and "| a | b |" not in after
    assert f"{START}\n| new table |\n{END}" in after
    assert after.split(START)[0] == before.split(START)[0]  # everything above the markers unchanged
    bare = tmp_path / "bare.md"
    bare.write_text("# Benchmarks\n")
    replace_marked(bare, "T\n")
    assert bare.read_text().endswith(f"{START}\nT\n{END}\n") and bare.read_text().startswith("# Benchmarks\n")


def test_junit_report_becomes_a_row_and_all_skipped_on_a_gpu_is_a_failure(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(JUNIT)
    got: list[tuple] = []
    junit_rows(xml, lambda *row: got.append(row))
    (_, _, measure, passed, _, status, detail), = got  # fmt: skip
    assert (measure, passed, status) == ("passed", 2, "failed")
    assert "1 failed, 1 skipped" in detail and "test_cuda_train" in detail
    xml.write_text(JUNIT.replace('<failure message="boom"/>', '<skipped message="needs CUDA"/>').replace(
        'time="1.0"/>', 'time="0"><skipped message="needs CUDA"/></testcase>').replace(
        'time="2.0"/>', 'time="0"><skipped message="needs CUDA"/></testcase>'))  # fmt: skip
    got.clear()
    junit_rows(xml, lambda *row: got.append(row), cuda=True)
    junit_rows(xml, lambda *row: got.append(row), cuda=False)
    assert got[0][3] == 0 and got[0][5].startswith("failed: all skipped")
    assert got[1][5] == "skipped (no CUDA)"


def test_aims_are_judged_from_the_rows() -> None:
    def row(section: str, name: str, measure: str, value: object, status: str = "ok") -> dict:
        return {"section": section, "name": name, "measure": measure, "value": value, "status": status,
                "unit": "", "detail": ""}  # fmt: skip

    rows = [
        row("embed", "retccl", "end2end", 12_000.0), row("embed", "retccl", "end2end/forward", 0.93),
        row("embed", "uni", "end2end", 2_500.0), row("embed", "uni", "end2end/forward", 0.7, "below aim"),
        row("embed", "uni2-h", "end2end", "", "failed: OutOfMemoryError"),
        row("train-epoch", "seqnorm, 1000 bags", "s / epoch of 1,000 bags", 19.5),
        row("train-1m", "seqnorm 1,000,000 tokens", "fwd+bwd", "", "failed: oom"),
    ]  # fmt: skip
    text = "\n".join(aims(rows, {"device": "NVIDIA H100 80GB HBM3"}))
    assert "retccl end to end >= 10,000 tiles/s: 12,000 (met)" in text
    assert "retccl end2end / forward >= 0.8: 0.93 (met)" in text
    assert "uni end to end >= 3,000 tiles/s: 2,500 (**NOT met**)" in text
    assert "uni end2end / forward >= 0.8: 0.70 (**NOT met**)" in text
    assert "uni2-h end to end >= 1,000 tiles/s: - (not measured)" in text
    assert "seqnorm epoch of 1,000 bags <= 30 s: 19.5 s (met)" in text
    assert "train-1m seqnorm 1,000,000 tokens fwd+bwd: - s (failed: oom)" in text


def test_budgets_fit_the_total() -> None:
    plan = budgets(360.0, list(SECTIONS), 30.0)
    assert plan["gpu-tests"] == 30.0 and sum(plan.values()) == pytest.approx(360.0)
    assert max(plan, key=plan.__getitem__) == "embed"


def test_a_failing_section_is_a_row_and_the_others_still_run(tmp_path: Path) -> None:
    junit = tmp_path / "gpu-tests.xml"
    junit.write_text(JUNIT.replace('<failure message="boom"/>', ""))
    doc = tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", doc)
    out = tmp_path / "out"
    rc = main(["--smoke", "--sections", "train-epoch,gpu-tests", "--fail", "train-epoch",
               "--gpu-tests-junit", str(junit), "--out", str(out), "--docs", str(doc)])  # fmt: skip
    assert rc == 1
    rows = _rows(out / "gpu_suite.csv")
    assert [(r["section"], r["status"].split(":")[0]) for r in rows] == [
        ("train-epoch", "failed"),
        ("gpu-tests", "ok"),
    ]
    assert "failure injected" in rows[0]["status"] and rows[1]["value"] == "3"
    table = (out / "gpu_suite.md").read_text()
    assert "| train-epoch | (section) |" in table and "gpu tests all pass: 3 passed" in table
    assert table in doc.read_text()  # the same table went between the markers


def test_a_section_past_its_budget_is_stopped_with_a_row_saying_so(tmp_path: Path) -> None:
    args = argparse.Namespace(smoke=True, fail=[], gpu_tests_junit=None)
    rows = run_section("train-epoch", tmp_path, 2.0, args)  # the tiny epoch alone takes longer than 2 s
    assert rows[-1]["status"] == "timeout: stopped at its budget of 2 s"
    assert not list(tmp_path.glob(".rows-*"))


@pytest.mark.slow
def test_smoke_run_measures_every_section(tmp_path: Path) -> None:
    """One to four minutes on 2 shared cores (each section starts torch in fresh processes)."""
    rc = main(["--smoke", "--out", str(tmp_path)])
    rows = _rows(tmp_path / "gpu_suite.csv")
    assert rc == 0, rows
    by_section = {s: [r for r in rows if r["section"] == s] for s in SECTIONS}
    assert all(by_section.values()), by_section
    for section in ("train-epoch", "train-1m", "attention-1m", "embed"):
        assert all(r["status"] in ("ok", "below aim") and float(r["value"]) > 0 for r in by_section[section])
    assert {r["measure"] for r in by_section["embed"]} >= {"read", "forward", "end2end", "end2end/forward"}
    assert by_section["gpu-tests"][0]["status"] in ("ok", "skipped (no CUDA)")
    assert "| embed | timm:test_resnet | forward |" in (tmp_path / "gpu_suite.md").read_text()
