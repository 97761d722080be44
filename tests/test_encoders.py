"""Encoders: the RetCCL checkpoint layout loads exactly; unsafe or mismatched weights are refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file

from models.encoders import (
    RETCCL_SHA256,
    available_encoders,
    build_encoder,
    encoder_id_for,
    load_state_dict_file,
)
from wsi.errors import ConfigError, WeightsError


@pytest.fixture(scope="module")
def torchvision_resnet50() -> torch.nn.Module:
    """A torchvision ResNet-50 with random weights and non-trivial BatchNorm statistics, fc removed."""
    torch.manual_seed(1)
    model = torchvision.models.resnet50()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    model.fc = torch.nn.Identity()  # what RetCCL does before saving best_ckpt.pth
    return model.eval()


@pytest.fixture(scope="module")
def retccl_state(torchvision_resnet50: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = torchvision_resnet50.state_dict()
    assert not any(k.startswith("fc.") for k in state)  # the published layout: no fc.* keys
    return state


@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (1, 256, 256, 3), dtype=torch.uint8, generator=g)  # (B, H, W, 3)


def test_retccl_layout_gives_the_features_of_the_saved_model(
    tmp_path: Path,
    torchvision_resnet50: torch.nn.Module,
    retccl_state: dict,
    tiles: torch.Tensor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "best_ckpt.pth"
    torch.save(retccl_state, path)
    with caplog.at_level(logging.WARNING, logger="models.encoders"):
        enc = build_encoder("retccl", weights=path)
    # not the published file: loaded, with a warning naming both digests
    assert "not the published retccl checkpoint" in caplog.text and RETCCL_SHA256[:12] in caplog.text
    assert (enc.dim, enc.input_px, enc.encoder_id) == (2048, 256, "retccl")
    assert enc.weights_sha256 != "random" and len(enc.weights_sha256) == 64
    with torch.inference_mode():
        x = enc.preprocess(tiles)  # (2, 3, 256, 256)
        ours = enc.embed(tiles)
        reference = torchvision_resnet50(x)
    assert ours.shape == (1, 2048)
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    # preprocessing is plain ImageNet normalisation at 256 px, no crop
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    expected = (tiles.permute(0, 3, 1, 2).float() / 255 - mean) / std
    torch.testing.assert_close(x, expected, rtol=1e-5, atol=1e-5)


def test_wrapped_and_prefixed_checkpoints_load(tmp_path: Path, retccl_state: dict) -> None:
    prefixed = {f"module.{k}": v for k, v in retccl_state.items()}
    variants = {
        "state_dict.pth": {"state_dict": retccl_state, "epoch": 3},
        "module.pth": prefixed,
    }
    for name, obj in variants.items():
        state = load_state_dict_file(_save(tmp_path / name, obj))
        assert state.keys() == retccl_state.keys(), name
        assert all(torch.equal(state[k], v) for k, v in retccl_state.items()), name
    # wrapped + prefixed + a full torchvision head (fc.*, unused by the encoder) in one file
    head = {"module.fc.weight": torch.zeros(1000, 2048), "module.fc.bias": torch.zeros(1000)}
    path = _save(tmp_path / "model.pth", {"model": {**prefixed, **head}, "optimizer_name": "adam"})
    enc = build_encoder("retccl", weights=path)
    loaded = enc.backbone.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in retccl_state.items())


def _save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def test_wrong_keys_are_refused_with_names(tmp_path: Path, retccl_state: dict) -> None:
    resnet18 = _save(tmp_path / "resnet18.pth", torchvision.models.resnet18().state_dict())
    with pytest.raises(WeightsError) as err:
        build_encoder("retccl", weights=resnet18)
    msg = str(err.value)
    assert "resnet18.pth" in msg and "198 missing" in msg and "layer1.0.bn3.weight" in msg

    renamed = {k.replace("layer4", "block4"): v for k, v in retccl_state.items()}
    with pytest.raises(WeightsError, match=r"unexpected: block4\."):
        build_encoder("retccl", weights=_save(tmp_path / "renamed.pth", renamed))


class _Payload:
    """Unpickling this would create `marker`: what a malicious checkpoint could do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    evil = _save(tmp_path / "evil.pth", {"conv1.weight": torch.zeros(1), "payload": _Payload(marker)})
    with pytest.raises(WeightsError, match=r"objects other than tensors.*GLOBAL"):
        build_encoder("retccl", weights=evil)
    assert not marker.exists()
    with pytest.raises(WeightsError, match="not a readable"):
        load_state_dict_file(_write(tmp_path / "junk.pth", b"definitely not a checkpoint"))
    with pytest.raises(WeightsError, match="no state dict"):
        load_state_dict_file(_save(tmp_path / "list.pth", [1, 2, 3]))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_weights_are_required_unless_random_init(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(WeightsError, match="--random-init"):
        build_encoder("timm:test_resnet")
    with caplog.at_level(logging.WARNING, logger="models.encoders"):
        a = build_encoder("timm:test_resnet", random_init=True)
    assert "RANDOM weights" in caplog.text
    b = build_encoder("timm:test_resnet", random_init=True)
    assert a.weights_sha256 == "random"
    # seeded: every process (dask worker) builds the same random network
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_digest_checks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    enc = build_encoder("timm:test_resnet", random_init=True)
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in enc.backbone.state_dict().items()}, str(path))
    loaded = build_encoder("timm:test_resnet", weights=path, expected_sha256=None)
    x = torch.randint(0, 256, (1, 64, 64, 3), dtype=torch.uint8)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.embed(x), enc.embed(x))
    with pytest.raises(WeightsError, match="expected"):
        build_encoder("timm:test_resnet", weights=path, expected_sha256="0" * 64)
    assert build_encoder("timm:test_resnet", weights=path, expected_sha256=loaded.weights_sha256)


def test_registry_names_and_ids() -> None:
    assert "retccl" in available_encoders() and "timm:<name>" in available_encoders()
    with pytest.raises(ConfigError, match="unknown encoder 'nope'"):
        build_encoder("nope", random_init=True)
    with pytest.raises(ConfigError, match="timm has no architecture"):
        build_encoder("timm:not_a_model_xyz", random_init=True)
    with pytest.raises(ConfigError, match="fixed"):
        build_encoder("retccl", random_init=True, input_px=224)
    assert (
        encoder_id_for("timm:vit_small_patch16_224.augreg_in21k") == "timm-vit_small_patch16_224.augreg_in21k"
    )
    assert encoder_id_for("timm:../../x") == "timm-..-..-x"  # one folder name, never a path


@pytest.mark.parametrize("name", ["timm:test_resnet", "timm:test_vit"])
def test_tiny_timm_encoders(name: str) -> None:
    enc = build_encoder(name, random_init=True)
    x = torch.randint(0, 256, (3, 100, 100, 3), dtype=torch.uint8)  # resized to the model's input
    with torch.inference_mode():
        feats = enc.embed(x)
    assert feats.shape == (3, enc.dim) and torch.isfinite(feats).all()
    assert enc.preprocess(x).shape[-1] == enc.input_px
