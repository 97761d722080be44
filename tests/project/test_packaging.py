"""The wheel installs one import name, `wsi`, with the repository's top folders mapped under it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """Built from a copy of what the build reads: setuptools writes build/ and wsi.egg-info/ into the
    source folder whatever the working folder, so building the checkout itself would leave them there,
    and two pytest-xdist workers each building it at once collide ("File exists: build/bdist...")."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    folders = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["wsi"]
    for folder in folders["package-folders"].values():
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out)],
        capture_output=True, text=True, cwd=source, env={"PIP_NO_INDEX": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{result.stdout}\n{result.stderr}")
    return zipfile.ZipFile(next(out.glob("wsi-*.whl")))


def test_the_wheel_installs_wsi_only(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"wsi"}, f"top-level names besides wsi: {sorted(top - {'wsi'})}"
    meta = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(meta).decode().split() == ["wsi"]


def test_every_folder_lands_under_its_package(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    folders = pyproject["tool"]["wsi"]["package-folders"]
    for package, folder in folders.items():
        for path in (REPO / folder).rglob("*.py"):
            target = "/".join([*package.split("."), *path.relative_to(REPO / folder).parts])
            assert target in names, f"{path.relative_to(REPO)} is missing from the wheel as {target}"
    for yaml_file in (REPO / "configs").rglob("*.yaml"):  # presets and tasks travel as package data
        assert "wsi/configs/" + yaml_file.relative_to(REPO / "configs").as_posix() in names
    assert "wsi/py.typed" in names
