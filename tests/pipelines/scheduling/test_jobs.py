"""The batch runner: failures become rows, order is kept, dask gives what inline gives."""

from __future__ import annotations

import csv
import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed import WorkerPlugin

from wsi.core.errors import SlideError
from wsi.pipelines.scheduling.cluster import close_local_cluster, start_local_cluster
from wsi.pipelines.scheduling.jobs import (
    JobsInterrupted,
    read_manifest,
    run_jobs,
    worker_plugin,
    write_manifest,
)
from wsi.pipelines.scheduling.results import JobResult, RunSummary


@dataclass(frozen=True)
class Item:
    slide_id: str
    path: str


def square(item: Item) -> JobResult:
    if item.slide_id == "bad":
        raise SlideError(f"{item.path}: not a slide")
    if item.slide_id == "oops":
        raise ZeroDivisionError("division by zero")
    return JobResult(item.slide_id, item.path, "ok", n=int(item.slide_id) ** 2)


def not_a_result(item: Item) -> int:
    return 1


class Counter(WorkerPlugin):
    """A worker plugin: set up once per worker, shared by every item on it (and by the threads that run
    items at once, so it counts under a lock, as a real shared plugin must: a bare `calls += 1` and a
    later read let two threads both see 2)."""

    name = "counter"

    def setup(self, worker: object) -> None:
        self.pid = os.getpid()
        self.calls = 0
        self.lock = threading.Lock()

    def teardown(self, worker: object) -> None:
        pass

    def count(self) -> int:
        with self.lock:
            self.calls += 1
            return self.calls


def uses_plugin(item: Item) -> JobResult:
    plugin = worker_plugin("counter")
    return JobResult(item.slide_id, str(plugin.pid), "ok", n=plugin.count())


ITEMS = [Item("2", "a"), Item("bad", "b.svs"), Item("3", "c"), Item("oops", "d")]


def test_inline_failures_are_rows_in_order() -> None:
    results = run_jobs(ITEMS, square)
    assert [r.slide_id for r in results] == ["2", "bad", "3", "oops"]
    assert [r.status for r in results] == ["ok", "failed", "ok", "failed"]
    assert [r.n for r in results] == [4, 0, 9, 0]
    assert results[1].error == "b.svs: not a slide"
    assert results[3].error == "ZeroDivisionError: division by zero"
    assert all(r.seconds >= 0 for r in results)
    assert run_jobs([], square) == []
    assert run_jobs([Item("1", "a")], not_a_result)[0].error.startswith("TypeError: batch function")


def test_inline_plugin_set_up_once() -> None:
    results = run_jobs([Item(str(i), "x") for i in range(3)], uses_plugin, worker_plugin=Counter())
    assert [r.n for r in results] == [1, 2, 3]
    with pytest.raises(KeyError):
        worker_plugin("counter")


def meets_the_other(barrier: threading.Barrier, item: Item) -> JobResult:
    """Waits for a second item to be running too: only items run at the same time get past it."""
    barrier.wait()
    return square(item)


def test_inline_at_once_runs_items_together_with_the_same_rows_in_order() -> None:
    """at_once=2 (the tile stage in one process): two items really run together, failures are rows, the
    order and the values are those of one at a time, and the batch's plugin reaches every thread."""
    items = [Item("2", "a"), Item("bad", "b.svs"), Item("3", "c"), Item("oops", "d"), Item("5", "e")]
    one = run_jobs(items, square)
    two = run_jobs(items, square, at_once=2)
    assert [(r.slide_id, r.status, r.n, r.error) for r in two] == [
        (r.slide_id, r.status, r.n, r.error) for r in one
    ]
    pair = items[:2]
    together = run_jobs(pair, functools.partial(meets_the_other, threading.Barrier(2, timeout=30)), at_once=2)
    assert [r.status for r in together] == ["ok", "failed"] and together[1].error == "b.svs: not a slide"
    in_turn = run_jobs(pair, functools.partial(meets_the_other, threading.Barrier(2, timeout=0.2)), at_once=1)
    assert all(r.error.startswith("BrokenBarrierError") for r in in_turn)  # one at a time: nobody met
    counted = run_jobs([Item(str(i), "x") for i in range(4)], uses_plugin, worker_plugin=Counter(), at_once=2)
    assert sorted(r.n for r in counted) == [1, 2, 3, 4] and len({r.path for r in counted}) == 1


def ctrl_c_at_two(item: Item) -> JobResult:
    if item.slide_id == "2":
        raise KeyboardInterrupt  # what Ctrl-C raises in the main thread, here from the item itself
    return square(item)


@pytest.mark.parametrize("at_once", [1, 2])
def test_ctrl_c_hands_back_the_rows_of_the_items_that_finished(at_once: int) -> None:
    """A stage writes its manifest from these before it stops: the items done are there with their real
    rows, the one interrupted and those never started are None, in the order of the items."""
    items = [Item(str(i), f"s{i}.svs") for i in range(20)]
    with pytest.raises(JobsInterrupted) as stop:
        run_jobs(items, ctrl_c_at_two, at_once=at_once, progress=False)
    finished = stop.value.finished
    assert isinstance(stop.value, KeyboardInterrupt) and len(finished) == len(items)
    done = [(r.slide_id, r.status, r.n) for r in finished[:2] if r is not None]
    assert done == [("0", "ok", 0), ("1", "ok", 1)]
    assert finished[2] is None and all(r is None for r in finished[5:])  # no item starts after the stop
    for item, row in zip(items, finished, strict=True):  # at_once=2: item 3 or 4 may have been running
        assert row is None or (row.slide_id, row.n) == (item.slide_id, int(item.slide_id) ** 2)


@pytest.mark.slow
def test_dask_local_cluster_matches_inline() -> None:
    items = [*ITEMS, Item("5", "e")]
    inline = run_jobs(items, square)
    distributed = run_jobs(items, square, workers=2)
    key = lambda rs: [(r.slide_id, r.status, r.n, r.error) for r in rs]  # noqa: E731
    assert key(distributed) == key(inline)
    # on an existing cluster (--scheduler ADDRESS), a plugin is set up once per worker process
    cluster = start_local_cluster(2)
    try:
        items6 = [Item(str(i), "x") for i in range(6)]
        with_plugin = run_jobs(
            items6, uses_plugin, scheduler=cluster.scheduler_address, worker_plugin=Counter()
        )
    finally:
        close_local_cluster(cluster)
    per_pid: dict[str, list[int]] = {}
    for r in with_plugin:
        per_pid.setdefault(r.path, []).append(r.n)
    assert str(os.getpid()) not in per_pid
    assert sum(len(v) for v in per_pid.values()) == 6
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in per_pid.values())


class SlowToStop:
    """What dask's LocalCluster.close() does when a worker outlives the nanny's wait on a loaded machine."""

    closed = False

    def close(self) -> None:
        self.closed = True
        raise TimeoutError()


def test_a_local_cluster_slow_to_stop_is_a_warning_not_a_failed_run(caplog: pytest.LogCaptureFixture) -> None:
    cluster = SlowToStop()
    with caplog.at_level("WARNING", logger="wsi.pipelines.scheduling.jobs"):
        close_local_cluster(cluster)  # returns: the run's results are in
    assert cluster.closed and "did not shut down in time (TimeoutError)" in caplog.text


def test_manifest_columns_and_merge(tmp_path: Path) -> None:
    path = tmp_path / "tiles" / "manifest.csv"
    write_manifest(path, run_jobs(ITEMS, square))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["slide", "path", "status", "tiles", "seconds", "error", "note"]
    assert [(r["slide"], r["status"], r["tiles"]) for r in rows] == [
        ("2", "ok", "4"), ("bad", "failed", "0"), ("3", "ok", "9"), ("oops", "failed", "0"),
    ]  # fmt: skip
    assert rows[1]["error"] == "b.svs: not a slide"
    # a later run over one slide replaces its row and keeps the others
    write_manifest(path, [JobResult("bad", "b.svs", "ok", n=7)])
    merged = {r.slide_id: r for r in read_manifest(path)}
    assert merged["bad"].status == "ok" and merged["bad"].n == 7 and merged["2"].n == 4
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.csv"]


def test_a_refused_duplicate_keeps_the_first_slides_manifest_row(tmp_path: Path) -> None:
    """Refusing a second slide whose id is taken must not erase the first slide's record."""
    from wsi.pipelines.scheduling.jobs import read_manifest, write_manifest
    from wsi.pipelines.scheduling.results import JobResult

    manifest = tmp_path / "manifest.csv"
    write_manifest(manifest, [JobResult("s1", "/a/s1.svs", "ok", n=5)])
    write_manifest(manifest, [JobResult("s1", "/b/s1.svs", "failed", error="id taken by /a/s1.svs")])
    rows = {(r.path, r.status) for r in read_manifest(manifest)}
    assert rows == {("/a/s1.svs", "ok"), ("/b/s1.svs", "failed")}
    # the same file failing now does replace its own row
    write_manifest(manifest, [JobResult("s1", "/a/s1.svs", "failed", error="truncated")])
    assert {(r.path, r.status) for r in read_manifest(manifest)} == {
        ("/a/s1.svs", "failed"),
        ("/b/s1.svs", "failed"),
    }


def test_a_manifest_written_before_the_note_column_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "manifest.csv"
    path.write_text("slide,path,status,tiles,seconds,error\ns1,/a/s1.svs,ok,12,1.500,\n")
    (old,) = read_manifest(path)
    assert (old.slide_id, old.status, old.n, old.note) == ("s1", "ok", 12, "")
    write_manifest(path, [JobResult("s2", "/a/s2.svs", "ok", n=3, note="no heatmap")])
    with path.open(newline="") as fh:
        rows = {r["slide"]: r for r in csv.DictReader(fh)}
    assert rows["s1"]["note"] == "" and rows["s2"]["note"] == "no heatmap" and rows["s1"]["tiles"] == "12"


def test_no_progress_draws_no_bar(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wsi predict --no-progress` on raw slides still drew the tile stage's bar: it reaches run_jobs."""
    from wsi.core import progress as bars

    monkeypatch.setattr(bars, "is_terminal", lambda: True)  # a live bar (off a terminal: plain lines)
    items = [Item(str(i), str(i)) for i in range(3)]
    run_jobs(items, square, desc="tile", progress=False)
    assert "tile:" not in capsys.readouterr().err
    run_jobs(items, square, desc="tile")
    assert "tile:" in capsys.readouterr().err  # the default draws it


def test_tile_slides_pass_progress_on(sample_slide, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides

    tile_slides(find_slides([sample_slide.path]), out_dir=tmp_path / "o", progress=False)
    assert "tile:" not in capsys.readouterr().err


def test_summary_rate_keeps_its_digits_below_ten_per_second() -> None:
    results = [JobResult(str(i), str(i), "ok", n=1) for i in range(5)]
    slow = RunSummary.of(results, 20.8).line("predict", unit="images")
    assert slow.endswith("5 images in 20.8 s (0.24 images/s)")
    assert RunSummary.of(results, 0.25).line("tile", unit="tiles").endswith("5 tiles in 0.2 s (20 tiles/s)")


def test_summary_counts_one_slide_in_the_singular() -> None:
    one = RunSummary.of([JobResult("a", "a.svs", "ok", n=3)], 0.0)
    assert one.line("tile", unit="tiles").startswith("tile: 1 slide: 1 ok, 0 skipped, 0 failed; 3 tiles")
    two = RunSummary.of([JobResult("a", "a.svs", "ok"), JobResult("b", "b.svs", "skipped")], 0.0)
    assert two.line("tile", noun="images").startswith("tile: 2 images: 1 ok")


def test_the_tile_stage_log_line_counts_tiles_kept_not_items(
    sample_slide, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A library call's closing line names what it counted in the command's words: "N tiles kept"
    (then "N tiles" from embed), never "N items"."""
    import logging

    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides

    with caplog.at_level(logging.INFO, logger="wsi"):
        results = tile_slides(find_slides([sample_slide.path]), out_dir=tmp_path / "o", progress=False)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("tile: 1 slide"))
    assert "1 tiled, 0 already done, 0 failed" in line, line
    assert f"; {results[0].n} tiles kept" in line and "items" not in line, line


def test_a_library_call_whose_every_slide_fails_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A script's `tile_slides(...)` whose slides all fail used to return rows with status 'failed' and
    say nothing; each failure is now a warning with its reason (Python shows warnings even where no
    logging is set up), and one error line says none succeeded, as the CLI's summary does."""
    import logging

    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import SlideSource

    bad = []
    for name in ("junk-a", "junk-b"):
        path = tmp_path / f"{name}.svs"
        path.write_bytes(b"not a slide at all")
        bad.append(SlideSource(slide_id=name, path=path, mpp=None))
    with caplog.at_level(logging.WARNING, logger="wsi"):
        results = tile_slides(bad, out_dir=tmp_path / "run", progress=False)
    assert [r.status for r in results] == ["failed", "failed"]
    said = {r.getMessage(): r.levelno for r in caplog.records}
    for r in results:
        assert r.error and said.get(f"tile: {r.slide_id} failed: {r.error}") == logging.WARNING, said
    none = "tile: none of the 2 slide(s) succeeded (reasons above, and in the rows and the manifest)"
    assert said.get(none) == logging.ERROR, said


@pytest.mark.slow  # a local dask cluster in a fresh Python
def test_a_plain_script_without_a_main_guard_runs_workers(sample_slide, tmp_path: Path) -> None:
    """`workers=2` at a script's top level, no `if __name__ == "__main__":`: dask's spawn re-ran the
    script in each worker, which started a cluster of its own ("Nanny failed to start"); the workers now
    start without the caller's script and the call tiles the slides."""
    import shutil
    import subprocess
    import sys

    for name in ("one", "two"):
        shutil.copy(sample_slide.path, tmp_path / f"{name}.svs")
    script = tmp_path / "walk.py"
    script.write_text(
        "from wsi.pipelines.tile.stage import tile_slides\n"
        "from wsi.slides.sources import find_slides\n"
        f"rows = tile_slides(find_slides([{str(tmp_path)!r}]), out_dir={str(tmp_path / 'run')!r},\n"
        "                   workers=2, progress=False)\n"
        "print('STATUS', sorted((r.slide_id, r.status) for r in rows))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STATUS [('one', 'ok'), ('two', 'ok')]" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "Nanny failed" not in done.stderr
