"""COBRA II against an independent float64 forward written here from the authors' code (KatherLab/COBRA
49d2311 cobra/model/cobra.py, utils/mamba2.py, utils/abmil.py) with Mamba-2 as the token-by-token
recurrence of mamba_ssm's `Mamba2.step` (state-spaces/mamba e9594ce), random weights saved in the layout
of their pretraining checkpoint (`state_dict` -> `momentum_enc.*`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.slide_encoders import SLIDE_ENCODERS, build_slide_encoder, count_parameters, get_spec
from wsi.models.slide_encoders.cobra import raster_order
from wsi.models.slide_encoders.mamba2 import Mamba2Mixer

NAMES = ["cobra-uni", "cobra-h-optimus-0", "cobra-virchow2", "cobra-conch"]


# ------------------------------------------------------------ reference, from the authors' code
class Mamba2Step(nn.Module):
    """mamba_ssm Mamba2(d_model, d_state, d_conv=4, expand=2) parameters; forward = `step` per token
    (no causal_conv1d / selective_state_update: their plain-torch branches), rms_norm_ref for the norm."""

    def __init__(self, d_model: int, d_state: int) -> None:
        super().__init__()
        self.d_inner, self.d_state, self.headdim = 2 * d_model, d_state, 64
        self.nheads = self.d_inner // 64
        conv_dim = self.d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * d_state + self.nheads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, 4, groups=conv_dim, padding=3, bias=True)
        dt = torch.exp(torch.rand(self.nheads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nheads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:  # (1, L, d)
        conv_state = torch.zeros(1, self.conv1d.weight.shape[0], 4, dtype=u.dtype)
        ssm_state = torch.zeros(1, self.nheads, self.headdim, self.d_state, dtype=u.dtype)
        outs = []
        for t in range(u.shape[1]):
            zxbcdt = self.in_proj(u[:, t])
            z, xBC, dt = torch.split(zxbcdt, [self.d_inner, self.d_inner + 2 * self.d_state, self.nheads], -1)
            conv_state = torch.roll(conv_state, shifts=-1, dims=-1)
            conv_state[:, :, -1] = xBC
            xBC = (
                torch.sum(conv_state * rearrange(self.conv1d.weight, "d 1 w -> d w"), dim=-1)
                + self.conv1d.bias
            )
            xBC = F.silu(xBC)
            x, B, C = torch.split(xBC, [self.d_inner, self.d_state, self.d_state], dim=-1)
            A = -torch.exp(self.A_log)
            dt = F.softplus(dt + self.dt_bias)
            dA = torch.exp(dt * A)
            x = rearrange(x, "b (h p) -> b h p", p=self.headdim)
            dBx = dt[:, :, None, None] * x[:, :, :, None] * B[:, None, None, :]  # einsum bh,bn,bhp->bhpn
            ssm_state = ssm_state * rearrange(dA, "b h -> b h 1 1") + dBx
            y = torch.einsum("bhpn,bn->bhp", ssm_state, C) + rearrange(self.D, "h -> h 1") * x
            y = rearrange(y, "b h p -> b (h p)") * F.silu(z)  # rms_norm_ref, norm_before_gate=False
            y = y / torch.sqrt(y.square().mean(-1, keepdim=True) + 1e-5) * self.norm.weight
            outs.append(self.out_proj(y))
        return torch.stack(outs, 1)


class Embed(nn.Module):
    def __init__(self, dim: int, embed_dim: int = 768, dropout: float = 0.25) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, embed_dim), nn.Dropout(dropout), nn.SiLU(),  # noqa: E501
                                  nn.Linear(embed_dim, embed_dim))  # fmt: skip


class Mamba2Enc(nn.Module):
    def __init__(self, dim: int, layer: int, dropout: float, d_state: int) -> None:
        super().__init__()
        self._fc1 = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(dropout))
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(dim), Mamba2Step(dim, d_state)) for _ in range(layer)]
        )
        self.classifier = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._fc1(x)
        for layer in self.layers:
            h_ = h
            h = layer[1](layer[0](h))
            h = h + h_
        return self.classifier(h)


class BatchedABMIL(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(hidden_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention_c(self.attention_a(x).mul(self.attention_b(x)))  # raw A


class CobraReference(nn.Module):
    """cobra.py Cobra(layers=1, input_dims=[512, 1024, 1280, 1536], num_heads=4, dropout=0.2,
    att_dim=256, d_state=128) as get_cobraII builds it; forward(x) = bmm(softmax(mean raw A), x)."""

    def __init__(self, embed_dim: int = 768, num_heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.ModuleDict({str(d): Embed(d, embed_dim) for d in [512, 1024, 1280, 1536]})
        self.norm = nn.LayerNorm(embed_dim)
        self.mamba_enc = Mamba2Enc(embed_dim, layer=1, dropout=0.2, d_state=128)
        self.num_heads = num_heads
        self.attn = nn.ModuleList([BatchedABMIL(embed_dim // num_heads, 256) for _ in range(num_heads)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, N, D) -> (1, D)
        h = self.norm(self.mamba_enc(self.embed[str(x.shape[-1])].head(x)))
        h_ = rearrange(h, "b t (e c) -> b t e c", c=self.num_heads)
        A = torch.stack([net(h_[:, :, :, i]) for i, net in enumerate(self.attn)], dim=-1)
        A = rearrange(A, "b t e c -> b t (e c)", c=self.num_heads).mean(-1).unsqueeze(-1)
        A = F.softmax(torch.transpose(A, 2, 1), dim=-1)
        return torch.bmm(A, x).squeeze(1)


def _reference(seed: int = 1) -> CobraReference:
    torch.manual_seed(seed)
    ref = CobraReference()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if not name.endswith(("dt_bias", "A_log", "D")):  # those keep Mamba2's own initialisation
                p.copy_(
                    torch.randn(p.shape, generator=g) * 0.05 + (1.0 if name.endswith("norm.weight") else 0)
                )
    return ref.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[CobraReference, Path]:
    ref = _reference()
    path = tmp_path_factory.mktemp("cobra") / "cobraII.pth.tar"
    state = {f"momentum_enc.{k}": v for k, v in ref.state_dict().items()}
    state |= {"momentum_enc.proj.weight": torch.zeros(4, 768), "base_enc.norm.weight": torch.ones(768)}
    torch.save({"state_dict": state, "epoch": 3}, path)  # a pretraining checkpoint, as get_cobraII reads it
    return ref.double(), path


def _tiles(n: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    grid = torch.stack([torch.arange(n) % 37, torch.arange(n) // 37], 1).double() * 224.0
    return torch.randn(n, dim, generator=g), grid[torch.randperm(n, generator=g)]


def test_features_equal_the_authors_forward(checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, path = checkpoint
    from wsi.models.slide_encoders import base, mamba2

    monkeypatch.setattr(base, "CHUNK_TILES", 128)  # 3 chunks (states carried between them) ...
    monkeypatch.setattr(mamba2, "BLOCK", 50)  # ... of up to 3 scan blocks each
    name = "cobra-uni"
    model = build_slide_encoder(name, weights=path)
    dim = get_spec(name).in_dim
    feats, coords = _tiles(300, dim)
    with torch.no_grad():  # the authors feed the rows in file order: give them ours, sorted by position
        want = ref(feats[raster_order(coords)].double()[None])[0].float()
    got = model.encode(feats, coords, 224.0)
    assert got.shape == (get_spec(name).dim,) == (dim,)
    assert F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert len(model.weights_sha256) == 64


def test_virchow2_uses_the_class_token_half(checkpoint) -> None:
    ref, path = checkpoint
    model = build_slide_encoder("cobra-virchow2", weights=path)
    feats, coords = _tiles(40, 2560)  # wsi's Virchow2 bags: [class token, mean of patch tokens]
    with torch.no_grad():
        want = ref(feats[raster_order(coords), :1280].double()[None])[0].float()
    got = model.encode(feats, coords, 224.0)
    assert got.shape == (1280,)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_mamba2_blocks_and_state_carry_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from wsi.models.slide_encoders import mamba2

    monkeypatch.setattr(mamba2, "BLOCK", 64)
    torch.manual_seed(0)
    ref = Mamba2Step(32, 16).double()
    mixer = Mamba2Mixer(32, 16).double()
    mixer.load_state_dict(ref.state_dict())
    u = torch.randn(1, 300, 32, dtype=torch.float64)
    with torch.no_grad():
        want = ref(u)[0]
        state = mixer.initial_state(u.device)
        parts = []
        for a, b in ((0, 7), (7, 200), (200, 300)):  # uneven pieces: conv tail and SSM state carried
            out, state = mixer(u[0, a:b], state)
            parts.append(out)
    torch.testing.assert_close(torch.cat(parts), want, atol=1e-10, rtol=1e-9)


def test_parameter_count_is_the_published_architecture() -> None:
    published = sum(p.numel() for p in CobraReference().parameters())
    for name in NAMES:
        assert count_parameters(name) == published == get_spec(name).params == 11_063_116
    assert set(NAMES) <= set(SLIDE_ENCODERS.names())


def test_row_order_does_not_change_the_embedding_positions_do() -> None:
    model = build_slide_encoder("cobra-uni", random_init=True)
    feats, coords = _tiles(300, 1024)
    a = model.encode(feats, coords, 224.0)
    perm = torch.randperm(300)
    torch.testing.assert_close(model.encode(feats[perm], coords[perm], 224.0), a, atol=1e-5, rtol=1e-5)
    moved = coords.clone()
    moved[:150] = coords[150:300]  # the same tiles at other places: Mamba reads another sequence
    moved[150:300] = coords[:150]
    assert not torch.allclose(model.encode(feats, moved, 224.0), a, atol=1e-5)


def test_checkpoint_layouts(checkpoint, tmp_path: Path) -> None:
    ref, path = checkpoint
    x, coords = _tiles(50, 1024)
    want = build_slide_encoder("cobra-uni", weights=path).encode(x, coords, 224.0)
    bare = {k: v.float() for k, v in ref.state_dict().items()}
    torch.save(bare, tmp_path / "bare.pth")  # a bare state dict
    torch.save({"state_dict": {f"cobra.{k}": v for k, v in bare.items()}, "head.weight": torch.zeros(2)},
               tmp_path / "stamp.ckpt")  # fmt: skip  # a STAMP fine-tune
    for file in ("bare.pth", "stamp.ckpt"):
        got = build_slide_encoder("cobra-uni", weights=tmp_path / file).encode(x, coords, 224.0)
        torch.testing.assert_close(got, want)
    torch.save({k: v for k, v in bare.items() if "mamba_enc.layers.0.1" not in k}, tmp_path / "short.pth")
    with pytest.raises(WeightsError, match=r"8 missing: mamba_enc\.layers\.0\.1\.A_log"):
        build_slide_encoder("cobra-uni", weights=tmp_path / "short.pth")


def _bag(path: Path, encoder: str, dim: int, tile_um: float = 224.0, n: int = 24) -> torch.Tensor:
    import numpy as np

    from wsi.formats.bags import BagProvenance, write_bag

    feats = np.random.default_rng(len(path.stem)).normal(size=(n, dim)).astype(np.float32)
    coords_um = np.stack([np.arange(n) % 6, np.arange(n) // 6], axis=1).astype(np.float32) * tile_um
    prov = BagProvenance(
        slide_id=path.stem, encoder=encoder, weights_sha256="a" * 64, tile_um=tile_um,
        tile_px=round(tile_um), mpp=0.25, level0_width=9000, level0_height=9000,
        tile_params={"tile_um": tile_um}, target_mpp=1.0,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = np.random.default_rng(0).permutation(n)  # stored in no particular order
    px = (coords_um[rows] / 0.25).astype(np.int64)
    write_bag(path, feats=feats[rows], coords_um=coords_um[rows], coords_px=px, provenance=prov,
              dtype="float32")  # fmt: skip
    return torch.from_numpy(feats)


def test_embed_slides_refuses_another_tile_encoder_and_pools_patients(tmp_path: Path) -> None:
    from wsi.pipelines.embed_slides import embed_slides, read_embedding

    a = _bag(tmp_path / "bags" / "a.h5", "uni", 1024)
    b = _bag(tmp_path / "bags" / "bb.h5", "uni", 1024)
    _bag(tmp_path / "bags" / "ccc.h5", "virchow2", 2560)
    embedded = embed_slides(tmp_path / "bags", encoder="cobra-uni", random_init=True,
                                out_dir=tmp_path / "out")
    out, results = embedded.folder, list(embedded)  # fmt: skip
    by_id = {r.slide_id: r for r in results}
    assert by_id["a"].status == by_id["bb"].status == "ok"
    error = str(by_id["ccc"].error)
    assert "holds virchow2 features, but slide encoder 'cobra-uni' reads uni features" in error
    model = build_slide_encoder("cobra-uni", random_init=True)
    grid = torch.stack([torch.arange(24) % 6, torch.arange(24) // 6], 1).float() * 224.0
    want = model.encode(a, grid, 224.0)  # rows stored shuffled: the embedding of the slide in raster order
    got = torch.from_numpy(read_embedding(out / "a.h5").vector)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    table = tmp_path / "slides.csv"
    table.write_text("patient,slide\nP1,a\nP1,bb\n")
    embedded = embed_slides(tmp_path / "bags", encoder="cobra-uni", random_init=True,
                                  out_dir=tmp_path / "out", level="patient", slide_table=table)
    out_p, results = embedded.folder, list(embedded)  # fmt: skip
    assert [r.status for r in results] == ["ok"]
    assert read_embedding(out_p / "P1.h5").vector.shape == (1024,)
    del b
