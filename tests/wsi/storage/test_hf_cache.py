"""Weights from the Hugging Face cache, offline: a cache in huggingface_hub's documented layout (refs,
snapshots, blobs with symlinks; huggingface_hub's own `scan_cache_dir` and `hf_hub_download(...,
local_files_only=True)` read it back) holding random weights in the authors' layout is found without
--weights, by `hf:ORG/REPO`, through HF_HOME, HF_HUB_CACHE and the default folder; the sha256 and key
checks stay; nothing is fetched; a missing model's message names the download command and the licence."""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save

from wsi.cli.main import cli
from wsi.core.errors import WeightsError
from wsi.models.encoders import build_encoder
from wsi.models.segmentation.named import segmenter_weights
from wsi.models.segmentation.run import load_segmenter
from wsi.models.slide_encoders import build_slide_encoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

UNI2 = "MahmoodLab/UNI2-h"
HF_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_HUB_OFFLINE")


def cache_file(cache: Path, repo: str, filename: str, data: bytes, revision: str = "main") -> Path:
    """Put `data` into `cache` as `hf download REPO FILENAME` does (huggingface_hub's documented layout):
    blobs/<sha256>, snapshots/<commit>/<filename> a relative symlink to it, refs/<revision> the commit."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
    link = folder / "snapshots" / commit / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    return link


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty Hugging Face cache under HF_HOME, offline, and no way out to the network."""
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights lookup tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    yield tmp_path / "hf" / "hub"


def _torch_bytes(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _random_uni2() -> tuple[torch.nn.Module, bytes]:
    """UNI2-h's architecture at depth 1 with random weights, and its pytorch_model.bin in the authors'
    layout (the timm model's own state dict, as MahmoodLab/UNI2-h publishes it)."""
    torch.manual_seed(11)
    enc = build_encoder("uni2-h", random_init=True, arch_overrides={"depth": 1})
    for p in enc.parameters():
        p.data.normal_(0, 0.02)
    return enc, _torch_bytes({k: v.clone() for k, v in enc.backbone.state_dict().items()})


@pytest.mark.parametrize("where", ["HF_HOME", "HF_HUB_CACHE", "default"])
def test_a_tile_encoder_without_weights_comes_from_the_cache(
    hub: Path, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "HF_HUB_CACHE":
        hub = tmp_path / "elsewhere"
        monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    elif where == "default":  # ~/.cache/huggingface/hub
        monkeypatch.delenv("HF_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        hub = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    reference, data = _random_uni2()
    path = cache_file(hub, UNI2, "pytorch_model.bin", data)
    _read_back_by_huggingface_hub(hub, UNI2, "pytorch_model.bin", path)

    enc = build_encoder("uni2-h", arch_overrides={"depth": 1})  # no --weights
    assert enc.weights_sha256 == hashlib.sha256(data).hexdigest()  # the checks run on the cached file
    tiles = torch.randint(
        0, 256, (2, 224, 224, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        torch.testing.assert_close(enc.embed(tiles), reference.embed(tiles))
    named = build_encoder("uni2-h", weights=f"hf:{UNI2}", arch_overrides={"depth": 1})
    assert named.weights_sha256 == enc.weights_sha256
    one_file = build_encoder("uni2-h", weights=f"hf:{UNI2}/pytorch_model.bin", arch_overrides={"depth": 1})
    assert one_file.weights_sha256 == enc.weights_sha256


def _read_back_by_huggingface_hub(hub: Path, repo: str, filename: str, path: Path) -> None:
    """huggingface_hub itself finds the file in this cache: the layout is its own."""
    from huggingface_hub import hf_hub_download, scan_cache_dir

    info = scan_cache_dir(hub)
    [found] = [r for r in info.repos if r.repo_id == repo]
    assert {f.file_name for rev in found.revisions for f in rev.files} >= {filename}
    assert hf_hub_download(repo, filename, cache_dir=hub, local_files_only=True) == str(path)


def test_the_key_and_sha256_checks_stay(hub: Path) -> None:
    _, data = _random_uni2()
    state = torch.load(io.BytesIO(data), weights_only=True)
    state.pop(next(iter(state)))
    cache_file(hub, UNI2, "pytorch_model.bin", _torch_bytes(state))
    with pytest.raises(WeightsError, match="does not fit encoder 'uni2-h@test'"):
        build_encoder("uni2-h", arch_overrides={"depth": 1})
    cache_file(hub, UNI2, "pytorch_model.bin", data)
    with pytest.raises(WeightsError, match="expected 0000"):
        build_encoder("uni2-h", arch_overrides={"depth": 1}, expected_sha256="0" * 64)


def test_a_missing_model_names_the_download_command_and_the_licence(hub: Path) -> None:
    with pytest.raises(WeightsError) as err:
        build_encoder("uni2-h")
    text = str(err.value)
    assert f"hf download {UNI2} pytorch_model.bin" in text and f"https://huggingface.co/{UNI2}" in text
    assert "CC-BY-NC-ND-4.0" in text and str(hub) in text and "never downloaded" in text
    with pytest.raises(WeightsError, match="needs weights"):  # not on the Hub: --weights, as before
        build_encoder("retccl")
    with pytest.raises(WeightsError, match=re.escape("hf download MahmoodLab/TITAN model.safetensors")):
        build_slide_encoder("titan")


def test_the_cli_says_it_and_marks_what_is_cached(
    hub: Path, make_slide, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    slide = make_slide(name="hf-a", size_um=600.0, mpp=1.0, seed=1).path
    # `hub` set HF_HUB_OFFLINE itself (and an earlier CLI test in this worker may have): unset, the check
    # below sees what the CLI does (socket.connect stays blocked); monkeypatch restores it afterwards
    monkeypatch.delenv("HF_HUB_OFFLINE")
    res = runner.invoke(
        cli, ["tile", str(slide), "--out", str(tmp_path / "run"), "--tissue-model", "hest-tissue"]
    )
    assert res.exit_code == 2 and not (tmp_path / "run" / "tiles").exists(), res.output
    assert "hf download MahmoodLab/hest-tissue-seg deeplabv3_seg_v4.ckpt" in res.output
    assert os.environ["HF_HUB_OFFLINE"] == "1"

    listed = runner.invoke(cli, ["encoders"])
    assert (
        listed.exit_code == 0
        and _row(listed.output, "uni2-h")[6] == "-"
        and _row(listed.output, "retccl")[6] == "--weights"
    )
    path = cache_file(hub, UNI2, "pytorch_model.bin", b"present; the listing reads no weights")
    listed = runner.invoke(cli, ["encoders"])
    assert _row(listed.output, "uni2-h")[6] == "cached" and _row(listed.output, "uni")[6] == "-"
    shown = runner.invoke(cli, ["encoders", "uni2-h"])
    assert f"cached:    {path}" in shown.output


def _row(table: str, name: str) -> list[str]:
    """A row of `wsi encoders`, split on spaces: the input column is two words, so weights is [6]."""
    return next(line.split() for line in table.splitlines() if line.split() and line.split()[0] == name)


def test_slide_encoders_and_segmentation_models_come_from_the_cache_too(hub: Path) -> None:
    torch.manual_seed(5)
    ref = build_slide_encoder("feather", random_init=True)
    for p in ref.parameters():
        p.data.normal_(0, 0.05)
    authors = {f"model.{k}": v.contiguous() for k, v in ref.state_dict().items()}  # MIL-Lab's layout
    data = save(authors)
    cache_file(hub, "MahmoodLab/abmil.base.conch_v15.pc108-24k", "model.safetensors", data)
    model = build_slide_encoder("feather")
    assert model.weights_sha256 == hashlib.sha256(data).hexdigest()
    feats = torch.randn(7, 768, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.encode(feats, None, 256.0), ref.encode(feats, None, 256.0))

    from torchvision.models.segmentation import deeplabv3_resnet50

    net = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=None)
    net.classifier[4] = torch.nn.Conv2d(256, 2, kernel_size=1, stride=1)
    lightning = {"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}}  # HEST's .ckpt
    path = cache_file(hub, "MahmoodLab/hest-tissue-seg", "deeplabv3_seg_v4.ckpt", _torch_bytes(lightning))
    found = segmenter_weights("hest-tissue", "tissue", None)
    assert (
        found == path and segmenter_weights("hest-tissue", "tissue", "hf:MahmoodLab/hest-tissue-seg") == path
    )
    assert (
        load_segmenter("hest-tissue", found, kind="tissue").sha256
        == hashlib.sha256(path.read_bytes()).hexdigest()
    )
    with pytest.raises(WeightsError, match=re.escape("GrandQC_MPP1_state_dict.pth")):
        segmenter_weights("grandqc-artifact", "artifact", None)
