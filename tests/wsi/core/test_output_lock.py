"""One writer per output folder: a second process is refused with the holder named; stale locks are taken
over; two tile runs at once with different settings leave a manifest that agrees with the tile files."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.core.output_lock import LOCK_NAME, OutputLockedError, output_lock, read_holder

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from wsi.core.output_lock import output_lock
    with output_lock(sys.argv[1], "wsi tile slides/ --out X"):
        print("held", flush=True)
        sys.stdin.readline()   # hold until the test says so (or is killed)
    """
)


def _hold(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0


def test_second_process_gets_the_holders_name(tmp_path: Path) -> None:
    proc = _hold(tmp_path / "out")
    try:
        holder = read_holder(tmp_path / "out")
        assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        with pytest.raises(OutputLockedError) as err, output_lock(tmp_path / "out"):
            pass
        message = str(err.value)
        assert f"pid {proc.pid} on {socket.gethostname()}" in message
        assert "wsi tile slides/ --out X" in message and "another --out" in message
    finally:
        _release(proc)
    assert not (tmp_path / "out" / LOCK_NAME).exists()  # released: nothing left behind
    with output_lock(tmp_path / "out"):  # and free again
        assert read_holder(tmp_path / "out")["pid"] == os.getpid()


def test_cli_second_writer_exit_2_without_traceback(make_slide, tmp_path: Path) -> None:
    slide = make_slide(name="lock", size_um=512.0, mpp=0.5, seed=3)
    proc = _hold(tmp_path / "out")
    try:
        result = CliRunner().invoke(cli, ["tile", str(slide.path), "--out", str(tmp_path / "out")])
    finally:
        _release(proc)
    assert result.exit_code == 2, result.output
    assert "is in use by another wsi command" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "tiles").exists()  # nothing written by the refused run


def test_killed_holder_lock_is_taken_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = _hold(tmp_path / "out")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "out" / LOCK_NAME).exists()  # a kill leaves the file, with a dead pid in it
    with caplog.at_level(logging.INFO, logger="wsi.core.output_lock"), output_lock(tmp_path / "out"):
        assert read_holder(tmp_path / "out")["pid"] == os.getpid()
    assert f"pid {proc.pid}" in caplog.text and "not running" in caplog.text


def test_stale_record_without_flock_support(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system has no flock, the recorded pid decides: a dead one on this host is taken
    over, a live one refuses."""
    import wsi.core.output_lock as lock

    monkeypatch.setattr(lock, "_flock", lambda fd: None)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    folder = tmp_path / "out"
    folder.mkdir()
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": 1.0, "command": "wsi embed"}
    (folder / LOCK_NAME).write_text(json.dumps(record))
    with output_lock(folder):
        pass
    alive = _hold(tmp_path / "other")  # a live process on this host
    try:
        record["pid"] = alive.pid
        (folder / LOCK_NAME).write_text(json.dumps(record))
        with pytest.raises(OutputLockedError, match=f"pid {alive.pid}"), output_lock(folder):
            pass
    finally:
        _release(alive)


def test_same_process_nests(tmp_path: Path) -> None:
    with output_lock(tmp_path), output_lock(tmp_path / "."):
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


_TILE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import SlideSource
    from wsi.tiling.grid import TileParams
    from wsi.core.errors import WsiError
    try:
        tile_slides([SlideSource("s", Path(sys.argv[1]))], out_dir=sys.argv[2],
                    params=TileParams(tile_um=float(sys.argv[3]), tile_px=64))
        print("tiled")
    except WsiError as exc:
        print("refused:", exc)
    """
)


def test_two_tile_runs_at_once_leave_one_consistent_record(make_slide, tmp_path: Path) -> None:
    from wsi.formats.tile_file import read_tile_file
    from wsi.pipelines.scheduling.jobs import read_manifest

    slide = make_slide(name="race", size_um=1024.0, mpp=0.5, seed=4)
    out = tmp_path / "out"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TILE, str(slide.path), str(out), um], stdout=subprocess.PIPE, text=True
        )
        for um in ("64", "128")
    ]
    said = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), said
    assert any("tiled" in s for s in said), said
    for text in said:  # each either tiled alone or was told who holds the folder
        assert "tiled" in text or "in use by another wsi command" in text
    rows = read_manifest(out / "tiles" / "manifest.csv")
    assert len(rows) == 1 and rows[0].status == "ok"
    assert rows[0].n == len(read_tile_file(out / "tiles" / "s.h5"))  # the manifest agrees with the file


def test_a_holder_record_of_the_wrong_types_is_read_without_them(tmp_path: Path) -> None:
    """The lock file is anyone's to write: values of the wrong type are left out, never trusted."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).write_text('{"pid": "12", "host": 7, "started": 1.5, "command": ["x"]}')
    assert read_holder(tmp_path / "out") == {"started": 1.5}
    with output_lock(tmp_path / "out"):  # nobody holds it: taken over
        assert read_holder(tmp_path / "out")["pid"] == os.getpid()
