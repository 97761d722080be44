"""`wsi view` draws the QC layer as the QC picture does (static/qc_style.js): kept and unreadable tiles as
outlines (the tissue in its own colours), every other rejected tile filled half transparent in its
reason's colour, the tissue outline dashed. Run in node where it is installed (the browser test draws it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from wsi.tiling.qc import FATE_RGB

STATIC = Path(__file__).resolve().parents[3] / "wsi" / "view" / "static"
NODE = shutil.which("node")


def test_the_page_loads_the_qc_style_before_the_viewer() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    assert 0 < page.index("/static/qc_style.js") < page.index("/static/viewer.js")
    viewer = (STATIC / "viewer.js").read_text(encoding="utf-8")
    assert 'name === "qc" ? qcStyle(' in viewer and "rgb(0,170,0)" not in viewer  # the old tinting green


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_qc_objects_are_styled_as_the_qc_picture_draws_them() -> None:
    cases = [
        ({"objectType": "tile"}, name, list(rgb)) for name, rgb in FATE_RGB.items() if ":" not in name
    ] + [({"objectType": "annotation"}, "Tissue", [0, 0, 0])]
    script = (
        f"const {{qcStyle}} = require({json.dumps(str(STATIC / 'qc_style.js'))});"
        f"const cases = {json.dumps(cases)};"
        "console.log(JSON.stringify(cases.map(([p, n, c]) => qcStyle(p, n, c))));"
    )
    done = subprocess.run([str(NODE), "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    styles = json.loads(done.stdout)
    by_name = {name: style for (_, name, _), style in zip(cases, styles, strict=True)}
    r, g, b = FATE_RGB["kept"]
    assert by_name["kept"] == {"stroke": f"rgb({r},{g},{b})", "width": 1, "dash": [], "dashStroke": None,
                               "fill": None}  # fmt: skip
    assert by_name["unreadable"]["fill"] is None
    for name in ("background", "blurry", "ink", "fold", "bubble", "border", "dust"):
        r, g, b = FATE_RGB[name]
        assert by_name[name]["fill"] == f"rgba({r},{g},{b},0.5)", name
        assert by_name[name]["stroke"] == f"rgb({r},{g},{b})", name
    tissue = by_name["Tissue"]
    assert tissue["dash"] and tissue["dashStroke"] == "rgb(255,255,255)" and tissue["fill"] is None
