"""What installing torch brings: the default (PyPI's Linux wheel, CUDA libraries included) against PyTorch's
CPU-only wheel, each into a fresh virtual environment, side by side in one run.

For each variant: the wheels pip fetched (MB, which sets the download time at a given bandwidth), the
seconds `pip install` took here (from wherever pip's index is: a local mirror measures unpacking and
installing, not the network), the environment's size on disk, and the largest packages in it.

    python benchmarks/install_size.py                                  # torch from PyPI vs the CPU index
    python benchmarks/install_size.py --cpu 'torch==2.13.0+cpu --find-links /opt/wheels' \
        --default 'torch==2.14.1'                                      # a machine without the CPU index

Each variant's argument is what follows `pip install` (a requirement and pip options). Nothing of the
checkout is installed: the difference between the two is torch's own.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model  # benchmarks/_machine.py, beside this script

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure(name: str, spec: str, root: Path) -> dict[str, object]:
    """A fresh venv under `root`, the wheels of `spec` downloaded into it, then installed from them."""
    venv, wheels = root / name, root / f"{name}-wheels"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    args = shlex.split(spec)
    start = time.perf_counter()
    subprocess.run([py, "-m", "pip", "download", "-q", "-d", str(wheels), *args], check=True)
    fetched = time.perf_counter() - start
    start = time.perf_counter()
    reqs = [a for a in args if not a.startswith("-") and "/" not in a]
    offline = ["--no-index", "--find-links", str(wheels)]
    subprocess.run([py, "-m", "pip", "install", "-q", *offline, *reqs], check=True)
    installed = time.perf_counter() - start
    site = next((venv / "lib").glob("python3*/site-packages"))
    tops = sorted(((p.name, _size(p)) for p in site.iterdir() if p.is_dir()), key=lambda t: -t[1])[:4]
    cuda = subprocess.run([py, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return {
        "variant": name, "torch": cuda, "wheels_mb": _size(wheels) / 1e6, "fetch_s": fetched,
        "install_s": installed, "site_mb": _size(site) / 1e6,
        "largest": ", ".join(f"{n} {s / 1e6:,.0f}" for n, s in tops),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--default", default="torch", help="pip install arguments of the default route")
    parser.add_argument("--cpu", default=f"torch --index-url {CPU_INDEX}", help="... of the CPU-only route")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="install-size-") as tmp:
        rows = [measure("default", args.default, Path(tmp)), measure("cpu", args.cpu, Path(tmp))]
    print(f"# torch install, fresh venvs; {cpu_model()}\n")
    print("| route | torch (CUDA) | wheels fetched, MB | pip download, s | pip install, s | installed, MB "
          "| largest (MB) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['torch']} | {r['wheels_mb']:,.0f} | {r['fetch_s']:.0f} | "
              f"{r['install_s']:.0f} | {r['site_mb']:,.0f} | {r['largest']} |")  # fmt: skip


if __name__ == "__main__":
    main()
