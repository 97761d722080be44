"""The install says what it brings and offers PyTorch's CPU-only wheels: `make ... TORCH=cpu` installs
torch from that index before the package (without it, nothing changes), and the README gives the same
route by hand."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_with_torch_cpu_installs_torch_from_the_cpu_index_first(tmp_path: Path) -> None:
    def plan(*extra: str) -> list[str]:
        done = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}", *extra], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return done.stdout.splitlines()

    cpu = plan("TORCH=cpu")
    first = next(i for i, line in enumerate(cpu) if "pip install" in line)
    assert cpu[first].endswith(f"pip install -q torch torchvision --index-url {CPU_INDEX}")
    assert "-e '.[dev]'" in cpu[first + 1]  # the package after: torch is already there
    assert not any("--index-url" in line for line in plan())  # the default route is PyPI's, unchanged


def test_the_readme_says_what_the_install_brings_and_the_cpu_route() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    install = text[text.index("## Install") : text.index("## The two commands")]
    assert f"pip install torch torchvision --index-url {CPU_INDEX}" in install
    assert "make demo TORCH=cpu" in install and "GB" in install and "docs/benchmarks.md" in install
