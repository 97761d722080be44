"""MADELEINE against an independent forward written here from the authors' code (mahmoodlab/MADELEINE
419287d madeleine/models/Model.py, abmil.py), with random weights saved in their checkpoint key layout."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from slide_bags import make_bag
from torch import nn

from wsi.core.errors import BagFormatError, WeightsError
from wsi.formats.bags import read_bag
from wsi.models.slide_encoders import SLIDE_ENCODERS, build_slide_encoder, count_parameters, get_spec
from wsi.models.slide_encoders.madeleine import multi_head_pool
from wsi.pipelines.embed_slides import embed_slides, read_embedding
from wsi.pipelines.embed_slides.checks import check_bag


# ------------------------------------------------------------ reference, from the authors' code
class BatchedABMIL(nn.Module):
    """madeleine/models/abmil.py BatchedABMIL (dropout=True, softmax), as written there."""

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(hidden_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        A = self.attention_c(self.attention_a(x).mul(self.attention_b(x)))
        return F.softmax(A, dim=1)


class ABMILEmbedder(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        h = hidden_dim
        self.pre_attn = nn.Sequential(
            nn.Linear(input_dim, h), nn.LayerNorm(h), nn.GELU(), nn.Dropout(0.1),
            nn.Linear(h, h), nn.LayerNorm(h), nn.GELU(), nn.Dropout(0.1),
            nn.Linear(h, h * n_heads), nn.LayerNorm(h * n_heads), nn.GELU(), nn.Dropout(0.1),
        )  # fmt: skip
        self.attn = nn.ModuleList([BatchedABMIL(h, 512) for _ in range(n_heads)])

    def forward(self, bags: torch.Tensor) -> torch.Tensor:
        embeddings = rearrange(self.pre_attn(bags), "b t (e c) -> b t e c", c=self.n_heads)
        attention = torch.stack([net(embeddings[:, :, :, i]) for i, net in enumerate(self.attn)], dim=-1)
        return torch.sum(embeddings * attention, dim=1)


class MadeleineReference(nn.Module):
    """Model.py MADELEINE(config, stain_encoding=False) with the published config; `encode_he`."""

    def __init__(self, patch_embedding_dim: int = 512, hidden: int = 512, n_heads: int = 4) -> None:
        super().__init__()
        self.token_projector = nn.Linear(512 * n_heads, 128)
        self.wsi_embedders = ABMILEmbedder(patch_embedding_dim, hidden, n_heads)
        self.projector = nn.Linear(512 * n_heads, 512)

    def encode_he(self, feats: torch.Tensor) -> torch.Tensor:
        bs = feats.shape[0]
        feats = feats.unsqueeze(dim=1)
        emb = self.wsi_embedders(feats[:, 0, :, :])
        d_out, n_heads = emb.shape[-2], emb.shape[-1]
        emb = self.projector(emb.view(bs, d_out * n_heads))
        return emb.view(bs, 1, d_out).squeeze(dim=1)


def _reference(seed: int = 1) -> MadeleineReference:
    ref = MadeleineReference()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return ref.eval()


def _checkpoint(tmp_path: Path, ddp: bool = False) -> tuple[MadeleineReference, Path]:
    ref = _reference()
    path = tmp_path / "model.pt"  # huggingface.co/MahmoodLab/madeleine: torch.save(model.state_dict())
    prefix = "module." if ddp else ""
    torch.save({prefix + k: v for k, v in ref.state_dict().items()}, path)
    return ref, path


@pytest.mark.parametrize("ddp", [False, True])
def test_features_equal_the_authors_forward(tmp_path: Path, ddp: bool) -> None:
    ref, path = _checkpoint(tmp_path, ddp)
    model = build_slide_encoder("madeleine", weights=path)
    feats = torch.randn(333, 512)
    with torch.no_grad():
        want = ref.encode_he(feats[None])[0]
    got = model.encode(feats, None, 256.0)
    assert got.shape == (512,) == (get_spec("madeleine").dim,)
    assert F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    half = model.encode(feats.half(), None, 256.0)  # float16 bags, as `wsi embed` stores them
    assert F.cosine_similarity(half, want, dim=0) > 0.999
    assert len(model.weights_sha256) == 64


def test_chunking_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = _checkpoint(tmp_path)
    model = build_slide_encoder("madeleine", weights=path)
    feats = torch.randn(300, 512)
    whole = model.encode(feats, None, 256.0)
    from wsi.models.slide_encoders import base

    monkeypatch.setattr(base, "CHUNK_TILES", 37)  # 9 chunks, the last one of 4 tiles
    torch.testing.assert_close(model.encode(feats, None, 256.0), whole, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="empty bag"):
        multi_head_pool(model._heads, feats[:0])


def test_parameter_count_is_the_published_architecture() -> None:
    published = sum(p.numel() for p in MadeleineReference().parameters())
    assert count_parameters("madeleine") == published == get_spec("madeleine").params == 4_996_740
    assert "madeleine" in SLIDE_ENCODERS.names()


def test_row_order_does_not_change_the_embedding() -> None:
    model = build_slide_encoder("madeleine", random_init=True)
    feats = torch.randn(400, 512)
    perm = torch.randperm(400)
    a = model.encode(feats, None, 256.0)
    torch.testing.assert_close(model.encode(feats[perm], None, 256.0), a, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model.encode(feats[:200], None, 256.0), a, atol=1e-4)


def test_weights_are_checked_key_by_key(tmp_path: Path) -> None:
    ref, _ = _checkpoint(tmp_path)
    state = {k: v for k, v in ref.state_dict().items() if k != "token_projector.weight"}
    torch.save(state, tmp_path / "short.pt")
    with pytest.raises(WeightsError, match=r"1 missing: token_projector\.weight"):
        build_slide_encoder("madeleine", weights=tmp_path / "short.pt")
    torch.save({k: v[..., :1] if k == "projector.weight" else v for k, v in ref.state_dict().items()},
               tmp_path / "narrow.pt")  # fmt: skip
    with pytest.raises(WeightsError, match=r"wrong shape.*projector\.weight"):
        build_slide_encoder("madeleine", weights=tmp_path / "narrow.pt")
    assert build_slide_encoder("madeleine", weights=tmp_path).weights_sha256  # the model folder works


def test_wrong_tile_encoder_is_refused_naming_both(tmp_path: Path) -> None:
    feats = make_bag(tmp_path / "bags" / "good.h5", encoder="conch-v1", dim=512, mpp=1.0)
    make_bag(tmp_path / "bags" / "v15.h5", encoder="conch-v1.5", dim=768, tile_um=256.0, mpp=0.5)
    make_bag(tmp_path / "bags" / "at20x.h5", encoder="conch-v1", dim=512, tile_um=128.0, mpp=0.5)
    embedded = embed_slides(tmp_path / "bags", encoder="madeleine", random_init=True,
                                out_dir=tmp_path / "out")
    out, results = embedded.folder, list(embedded)  # fmt: skip
    by_id = {r.slide_id: r for r in results}
    assert by_id["good"].status == "ok"  # a bad slide fails alone
    assert "holds conch-v1.5 features, but slide encoder 'madeleine' reads conch-v1 features" in str(
        by_id["v15"].error
    )
    assert "--encoder conch-v1" in str(by_id["v15"].error)
    assert "tiles of 128 um, but slide encoder 'madeleine' was trained on 256 um tiles" in str(
        by_id["at20x"].error
    )
    model = build_slide_encoder("madeleine", random_init=True)
    want = model.encode(torch.from_numpy(feats), None, 256.0).numpy()
    np.testing.assert_allclose(read_embedding(out / "good.h5").vector, want, rtol=1e-5, atol=1e-6)


def test_stamp_conch_bags_are_conch_v1(tmp_path: Path) -> None:
    path = tmp_path / "slide.h5"
    with h5py.File(path, "w") as h5:  # STAMP's `conch` extractor: CONCH v1, encode_image(proj_contrast=False)
        h5["feats"] = np.zeros((3, 512), np.float32)
        h5["coords"] = np.zeros((3, 2), np.float32)
        h5.attrs.update({"extractor": "conch-abc123", "unit": "um", "tile_size_um": 256.0})
    source = check_bag(read_bag(path, require_um=False), get_spec("madeleine"), "madeleine")
    assert source.encoder == "conch-v1"
    with h5py.File(path, "a") as h5:
        h5.attrs["extractor"] = "conch1_5-abc123"
    with pytest.raises(BagFormatError, match=r"holds conch-v1\.5 features, but slide encoder 'madeleine'"):
        check_bag(read_bag(path, require_um=False), get_spec("madeleine"), "madeleine")
