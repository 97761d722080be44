"""Slide encoders against independent forwards written here from the authors' code, with random weights
saved in the authors' key layout; parameter counts of the published configs; refusals; invariances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.models.slide_encoders import (
    SLIDE_ENCODERS,
    build_slide_encoder,
    count_parameters,
    get_spec,
    streaming_attention_pool,
)


# ----------------------------------------------------------------- references, from the authors' code
class MilLabGatedAttention(nn.Module):
    """mahmoodlab/MIL-Lab dfc3c17 src/models/layers.py GlobalGatedAttention."""

    def __init__(self, L: int, D: int, dropout: float = 0.25, num_classes: int = 1) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(L, D), nn.Tanh(), nn.Dropout(dropout))
        self.attention_b = nn.Sequential(nn.Linear(L, D), nn.Sigmoid(), nn.Dropout(dropout))
        self.attention_c = nn.Linear(D, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention_c(self.attention_a(x).mul(self.attention_b(x)))


class MilLabABMIL(nn.Module):
    """src/models/abmil.py ABMIL with base.yaml (embed 512, attn 384, 1 fc layer, gated, 1 head), no
    classifier (FEATHER checkpoints have none); forward_features as the authors write it."""

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        # create_mlp(in_dim, hid_dims=[], out_dim=512, end_with_fc=False): Linear then the activation
        self.patch_embed = nn.Sequential(nn.Linear(in_dim, 512), nn.ReLU())
        self.global_attn = MilLabGatedAttention(L=512, D=384, dropout=0.25, num_classes=1)

    def forward_features(self, h: torch.Tensor) -> torch.Tensor:
        h = self.patch_embed(h)
        A = torch.transpose(self.global_attn(h), -2, -1)  # B x K x M
        A = F.softmax(A, dim=-1)
        h = torch.bmm(A, h)
        return h.view(h.shape[0], -1)


class ChiefReference(nn.Module):
    """hms-dbmi/CHIEF 1abed33 models/CHIEF.py CHIEF(size_arg="small", dropout=True, n_classes=2)."""

    def __init__(self) -> None:
        super().__init__()
        size = [768, 512, 256]
        self.attention_net = nn.Sequential(
            nn.Linear(size[0], size[1]), nn.ReLU(), nn.Dropout(0.25), MilLabGatedAttention(size[1], size[2])
        )
        self.classifiers = nn.Linear(size[1], 2)
        self.instance_classifiers = nn.ModuleList([nn.Linear(size[1], 2) for _ in range(2)])
        self.att_head = nn.Module()
        self.att_head.fc1 = nn.Linear(size[1], size[2])
        self.att_head.fc2 = nn.Linear(size[2], 1)
        self.text_to_vision = nn.Sequential(nn.Linear(768, size[1]), nn.ReLU(), nn.Dropout(p=0.25))
        self.register_buffer("organ_embedding", torch.randn(19, 768))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h_ori = h
        A = self.attention_net(h)  # Attn_Net_Gated returns (A, x); the scores are what is used
        A = F.softmax(torch.transpose(A, 1, 0), dim=1)
        return torch.mm(A, h_ori)  # 'WSI_feature'


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return module.eval()


def _feather_case(name: str, tmp_path, seed: int = 1):
    ref = _randomise(MilLabABMIL(get_spec(name).in_dim), seed)
    path = tmp_path / "model.safetensors"  # the Hugging Face layout: ABMILModel wraps ABMIL as `model`
    save_file({f"model.{k}": v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref, path, lambda x: ref.forward_features(x[None])[0]


def _chief_case(tmp_path, seed: int = 1):
    ref = _randomise(ChiefReference(), seed)
    path = tmp_path / "CHIEF_pretraining.pth"
    torch.save(ref.state_dict(), path)
    return ref, path, lambda x: ref(x)[0]  # WSI_feature is (1, 768)


CASES = ["feather", "feather-uni", "feather-uni2", "chief"]


def _case(name: str, tmp_path):
    return _chief_case(tmp_path) if name == "chief" else _feather_case(name, tmp_path)


@pytest.mark.parametrize("name", CASES)
def test_features_equal_the_authors_forward(name: str, tmp_path) -> None:
    _, path, reference = _case(name, tmp_path)
    model = build_slide_encoder(name, weights=path)
    feats = torch.randn(333, get_spec(name).in_dim)
    with torch.no_grad():
        want = reference(feats)
    got = model.encode(feats, None, get_spec(name).tile_um)
    assert got.shape == (get_spec(name).dim,)
    assert F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # float16 bags (wsi embed's default) give the same embedding up to float16 rounding
    half = model.encode(feats.half(), None, 256.0)
    assert F.cosine_similarity(half, want, dim=0) > 0.999
    assert len(model.weights_sha256) == 64


@pytest.mark.parametrize("name", CASES)
def test_parameter_count_is_the_published_architecture(name: str, tmp_path) -> None:
    ref = ChiefReference() if name == "chief" else MilLabABMIL(get_spec(name).in_dim)
    published = sum(p.numel() for p in ref.parameters())
    assert count_parameters(name) == published == get_spec(name).params
    if name.startswith("feather"):  # the MIL-Lab README rounds every FEATHER-24K to "0.9M"
        assert 0.7e6 < published < 1.25e6


def test_registry_lists_every_encoder() -> None:
    assert set(CASES) <= set(SLIDE_ENCODERS.names())
    with pytest.raises(ConfigError, match="unknown slide encoder 'titan-x'"):
        SLIDE_ENCODERS.get("titan-x")


def test_chunked_pooling_is_exact() -> None:
    feats = torch.randn(1000, 8, dtype=torch.float64)
    w = torch.randn(8, dtype=torch.float64) * 5
    full = (torch.softmax(feats @ w, 0)[:, None] * feats).sum(0)
    for chunk in (1, 7, 999, 5000):
        got = streaming_attention_pool(lambda x: x @ w, lambda x: x, feats, chunk=chunk)
        torch.testing.assert_close(got.double(), full, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="empty bag"):
        streaming_attention_pool(lambda x: x @ w, lambda x: x, feats[:0])


@pytest.mark.parametrize("name", CASES)
def test_row_order_does_not_change_the_embedding(name: str) -> None:
    model = build_slide_encoder(name, random_init=True)
    feats = torch.randn(500, get_spec(name).in_dim)
    coords = torch.rand(500, 2) * 10000
    perm = torch.randperm(500)
    a = model.encode(feats, coords, 256.0)
    b = model.encode(feats[perm], coords[perm], 256.0)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    c = model.encode(feats[:250], coords[:250], 256.0)  # and other tiles do change it
    assert not torch.allclose(a, c, atol=1e-4)


def test_random_init_is_reproducible() -> None:
    a, b = build_slide_encoder("chief", random_init=True), build_slide_encoder("chief", random_init=True)
    x = torch.randn(20, 768)
    torch.testing.assert_close(a.encode(x, None, 256.0), b.encode(x, None, 256.0))
    assert a.weights_sha256 == "random"


def test_weights_are_checked_key_by_key(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, path, _ = _feather_case("feather", tmp_path)
    state = {f"model.{k}": v.contiguous() for k, v in ref.state_dict().items()}
    dropped = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if "attention_b" not in k}, str(dropped))
    with pytest.raises(WeightsError, match=r"2 missing: global_attn\.attention_b\.0\.bias"):
        build_slide_encoder("feather", weights=dropped)
    with pytest.raises(WeightsError, match="wrong shape"):  # CONCH v1.5 FEATHER given as the UNI2 one
        build_slide_encoder("feather-uni2", weights=path)
    with pytest.raises(WeightsError, match="does not fit slide encoder 'chief'"):
        build_slide_encoder("chief", weights=path)
    folder = tmp_path  # the authors' model folder works too
    assert (
        build_slide_encoder("feather", weights=folder).weights_sha256
        == build_slide_encoder("feather", weights=path).weights_sha256
    )
    with pytest.raises(ConfigError, match="--random-init"):  # not on the Hub: --weights or --random-init
        build_slide_encoder("chief")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # on the Hub: looked up in the cache
    with pytest.raises(WeightsError, match=r"hf download MahmoodLab/abmil\.base\.conch_v15\.pc108-24k"):
        build_slide_encoder("feather")


def test_chief_accepts_stamps_copy_without_organ_embedding(tmp_path) -> None:
    ref, _, reference = _chief_case(tmp_path)
    state = {k: v for k, v in ref.state_dict().items() if k != "organ_embedding"}
    path = tmp_path / "stamp.pth"
    torch.save(state, path)
    x = torch.randn(50, 768)
    got = build_slide_encoder("chief", weights=path).encode(x, None, 256.0)
    with torch.no_grad():
        torch.testing.assert_close(got, reference(x), atol=1e-5, rtol=1e-4)


def test_pickled_objects_are_never_loaded(tmp_path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"attention_net.0.weight": np.zeros(3)}, path)  # a numpy array needs unpickling
    with pytest.raises(WeightsError):
        build_slide_encoder("chief", weights=path)
