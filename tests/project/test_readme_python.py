"""The README's Python example runs as written: the walk (tile with two workers, embed, train, predict)
as a plain script, without a `__main__` guard, in a folder laid out as `make demo` leaves it."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wsi.synthetic import write_sample_slide

REPO = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The ```python block of the README's "Using wsi from Python" section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Using wsi from Python") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "README.md: no ```python block under 'Using wsi from Python'"
    return found.group(1)


def _demo_out(root: Path, per_class: int = 6) -> None:
    """demo-out/ as `make demo` leaves it (pipelines.demo), smaller: slides/, labels.csv, new-slides/."""
    rows = ["slide,label,patient"]
    for i in range(2 * per_class):
        label, style = ("LUAD", "a") if i < per_class else ("LUSC", "b")
        write_sample_slide(root / "demo-out" / "slides" / f"DEMO-{i:02d}-{label}.svs", size_um=1024.0,
                           mpp=0.5, style=style, seed=i, texture="auto")  # fmt: skip
        rows.append(f"DEMO-{i:02d}-{label},{label},PATIENT-{i:02d}")
    (root / "demo-out" / "labels.csv").write_text("\n".join(rows) + "\n")
    for j, style in enumerate(("a", "b")):
        write_sample_slide(root / "demo-out" / "new-slides" / f"NEW-{j:02d}.svs", size_um=1024.0, mpp=0.5,
                           style=style, seed=500 + j, texture="auto")  # fmt: skip


def test_the_example_is_the_whole_walk() -> None:
    code = readme_example()
    for call in ("wsi.tile(", "wsi.embed(", "wsi.train(", "wsi.predict("):  # the front door
        assert call in code, call
    assert "__main__" not in code  # a plain script: no guard needed
    assert "workers=2" in code  # the case a guard used to be needed for


@pytest.mark.slow  # the four stages in a fresh Python, a local dask cluster among them (~1-2 min on 2 cores)
def test_the_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    _demo_out(tmp_path)
    script = tmp_path / "walk.py"
    script.write_text(readme_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Nanny failed" not in done.stderr and "Traceback" not in done.stderr
    printed = done.stdout.splitlines()
    assert printed[0].startswith("test AUROC "), done.stdout
    with (tmp_path / "walk" / "preds" / "predictions.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["slide"] for r in rows] == ["NEW-00", "NEW-01"]
    for row, line in zip(rows, printed[1:], strict=True):
        assert line == f"{row['slide']} {row['predicted']} p(LUSC) {float(row['prob_LUSC']):.3f}"
    assert (tmp_path / "walk" / "model" / "report.html").is_file()
    assert len(list((tmp_path / "walk" / "features" / "retccl").glob("*.h5"))) == 12
    assert (tmp_path / "walk" / "preds" / "top_tiles" / "index.csv").is_file()
