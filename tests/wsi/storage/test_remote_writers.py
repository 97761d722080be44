"""Writers of one remote output, and the slides they read, against a real S3 server (moto's server mode,
tests/helpers/s3_server.py): two `wsi train` runs started at the same moment into one s3:// folder leave
one whole run (the other refused, nothing of it uploaded); a run refused by another command of the same
machine is told to wait or stop that command, not to delete a lock object that is not the one in its
way; a remote slide replaced while its tiles are embedded fails that slide naming the replacement, and
no bag of the mix is written."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cohorts import make_cohort, write_task
from s3_server import S3Server, padded_pair
from s3_server import s3 as s3  # a fixture
from s3_server import s3_server as s3_server  # a fixture

from wsi.cli.main import cli

REPO = Path(__file__).resolve().parents[3]
TILE = ["--backend", "tiffslide", "--tile-um", "128", "--tile-px", "32", "--min-blur-var", "0",
        "--threads", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def pair(make_slide: Any) -> tuple[bytes, bytes]:
    return padded_pair(make_slide, "w")


# ------------------------------------------- 3. two machines, one remote output: `wsi train` at once
#: one `wsi ...` command that imports everything first, then starts when the file argv[1] appears: two of
#: them start their commands within milliseconds of each other, not seconds apart as their imports are
START_TOGETHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import wsi.pipelines.train, wsi.pipelines.predict.stage
    from wsi.cli.main import cli
    go = Path(sys.argv[1])
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    cli.main(args=sys.argv[2:], prog_name="wsi")
    """
)


def _started(args: list[str], go: Path, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "WSI_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", START_TOGETHER, str(go), *args], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow  # two processes import torch and one trains: 20-40 s on two shared cores
def test_two_trainings_into_one_remote_folder_at_once_leave_one_whole_run(
    s3: S3Server, tmp_path: Path
) -> None:
    made = make_cohort(tmp_path / "cohort", n_patients=12)
    task = write_task(tmp_path / "task.yaml", epochs=3, bootstrap=20)
    bucket = s3.bucket("two-train")
    s3.client().upload_file(str(made.labels), bucket, "labels.csv")
    for bag in sorted(made.bags.glob("*.h5")):
        s3.client().upload_file(str(bag), bucket, f"bags/{bag.name}")
    run = f"s3://{bucket}/run"
    go = tmp_path / "go"
    procs = {}
    for seed in (1, 2):  # another seed each: whose files the folder holds is then visible in them
        args = ["-q", "train", "--task", str(task), "--features", f"s3://{bucket}/bags/", "--labels",
                f"s3://{bucket}/labels.csv", "--out", run, "--no-progress", "--seed", str(seed)]  # fmt: skip
        procs[seed] = _started(args, go, tmp_path / f"machine-{seed}")
    go.touch()
    outputs = {seed: p.communicate(timeout=300)[0] for seed, p in procs.items()}
    codes = {seed: p.returncode for seed, p in procs.items()}
    assert sorted(codes.values()) == [0, 2], outputs
    winner = next(seed for seed, code in codes.items() if code == 0)
    loser = 3 - winner
    refused = outputs[loser]
    assert f"{run} is in use by another wsi command" in refused, refused
    assert f"pid {procs[winner].pid}" in refused  # the holder named
    assert "Traceback" not in refused and "/machine-" not in refused  # the URL, never a cache folder

    import json

    stored = s3.objects(bucket, "run/")
    assert ".wsi-lock" not in "".join(stored)  # released
    assert json.loads(stored["run/config.json"])["task"]["seed"] == winner
    mirror = next((tmp_path / f"machine-{winner}" / "outputs").glob("*/config.json")).parent
    theirs = {p.relative_to(mirror).as_posix(): p for p in mirror.rglob("*") if p.is_file()}
    theirs = {rel: p for rel, p in theirs.items() if not rel.startswith(".") and "/." not in rel}
    assert {k[len("run/") :] for k in stored if "/." not in k and not k.startswith("run/.")} == set(theirs)
    for rel, path in theirs.items():  # every file of the folder is the winner's: nothing mixed
        assert stored[f"run/{rel}"] == path.read_bytes(), rel
    assert not list((tmp_path / f"machine-{loser}").rglob("*.safetensors"))  # it never trained

    predicted = CliRunner().invoke(cli, [
        "-q", "predict", "--model", run, "--features", f"s3://{bucket}/bags/", "--out", str(tmp_path / "p"),
        "--no-progress", "--no-heatmaps",
    ])  # fmt: skip
    assert predicted.exit_code == 0, predicted.output  # a finished run, whole: predict reads it


# ---------------------------------- 10. a refusal by this machine's own lock says what to do about it
HOLD = textwrap.dedent(
    """
    import sys, time
    from wsi.storage.folder_lock import output_lock
    from wsi.storage import remote_output
    mirror = remote_output(sys.argv[1])
    with output_lock(mirror.local, "wsi tile --out " + sys.argv[1]):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def test_a_refusal_by_this_machines_lock_says_wait_or_stop_not_delete_the_remote_lock(
    s3: S3Server, pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    run = f"s3://{bucket}/run"
    cache = tmp_path / "one-machine"  # both commands share this machine's cache, so its local lock
    env = {**os.environ, "WSI_CACHE_DIR": str(cache)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, run, "30"], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = CliRunner().invoke(cli, ["tile", f"s3://{bucket}/slides/", "--out", run, *TILE],
                                     env={"WSI_CACHE_DIR": str(cache)})  # fmt: skip
        assert refused.exit_code == 2, refused.output
        text = refused.output
        assert f"{run} is in use by another wsi command on this machine" in text, text
        assert f"pid {holder.pid}" in text and f"kill {holder.pid}" in text  # who, and how to stop it
        assert ".wsi-lock" not in text  # no file to remove: the kernel's lock ends with its holder
        assert str(cache) not in text  # the URL, not this machine's copy of it
        assert not s3.objects(bucket, "run/tiles/")
    finally:
        holder.kill()
        holder.wait()
    done = CliRunner().invoke(cli, ["tile", f"s3://{bucket}/slides/", "--out", run, *TILE],
                              env={"WSI_CACHE_DIR": str(cache)})  # fmt: skip
    assert done.exit_code == 0, done.output  # the killed holder's lock went with it


# ------------------------------------------------------- 10. a remote slide replaced while embedded
def test_a_remote_slide_replaced_while_embedded_fails_naming_it_and_writes_no_bag(
    s3: S3Server, pair: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from wsi.pipelines.embed import EmbedOptions, embed_tiles, engine

    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[0])
    run = f"s3://{bucket}/run"
    assert CliRunner().invoke(cli, ["tile", f"s3://{bucket}/slides/", "--out", run, *TILE]).exit_code == 0
    encode = engine._encode_batch
    calls = []

    def replace_after_the_first_batch(*args: Any, **kwargs: Any) -> None:
        encode(*args, **kwargs)
        if not calls:  # another slide of the same size, uploaded at the same key mid-slide
            s3.client().put_object(Bucket=bucket, Key="slides/s1.svs", Body=pair[1])
        calls.append(1)

    monkeypatch.setattr(engine, "_encode_batch", replace_after_the_first_batch)
    options = EmbedOptions(
        encoder="timm:test_resnet", random_init=True, input_px=64, batch_size=4, readers=0, dtype="float32",
        threads=1,
    )  # fmt: skip
    result = embed_tiles(run, out_dir=run, options=options, progress=False)
    assert len(calls) > 1  # the slide's tiles took more than one batch: it was replaced mid-slide
    [row] = result.results
    assert row.status == "failed", row
    assert f"the slide file s3://{bucket}/slides/s1.svs was replaced while its tiles were read" in row.error
    assert "could not be read or decoded" not in row.error  # the cause, not its symptom
    assert not [k for k in s3.objects(bucket, "run/features/") if k.endswith("s1.h5")]  # no bag of the mix
