"""Other members of the fifth round's classes (tests/wsi/storage/test_hostile_inputs_round5.py has the
reproductions): a URL given to any option that takes a file (--task, --preset, a task YAML's preset, the
segmentation networks' weights, a slide encoder's weights) is used as a URL or refused as one, never
folded into the path `s3:/...` and never echoed with its secret; a pipe or device inside a --review or
--roi folder is refused naming it, never taken for a missing file (which dropped a review with exit 0)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli

TILE_ARGS = ["--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0", "--threads", "1"]
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzz"
#: a URL with credentials, and a signed one: both refused before any use, their secret never shown
URLS = {
    "credentials": (f"s3://AKIAXX:{SECRET}@bkt/f.pth", "holds credentials", "s3://***@bkt/f.pth"),
    "signed": (f"https://h.invalid/f.pth?X-Amz-Signature={SECRET}", "is signed", "X-Amz-Signature=***"),
}


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args)


# ------------------------------------------------------- 1. a URL in any option that takes a file
@pytest.mark.parametrize("url", sorted(URLS))
@pytest.mark.parametrize(
    "args",
    [
        ["tile", "x.svs", "--out", "o", "--tissue-model", "grandqc-tissue", "--tissue-weights", "{url}"],
        ["tile", "x.svs", "--out", "o", "--artifact-model", "grandqc-artifact", "--artifact-weights",
         "{url}"],
        ["embed-slides", "--features", "f", "--encoder", "chief", "--weights", "{url}", "--out", "o"],
        ["train", "--task", "{url}", "--features", "f", "--labels", "l.csv", "--out", "o"],
    ],
    ids=["tissue-weights", "artifact-weights", "slide-encoder-weights", "task"],
)  # fmt: skip
def test_a_url_given_for_a_file_is_refused_as_a_url_without_its_secret(
    args: list[str], url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_slide: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(make_slide(name="r6-a", size_um=800.0, mpp=1.0, seed=3).path, "x.svs")
    Path("f").mkdir()
    Path("l.csv").write_text("slide,label\n")
    given, why, masked = URLS[url]
    result = _invoke([a.replace("{url}", given) for a in args])
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output and "K7MDENG" not in result.output
    assert why in result.output and masked in result.output, result.output  # named as the URL it is
    assert ":/***" not in result.output.replace("://***", "") and "https:/h" not in result.output  # no fold
    assert "does not exist" not in result.output


def test_a_preset_url_and_a_task_yamls_preset_url_are_refused_without_their_secret(tmp_path: Path) -> None:
    from wsi.core.errors import WsiError
    from wsi.models.presets import load_preset
    from wsi.pipelines.study.tasks import load_task

    given, why, masked = URLS["credentials"]
    with pytest.raises(WsiError) as err:
        load_preset(given)
    assert SECRET not in str(err.value) and why in str(err.value) and masked in str(err.value)
    task = tmp_path / "t.yaml"
    task.write_text(f"name: t\nclasses: [a, b]\ninput: bags\nmodel:\n  preset: '{given}'\n")
    from wsi.models.presets import preset_kind

    with pytest.raises(WsiError) as err:  # the preset a task names is read as the --preset option is
        preset_kind(load_task(task).model.preset)
    assert SECRET not in str(err.value) and why in str(err.value)


# ----------------------------------------------- 9. pipes and devices inside a --review or --roi folder
def _special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")  # a device that never ends: reading it whole would hang


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_device_in_a_review_folder_is_refused_not_taken_for_no_review(
    kind: str, tmp_path: Path, make_slide: Any
) -> None:
    slide = tmp_path / "s1.svs"
    shutil.copyfile(make_slide(name="r6-b", size_um=800.0, mpp=1.0, seed=4).path, slide)
    out = tmp_path / "run"
    assert _invoke(["-q", "tile", str(slide), "--out", str(out), *TILE_ARGS]).exit_code == 0
    reviews = tmp_path / "reviewed"
    reviews.mkdir()
    _special(reviews / "s1.geojson", kind)
    result = _invoke(["tile", str(slide), "--out", str(out), *TILE_ARGS, "--review", str(reviews)])
    assert result.exit_code == 2, result.output  # before: exit 0, the review silently not applied
    assert str(reviews / "s1.geojson") in result.output
    assert ("a pipe" if kind == "fifo" else "a device") in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_device_in_a_roi_folder_fails_its_slide_naming_it(
    kind: str, tmp_path: Path, make_slide: Any
) -> None:
    slide = tmp_path / "s1.svs"
    shutil.copyfile(make_slide(name="r6-c", size_um=800.0, mpp=1.0, seed=5).path, slide)
    rois = tmp_path / "rois"
    rois.mkdir()
    _special(rois / "s1.geojson", kind)
    result = _invoke(["tile", str(slide), "--out", str(tmp_path / "run"), *TILE_ARGS, "--roi", str(rois)])
    assert result.exit_code == 1, result.output  # the slide fails, as for a missing ROI file
    assert (
        f"--roi file {rois / 's1.geojson'} is {'a pipe' if kind == 'fifo' else 'a device'}" in result.output
    )
    assert "no s1.geojson" not in result.output  # it is there: not "missing"


# ------------------------------------------------------ 5. a run still training, as --init-from
def test_init_from_a_run_whose_training_runs_or_stopped_is_refused(tmp_path: Path) -> None:
    from wsi.storage.folder_lock import output_lock

    run = tmp_path / "model"
    shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "run-v1" / "single", run)
    (tmp_path / "f").mkdir()
    (tmp_path / "l.csv").write_text("slide,label\n")
    args = ["train", "--task", "nsclc-subtype", "--features", str(tmp_path / "f"), "--labels",
            str(tmp_path / "l.csv"), "--out", str(tmp_path / "o"), "--init-from", str(run)]  # fmt: skip
    with output_lock(run, "wsi train --out model"):  # its training holds the folder
        result = _invoke(args)
    assert result.exit_code == 2, result.output
    assert f"--init-from {run}: its training is still running" in result.output
    assert "wsi train --out model" in result.output and "--allow-unfinished" in result.output
    (run / "last.safetensors").write_bytes(b"")
    (run / "log.csv").write_text("epoch\n1\n")
    result = _invoke(args)  # stopped at an epoch: no metrics.json
    assert result.exit_code == 2 and "stopped before the end" in result.output, result.output
    allowed = _invoke([*args, "--allow-unfinished"])  # the user's call: it goes on (to the empty labels)
    assert "stopped before the end" not in allowed.output and "still running" not in allowed.output
    (run / "metrics.json").write_text("{}")
    assert "stopped before the end" not in _invoke(args).output  # finished: read as it is


# ------------------------------------------- 7. a cache placed on a file names the variable that did it
def test_a_cache_placed_on_a_file_names_the_variable(tmp_path: Path, make_slide: Any) -> None:
    slide = tmp_path / "s1.svs"
    shutil.copyfile(make_slide(name="r6-d", size_um=800.0, mpp=1.0, seed=6).path, slide)
    afile = tmp_path / "afile"
    afile.write_text("")
    args = ["tile", str(slide), "--out", str(tmp_path / "o"), *TILE_ARGS]
    xdg = CliRunner().invoke(cli, args, env={"WSI_CACHE_DIR": None, "XDG_CACHE_HOME": str(afile / "x")})
    assert xdg.exit_code == 2 and f"XDG_CACHE_HOME={str(afile / 'x')!r}" in xdg.output, xdg.output
    hub = CliRunner().invoke(cli, [*args, "--tissue-model", "grandqc-tissue"], env={"HF_HOME": str(afile)})
    assert hub.exit_code == 2 and f"HF_HOME={str(afile)!r}" in hub.output, hub.output
    assert "not a folder" in hub.output and "not in the Hugging Face cache" not in hub.output


# ----------------------------------------- 4. a plain image replaced by one of the same size and mtime
def test_a_plain_image_replaced_with_its_size_and_mtime_kept_is_read_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    import tifffile

    from wsi.slides.slide import open_slide

    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, 255, (300, 400, 3), dtype=np.uint8) for _ in range(2))
    path, other = tmp_path / "img.tif", tmp_path / "other.tif"
    for where, img in ((path, first), (other, second)):  # uncompressed strips: one size for both
        tifffile.imwrite(where, img, rowsperstrip=16, resolution=(20000, 20000), resolutionunit="CENTIMETER")
    assert path.stat().st_size == other.stat().st_size
    with open_slide(path) as slide:  # its pyramid made in the cache
        np.testing.assert_array_equal(slide.read_region_um(0, 0, 64, 0.5), first[:128, :128])
    kept = path.stat().st_mtime_ns
    shutil.copyfile(other, path)  # `cp` over it, then its time put back (cp -p, rsync -t, touch -r)
    os.utime(path, ns=(kept, kept))
    with open_slide(path) as slide:  # the new image's pixels, never the old pyramid's
        np.testing.assert_array_equal(slide.read_region_um(0, 0, 64, 0.5), second[:128, :128])


# ---------------------------------------------- 1. secrets in a file's content, and in anything printed
def test_a_recipe_holding_a_secret_is_refused_and_no_printed_line_shows_one(tmp_path: Path) -> None:
    import io

    from wsi.core.errors import WsiError
    from wsi.models.encoders.recipe import load_recipe_yaml
    from wsi.storage.masking import MaskedStream

    recipe = tmp_path / "enc.yaml"
    for line in (f"source: s3://AKIAXX:{SECRET}@bkt/w.pth", f"kwargs:\n  note: https://h/x?sig={SECRET}"):
        recipe.write_text(f"arch: test_resnet.r160_in1k\ndim: 0\ninput_px: 64\n{line}\n")
        result = _invoke(["encoders", str(recipe)])
        assert result.exit_code == 2, result.output  # stored in every bag: refused, not masked there
        assert SECRET not in result.output and "K7MDENG" not in result.output
        assert "holds a secret" in result.output and str(recipe) in result.output
        with pytest.raises(WsiError, match="holds a secret"):  # what `wsi embed --encoder` loads
            load_recipe_yaml(recipe)
    out = io.StringIO()
    MaskedStream(out).write(f"table row  s3://K:{SECRET}@b/x  https://h/y?X-Amz-Signature={SECRET}\n")
    assert SECRET not in out.getvalue() and "s3://***@b/x" in out.getvalue()


# ------------------------------- 1, 8, 9. zero-shot's prompt file, and outputs that can only be local
@pytest.mark.parametrize("kind", ["fifo", "device", "credentials"])
def test_a_prompt_file_that_is_a_pipe_a_device_or_a_secret_url_is_refused_as_such(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    from cohorts import make_bag

    monkeypatch.chdir(tmp_path)
    Path("bags").mkdir()
    make_bag(Path("bags/a.h5"), label=0, rng=np.random.default_rng(0), n=4)  # any bag: prompts come first
    prompts = URLS["credentials"][0] if kind == "credentials" else "p.yaml"
    if kind != "credentials":
        _special(Path(prompts), kind)
    result = _invoke(["zero-shot", "bags", "--out", "zs", "--random-init", "--prompts", prompts])
    assert result.exit_code == 2, result.output
    want = {"fifo": "prompt file p.yaml is a pipe", "device": "prompt file p.yaml is a device",
            "credentials": "the prompt file URL holds credentials"}[kind]  # fmt: skip
    assert want in result.output and "no such file" not in result.output and SECRET not in result.output


@pytest.mark.parametrize(
    "args",
    [["zero-shot", "bags", "--random-init", "--prompts", "nsclc", "--out"], ["demo", "--out"],
     ["make-slides", "--n", "1", "--out"]],
    ids=["zero-shot", "demo", "make-slides"],
)  # fmt: skip
def test_a_url_as_the_out_of_a_local_only_command_is_refused_not_made_a_local_folder(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bags").mkdir()
    result = _invoke([*args, URLS["credentials"][0]])
    assert result.exit_code == 2, result.output
    assert "is a URL" in result.output and "give a local folder" in result.output
    assert SECRET not in result.output
    assert not Path("s3:").exists()  # before: the folder s3:/AKIAXX:<secret>@bkt/... was made here
