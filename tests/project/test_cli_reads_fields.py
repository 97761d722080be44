"""The command line prints from a stage result's fields and never searches a result's text: a note or an
error is words for the user, and a summary built by finding words in it breaks when the words change."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "wsi" / "cli"
TEXT_FIELDS = {"note", "error", "reason", "message"}
SEARCHES = {"startswith", "endswith", "find", "rfind", "index", "rindex", "split", "rsplit", "partition",
            "rpartition", "count", "removeprefix", "removesuffix"}  # fmt: skip


def _is_text_field(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in TEXT_FIELDS


def _searches(tree: ast.AST) -> list[int]:
    """Lines where a result's text field is searched: `x in r.note`, `r.note.startswith(...)`, `re.x(..)`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if any(_is_text_field(side) for side in [node.left, *node.comparators]):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SEARCHES and _is_text_field(node.func.value):
                lines.append(node.lineno)
            is_re = isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
            if is_re and any(_is_text_field(arg) for arg in node.args):
                lines.append(node.lineno)
    return lines


def test_no_cli_module_searches_a_results_text() -> None:
    found = {}
    for path in sorted(CLI.glob("*.py")):
        lines = _searches(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[path.name] = lines
    assert found == {}, f"CLI modules that parse a result's text instead of reading its fields: {found}"


def test_the_check_sees_a_search() -> None:
    """Guard against a check that cannot fail: the forms the tile command used to use are caught."""
    code = (
        "for r in results:\n"
        "    if 'low yield' in r.note: pass\n"
        "    if r.note.startswith('check filter'): pass\n"
        "    m = re.search('x', r.error)\n"
        "    print(r.note)\n"  # printing is reading, not searching
    )
    assert _searches(ast.parse(code)) == [2, 3, 4]
