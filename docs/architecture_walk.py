"""Follow one `wsi tile` run through the house: the files and the rooms its calls enter, in order.

A room is what docs/architecture_picture.py draws: a first-level package (wsi/slides, pipelines/tile)
or a module loose at a folder's top. A return is a call back into a file or room after the run had left
it for another. Imports (module bodies) are not counted, only calls. Measures a checkout (--repo) with
the `wsi` that Python imports, so run it with a venv installed from that checkout.

    .venv/bin/python docs/architecture_walk.py ../shared/data/slides/CMU-1-Small-Region.svs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

FOLDERS = ("wsi", "pipelines", "models")


def room(rel: Path) -> str:
    return "/".join(rel.parts[:2]) if len(rel.parts) > 2 else str(rel)


def entered(sequence: list[str]) -> tuple[int, int]:
    """(distinct places, returns to a place already left) of a sequence of places, repeats collapsed."""
    collapsed = [x for i, x in enumerate(sequence) if i == 0 or sequence[i - 1] != x]
    left: set[str] = set()
    back = 0
    for prev, x in zip([None, *collapsed], collapsed, strict=False):
        back += x in left
        if prev is not None:
            left.add(prev)
    return len(set(collapsed)), back


def walk(repo: Path, slide: Path) -> list[Path]:
    seq: list[Path] = []

    def seen(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        try:
            rel = Path(frame.f_code.co_filename).resolve().relative_to(repo)
        except ValueError:
            return
        if rel.parts[0] in FOLDERS and (not seq or seq[-1] != rel):
            seq.append(rel)

    from click.testing import CliRunner

    from wsi.cli.main import cli

    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(seen)
        threading.setprofile(seen)
        try:
            args = ["tile", str(slide), "--out", out, "--workers", "1", "--no-progress"]
            result = CliRunner().invoke(cli, args)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    if result.exit_code != 0:
        raise SystemExit(f"wsi tile failed: {result.output}")
    return seq


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("slide", type=Path)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    seq = walk(args.repo.resolve(), args.slide.resolve())
    files, file_back = entered([str(p) for p in seq])
    rooms, room_back = entered([room(p) for p in seq])
    print(f"files: {files} entered, {file_back} returns to a file already left")
    print(f"rooms: {rooms} entered, {room_back} returns to a room already left")
    print("rooms:", ", ".join(sorted({room(p) for p in seq})))


if __name__ == "__main__":
    main()
