"""Progress where stderr is not a terminal: whole log lines, at most every PLAIN_EVERY_S seconds and one
at the end, never a carriage return or a cursor escape (tqdm's nested bars wrote ESC[A into logs)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from cohorts import make_cohort, write_task

from wsi.cli.main import cli
from wsi.core import progress as bars


def test_a_bar_off_a_terminal_writes_plain_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bars, "is_terminal", lambda: False)
    monkeypatch.setattr(bars, "PLAIN_EVERY_S", 0.0)  # every update says so
    with caplog.at_level(logging.INFO, logger="wsi.progress"):
        got = list(bars.progress(range(4), desc="embed", unit="tile"))
        with bars.progress(total=10, desc="epochs (run)", unit="epoch") as bar:
            bar.update(3)
            bar.set_postfix({"loss": "0.693", "val_auroc": "n/a"})
            bar.update(2)
    assert got == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("embed: 1 of 4 tiles (25%), ") and " tiles/s, about " in lines[0]
    want = [f"embed: {k} of 4 tiles ({25 * k}%)" for k in (1, 2, 3, 4)]
    assert [line.split(",")[0] for line in lines[:4]] == want
    assert "done in" in lines[3] and "done in" not in lines[2]  # the last update is the closing line, once
    assert lines[-1].startswith("epochs (run): 5 of 10 epochs (50%)") and lines[-1].endswith(
        "; loss 0.693, val_auroc n/a"
    )
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_a_short_step_off_a_terminal_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bars, "is_terminal", lambda: False)
    with caplog.at_level(logging.INFO, logger="wsi.progress"):
        assert sum(bars.progress(range(100), desc="predict")) == 4950
    assert not caplog.records  # under PLAIN_EVERY_S: the stage's own summary line is enough


def test_a_terminal_still_gets_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm.std import tqdm

    monkeypatch.setattr(bars, "is_terminal", lambda: True)
    bar = bars.progress(total=3, desc="tile")
    try:
        assert isinstance(bar, tqdm)
    finally:
        bar.close()


def test_wsi_train_logged_to_a_file_holds_no_cursor_escapes(tmp_path: Path) -> None:
    """`wsi train` with its progress bars on (epochs, and each epoch's steps inside them), stderr not a
    terminal, as under nohup or a batch scheduler: the log has lines, not redraws."""
    cohort = make_cohort(tmp_path, n_patients=6)
    task = write_task(tmp_path / "task.yaml", epochs=3, patience=0)
    args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels),
            "--out", str(tmp_path / "run"), "--device", "cpu"]  # fmt: skip
    res = CliRunner().invoke(cli, args)  # stderr a captured stream: not a terminal
    assert res.exit_code == 0, res.output[-3000:]
    assert "test AUROC" in res.stderr  # the run talked
    assert "\x1b[" not in res.stderr and "\r" not in res.stderr, repr(res.stderr[:2000])
