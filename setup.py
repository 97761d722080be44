"""Package layout: the repository keeps wsi/, models/, pipelines/ and configs/ at its top (the owner's
wish), and they install under one import name, `wsi` (wsi.models, wsi.pipelines, wsi.configs), so no
other package's `models` can shadow ours. The mapping is pyproject.toml's [tool.wsi.package-folders];
everything else is declared there too."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
ROOTS: dict[str, str] = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["wsi"][
    "package-folders"
]

packages: list[str] = []
for name, folder in ROOTS.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(str(HERE / folder)))]

setup(packages=packages, package_dir=ROOTS)
