"""docs/architecture.md stays true: every package and module is on it, its format versions are the
code's, and no file grows past what one can read in a sitting (400 lines)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
FOLDERS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["wsi"][
    "package-folders"
]
MAX_LINES = 400


def _tree() -> str:
    start = DOC.index("## The tree")
    return DOC[start : DOC.index("```\n\n", DOC.index("```", start) + 3)]


def _section(tree: str, folder: str) -> str:
    """The lines of the tree from `folder/` (at the left margin) to the next top-level folder."""
    lines = tree.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.startswith(f"{folder}/"))
    end = next((i for i in range(begin + 1, len(lines)) if re.match(r"^[a-z]\w*/", lines[i])), len(lines))
    return "\n".join(lines[begin:end])


@pytest.mark.parametrize("folder", sorted(set(FOLDERS.values()) - {"configs"}))
def test_every_package_and_module_is_on_the_page(folder: str) -> None:
    section = _section(_tree(), folder)
    missing = []
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO / folder)
        for package in rel.parts[:-1]:  # each package folder on the way down is named with its slash
            if f"{package}/" not in section:
                missing.append(f"{folder}/{'/'.join(rel.parts[:-1])}/ (package)")
        if path.name != "__init__.py" and not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", section):
            missing.append(f"{folder}/{rel}")
    assert not missing, "docs/architecture.md does not name: " + ", ".join(sorted(set(missing)))


def _versions_on_page() -> dict[str, int]:
    table = DOC[DOC.index("## Formats") :]
    rows = re.findall(r"^\|[^|\n]+\|[^|\n]+\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|$", table, flags=re.M)
    return {owner: int(version) for version, owner in rows}


def _module_of(owner: str) -> str:
    """`pipelines/runs/record.py` -> `wsi.pipelines.runs.record`, by the package-folder table."""
    folder, _, rest = owner.partition("/")
    package = next(p for p, f in FOLDERS.items() if f == folder)
    return ".".join([package, *Path(rest).with_suffix("").parts])


def test_format_versions_on_the_page_are_the_codes() -> None:
    """Every module that versions a file format has a row, and the row's version is the code's."""
    import importlib

    on_page = _versions_on_page()
    declared = sorted(
        str(path.relative_to(REPO))
        for folder in FOLDERS.values()
        for path in (REPO / folder).rglob("*.py")
        if re.search(r"^FORMAT_VERSION = \d+", path.read_text(encoding="utf-8"), flags=re.M)
    )
    assert sorted(on_page) == declared, "the Formats table must list every module with a FORMAT_VERSION"
    for owner, version in on_page.items():
        assert version == importlib.import_module(_module_of(owner)).FORMAT_VERSION, owner


def test_no_file_over_400_lines() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    paths = [REPO / p for p in tracked if (REPO / p).is_file()] or list(REPO.glob("*/**/*.py"))
    counts = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    long = {path: n for path, n in counts.items() if n > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by idea): {long}"


def test_the_checks_can_fail() -> None:
    assert "wsi/tiling/params.py" not in _section(_tree(), "models")
    with pytest.raises(StopIteration):
        _section(_tree(), "nonexistent")
