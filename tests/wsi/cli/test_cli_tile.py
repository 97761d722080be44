"""`wsi tile` through click's CliRunner, and the installed console script once as a real process."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli


@pytest.fixture(scope="module")
def slides(make_slide, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with two small generated slides."""
    folder = tmp_path_factory.mktemp("cli-slides")
    for i in range(2):
        sample = make_slide(name=f"cli-{i}", size_um=1024.0, mpp=0.5, seed=10 + i)
        shutil.copy(sample.path, folder / f"case-{i}.svs")
    return folder


def _run(*args: str):
    return CliRunner().invoke(cli, ["tile", *args], catch_exceptions=False)


def _manifest(out: Path) -> list[dict[str, str]]:
    with open(out / "tiles" / "manifest.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_folder_then_rerun(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _run(str(slides), "--out", str(out), "--tile-um", "128", "--tile-px", "64", "--save-tiles")
    assert result.exit_code == 0, result.output
    assert "2 slides: 2 tiled, 0 already done, 0 failed" in result.stderr
    assert sorted(p.name for p in (out / "tiles").iterdir()) == [
        "case-0.h5", "case-0.zarr", "case-1.h5", "case-1.zarr", "manifest.csv",
    ]  # fmt: skip
    qc = sorted(p.name for p in (out / "qc").iterdir())
    assert qc == ["case-0.geojson", "case-0.png", "case-1.geojson", "case-1.png"]
    assert [row["status"] for row in _manifest(out)] == ["ok", "ok"]
    again = _run(str(slides), "--out", str(out), "--tile-um", "128", "--tile-px", "64", "--save-tiles")
    assert again.exit_code == 0 and "0 tiled, 2 already done" in again.stderr


def test_failure_exit_code_and_manifest(slides: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.svs"
    bad.write_text("not a slide")
    out = tmp_path / "run"
    result = _run(str(slides / "case-0.svs"), str(bad), "--out", str(out))
    assert result.exit_code == 1
    assert "1 failed" in result.stderr and "failed bad:" in result.stderr
    rows = {row["slide"]: row for row in _manifest(out)}
    assert rows["bad"]["status"] == "failed" and "bad.svs" in rows["bad"]["error"]
    assert rows["case-0"]["status"] == "ok" and int(rows["case-0"]["tiles"]) > 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    result = _run(str(empty), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "no slide files found" in result.stderr
    result = _run(str(tmp_path / "nope.svs"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "nope.svs" in result.stderr and "Traceback" not in result.output
    listing = tmp_path / "list.csv"
    listing.write_text("file\na.svs\n")
    result = _run(str(listing), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "`path` column" in result.stderr
    listing.write_text("path,mpp\nx, y.svs,0.5\n")  # an unquoted comma in a path
    result = _run(str(listing), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "line 2" in result.stderr and "quote" in result.stderr
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.svs").write_bytes(b"1")
    (tmp_path / "b" / "x.svs").write_bytes(b"2")
    result = _run(str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "share one slide id" in result.stderr and "slide_id" in result.stderr
    listing.write_text("path,mpp\na/x.svs,fast\n")
    result = _run(str(listing), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "line 2" in result.stderr and "'fast'" in result.stderr
    assert not (tmp_path / "o").exists()  # nothing ran


def test_mpp_option_for_slide_without_metadata(shared_data: Path, tmp_path: Path) -> None:
    slide = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    refused = _run(str(slide), "--out", str(tmp_path / "a"))
    assert refused.exit_code == 1 and "--mpp" in refused.stderr
    result = _run(str(slide), "--out", str(tmp_path / "b"), "--mpp", "0.25", "--backend", "tiffslide")
    assert result.exit_code == 0, result.stderr
    assert int(_manifest(tmp_path / "b")[0]["tiles"]) > 0


def test_console_script_help() -> None:
    script = Path(sys.executable).with_name("wsi")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    top = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0 and "tile" in top.stdout
    sub = subprocess.run([str(script), "tile", "--help"], capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0
    for text in ("--tile-um", "--scheduler", "--save-tiles", "Examples:", "manifest.csv"):
        assert text in sub.stdout


def test_bad_option_values_on_real_slides_exit_2(slides: Path, tmp_path: Path) -> None:
    result = _run(str(slides), "--out", str(tmp_path / "o"), "--tile-px", "2")
    assert result.exit_code == 2 and "tile-px" in result.output
    result = _run(
        str(slides), "--out", str(tmp_path / "o"), "--workers", "2", "--scheduler", "not-an-address"
    )
    assert result.exit_code == 2 and "not-an-address" in result.stderr and "tcp://" in result.stderr
    assert "Traceback" not in result.output


def test_options_carry_the_configs_ranges(slides: Path, tmp_path: Path) -> None:
    """The tissue settings' own range (min_saturation in [0, 1)) refuses the option: a clean usage error
    naming it, before anything runs."""
    result = _run(str(slides), "--out", str(tmp_path / "o"), "--min-saturation", "1")
    assert result.exit_code == 2 and "--min-saturation" in result.stderr
    assert "0<=x<1" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()  # nothing ran


def test_help_imports_no_command_and_no_torch() -> None:
    """`wsi --help` and `wsi tile --help` stay instant: no command module but the one asked, no torch."""
    code = (
        "import sys\n"
        "from wsi.cli.main import cli\n"
        "for args in (['--help'], ['tile', '--help']):\n"
        "    try:\n"
        "        cli(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    if args == ['--help']:\n"
        "        assert not [m for m in sys.modules if m.startswith('wsi.cli.') and m != 'wsi.cli.main']\n"
        "assert 'torch' not in sys.modules and 'pipelines' not in sys.modules, 'heavy import'\n"
        "assert 'wsi.cli.embed' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "make-slides" in done.stdout and "--tile-um" in done.stdout


def test_command_table_matches_the_command_modules() -> None:
    """Every entry of the lazy table resolves to a click command of that name."""
    from wsi.cli.main import COMMANDS, load_command

    for name in COMMANDS:
        command = load_command(name)
        assert command.name == name, (name, command.name)


def test_unwritable_out_is_a_usage_error_before_any_work(slides: Path, tmp_path: Path) -> None:
    """--out under a regular file cannot be created, for root too: exit 2, folder and fix named."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = _run(str(slides), "--out", str(blocker / "sub"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(blocker / "sub") in result.stderr and "a-file is a file" in result.stderr


def test_read_only_out_is_a_usage_error(slides: Path, tmp_path: Path) -> None:
    import os
    import stat

    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = out / "probe"
        try:
            probe.write_text("x")  # root (and some file systems) ignore the mode bits
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip(f"uid {os.getuid()} can write into a read-only folder; see the test above")
        result = _run(str(slides), "--out", str(out))
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert str(out) in result.stderr and "cannot write" in result.stderr and "chmod" in result.stderr
    finally:
        out.chmod(stat.S_IRWXU)


def test_write_probe_failure_is_reported_even_as_root(
    slides: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a read-only folder does for a normal user, simulated where the mode bits cannot (root)."""

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("wsi.cli._common.tempfile.NamedTemporaryFile", refuse)
    result = _run(str(slides), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "cannot write into the folder (Permission denied)" in result.stderr and "chmod" in result.stderr
    assert not list((tmp_path / "o").iterdir())  # no slide was tiled


def test_ctrl_c_says_how_to_go_on(slides: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not click's bare `Aborted!`: what was kept and the command that goes on, exit 130."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("wsi.pipelines.tile.stage.tile_slides", interrupted)
    result = _run(str(slides), "--out", str(tmp_path / "o"))
    assert result.exit_code == 130 and "Aborted" not in result.output
    assert "wsi tile: interrupted; finished slides are kept; run the same command again" in result.stderr

    monkeypatch.setattr("wsi.pipelines.train.train", interrupted)
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\na,LUAD\n")
    result = CliRunner().invoke(cli, ["train", "--task", "nsclc-subtype", "--features", str(tmp_path),
                                      "--labels", str(labels), "--out", str(tmp_path / "m")])  # fmt: skip
    assert result.exit_code == 130, result.output
    assert "wsi train: interrupted; finished epochs are kept in --out; add --resume" in result.stderr


def test_ctrl_c_keeps_the_finished_slides_in_the_manifest(
    slides: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while case-1 is tiled: case-0, finished (alone or beside it), is in tiles/manifest.csv, the
    rerun skips it and tiles case-1."""
    import wsi.pipelines.tile.stage as stage

    real = stage._tile_checked_slide  # what each batch job runs

    def ctrl_c_at_case_1(source, job):  # type: ignore[no-untyped-def]
        if source.slide_id == "case-1":
            raise KeyboardInterrupt
        return real(source, job)

    out = tmp_path / "run"
    args = [str(slides), "--out", str(out), "--tile-um", "128", "--tile-px", "64", "--no-progress"]
    monkeypatch.setattr(stage, "_tile_checked_slide", ctrl_c_at_case_1)
    result = _run(*args)
    assert result.exit_code == 130 and "interrupted" in result.stderr, result.output
    assert [(r["slide"], r["status"]) for r in _manifest(out)] == [("case-0", "ok")]
    assert int(_manifest(out)[0]["tiles"]) > 0

    monkeypatch.setattr(stage, "_tile_checked_slide", real)
    result = _run(*args)
    assert result.exit_code == 0, result.output
    assert [(r["slide"], r["status"]) for r in _manifest(out)] == [("case-0", "skipped"), ("case-1", "ok")]
