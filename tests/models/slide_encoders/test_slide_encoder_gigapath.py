"""Prov-GigaPath's slide encoder against an independent forward transcribed from the authors' code, with
random weights saved in their checkpoint layout; published sizes; positions; order; refusals."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from wsi.core.errors import BagFormatError, WeightsError
from wsi.formats.bags import BagProvenance, read_bag, write_bag
from wsi.models.encoders import load_state_dict_file
from wsi.models.slide_encoders import build_slide_encoder, count_parameters, get_spec
from wsi.models.slide_encoders import longnet as ln
from wsi.models.slide_encoders.base import load_checked
from wsi.models.slide_encoders.gigapath import GigaPath, grid_cells, position_embedding
from wsi.pipelines.embed_slides import embed_slides, read_embedding
from wsi.pipelines.embed_slides.checks import check_bag

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # hundreds of small matmuls per forward

# ------------------------------------------------------------ reference, from prov-gigapath 09d8e87
# gigapath/pos_embed.py, with `rows_h` to build only the first rows of the 1000 x 1000 table (6 GB whole)


def get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=float)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size, cls_token=False, rows_h=None):
    grid_h = np.arange(rows_h or grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, len(grid_h), grid_size])
    emb_h = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_w = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    emb = np.concatenate([emb_h, emb_w], axis=1)
    return np.concatenate([np.zeros([1, embed_dim]), emb], axis=0) if cls_token else emb


def pad_to(n, mult):
    return 0 if n % mult == 0 else mult - n % mult


def flash_attn_func(q, k, v):
    """flash-attn's math on (b, l, h, d): the output and the log-sum-exp (b, h, l) of the scaled scores."""
    scores = torch.einsum("blhd,bshd->bhls", q, k) * q.shape[-1] ** -0.5
    return torch.einsum("bhls,bshd->blhd", scores.softmax(-1), v), scores.logsumexp(-1)


class RefDilatedAttention(nn.Module):
    """torchscale component/dilated_attention.py DilatedAttention (no incremental state, one rank)."""

    def __init__(self, dim, heads, segment_length, dilated_ratio):
        super().__init__()
        self.num_heads, self.segment_length, self.dilated_ratio = heads, segment_length, dilated_ratio
        self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.q_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.inner_attn_ln = nn.LayerNorm(dim, eps=1e-5)

    def dense_to_sparse(self, x, ratio):
        padding, head_padding = pad_to(x.size(1), ratio), pad_to(self.num_heads, ratio)
        if padding > 0 or head_padding > 0:
            x = F.pad(x, (0, 0, 0, head_padding, 0, padding), value=0.0)
        x = rearrange(x, "b (l r1) (r2 h) d -> b l h d r1 r2", r1=ratio, r2=ratio)
        x = torch.diagonal(x, offset=0, dim1=4, dim2=5)
        x = rearrange(x, "b l h d r -> b l (r h) d")
        return x[:, :, : self.num_heads] if head_padding > 0 else x

    def sparse_to_dense(self, out, lse, ratio):
        head_padding = pad_to(self.num_heads, ratio)
        if head_padding > 0:
            out = F.pad(out, (0, 0, 0, head_padding), value=0.0)
            lse = F.pad(lse, (0, 0, 0, head_padding), value=-1e8)
        out = rearrange(out, "b l (r h) d -> b l h d r", r=ratio)
        out = torch.diag_embed(out, offset=0, dim1=4, dim2=5)
        out = rearrange(out, "b l h d r1 r2 -> b (r2 h) (l r1) d", r1=ratio, r2=ratio)
        lse = rearrange(lse, "b (r h) l -> b l h r", r=ratio)
        lse = torch.diag_embed(lse, offset=0, dim1=3, dim2=4)
        lse = lse.masked_fill_(lse == 0, -1e8)
        lse = rearrange(lse, "b l h r1 r2 -> b (r2 h) (l r1) 1", r1=ratio, r2=ratio)
        if head_padding > 0:
            out, lse = out[:, : self.num_heads], lse[:, : self.num_heads]
        return out, lse

    def gathering(self, x, dr, sl):
        sl = min(sl, x.size(1))
        padding = pad_to(x.size(1), sl)
        if padding > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, padding), value=0.0)
        x = rearrange(x, "b (n g) h d -> (b n) g h d", g=sl)
        return rearrange(self.dense_to_sparse(x, dr), "b l h d -> (b h) l d")

    def scattering(self, outs, lses, seq_len, bsz):
        all_outs, all_lses = [], []
        for dr, o, lse in zip(self.dilated_ratio, outs, lses, strict=True):
            o = rearrange(o, "b l (h d) -> b l h d", h=self.num_heads)
            o, lse = self.sparse_to_dense(o, lse, dr)
            o = rearrange(o, "(b n) h g d -> (b h) (n g) d", b=bsz)
            lse = rearrange(lse, "(b n) h g 1 -> (b h) (n g) 1", b=bsz)
            all_outs.append(o[:, :seq_len])
            all_lses.append(lse[:, :seq_len])
        max_lse = torch.stack(all_lses, dim=0).max(0)[0]
        all_lses = [torch.exp(lse - max_lse) for lse in all_lses]
        lse_sum = torch.stack(all_lses, dim=0).sum(0)
        out = sum(o * (lse / lse_sum).type_as(o) for o, lse in zip(all_outs, all_lses, strict=True))
        return rearrange(out, "(b h) l d -> b l (h d)", h=self.num_heads)

    def attend(self, q, k, v):  # (b, l, h, d) each, after the projections
        outs, lses = [], []
        for sl, dr in zip(self.segment_length, self.dilated_ratio, strict=True):
            ki, vi, qi = (self.gathering(t, dr, sl) for t in (k, v, q))
            # MultiheadAttention.attention_ops, flash branch
            qi, ki, vi = (rearrange(t, "(b h) l d -> b l h d", h=self.num_heads) for t in (qi, ki, vi))
            attn, lse = flash_attn_func(qi, ki, vi)
            outs.append(rearrange(attn, "b l h d -> b l (h d)"))
            lses.append(lse[:, :, : attn.size(1)])
        return self.scattering(outs, lses, q.size(1), q.size(0))

    def forward(self, x):
        q, k, v = (rearrange(p(x), "b l (h d) -> b l h d", h=self.num_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        return self.out_proj(self.inner_attn_ln(self.attend(q, k, v)))


class RefFFN(nn.Module):  # component/feedforward_network.py, subln
    def __init__(self, dim, ffn_dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, ffn_dim), nn.Linear(ffn_dim, dim)
        self.ffn_layernorm = nn.LayerNorm(ffn_dim, eps=1e-5)

    def forward(self, x):
        return self.fc2(self.ffn_layernorm(F.gelu(self.fc1(x).float())))


class RefLayer(nn.Module):  # architecture/encoder.py EncoderLayer, normalize_before (subln), alpha 1
    def __init__(self, c):
        super().__init__()
        self.self_attn = RefDilatedAttention(c.dim, c.heads, c.segment_lengths, c.dilated_ratios)
        self.self_attn_layer_norm = nn.LayerNorm(c.dim, eps=1e-5)
        self.ffn = RefFFN(c.dim, c.ffn_dim)
        self.final_layer_norm = nn.LayerNorm(c.dim, eps=1e-5)

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.ffn(self.final_layer_norm(x))


class RefLongNetViT(nn.Module):
    """slide_encoder.py LongNetViT(in_chans, embed_dim, depth, tile_size=256, global_pool=True)."""

    def __init__(self, c: ln.LongNetConfig, in_chans=1536, slide_ngrids=1000, rows_h=None):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Linear(in_chans, c.dim)
        self.slide_ngrids, self.tile_size = slide_ngrids, 256
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        table = get_2d_sincos_pos_embed(c.dim, slide_ngrids, cls_token=True, rows_h=rows_h)
        self.register_buffer("pos_embed", torch.from_numpy(table).float()[None], persistent=False)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(RefLayer(c) for _ in range(c.depth))
        self.encoder.layer_norm = nn.LayerNorm(c.dim, eps=1e-5)
        self.norm = partial(nn.LayerNorm, eps=1e-6)(c.dim)

    def coords_to_pos(self, coords, tile_size):
        coords_ = torch.floor(coords / tile_size)
        return (coords_[..., 0] * self.slide_ngrids + coords_[..., 1]).long() + 1

    def forward(self, x, coords, all_layer_embed=False):
        x = self.patch_embed.proj(x)
        x = x + self.pos_embed[:, self.coords_to_pos(coords, self.tile_size), :].squeeze(0)
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat((cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        states = [x]
        for layer in self.encoder.layers:
            states.append(x := layer(x))
        x_list = states if all_layer_embed else [self.encoder.layer_norm(x)]
        return [self.norm(h[:, 1:, :].mean(dim=1)) for h in x_list]  # global_pool=True


# --------------------------------------------------------------------------------------------- helpers
TINY = ln.LongNetConfig(dim=64, depth=2, heads=8, ffn_dim=96, segment_lengths=(8, 16, 32, 64, 128))


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * (0.5 if "norm" in name else 0.08))
    return module.eval()


def _strip_bag(n: int, rows_h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n distinct tiles of 128 um on x cells < rows_h (the table rows the reference built), y < 1000."""
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(rows_h * 1000, generator=g)[:n]
    cells = torch.stack([flat // 1000, flat % 1000], 1).double()
    coords_um = (cells * 128.0 + torch.rand(n, 2, generator=g, dtype=torch.float64) * 100).float()
    return coords_um, cells


def _authors_order(coords_um: torch.Tensor) -> torch.Tensor:
    cells = torch.floor(coords_um.double() / 128.0)
    return torch.argsort(cells[:, 1] * 1e6 + cells[:, 0])  # row by row, x fastest (their tiler)


def _reference_embedding(ref, feats, coords_um, layer):
    order = _authors_order(coords_um)
    coords_px = coords_um[order].double() / 0.5  # at the tiles' level, 0.5 um/px (prov-gigapath issue 116)
    with torch.no_grad():
        out = ref(feats[order].float()[None], coords_px[None], all_layer_embed=layer is not None)
    return out[layer if layer is not None else 0][0]


def _save_authors_checkpoint(ref: nn.Module, path: Path) -> Path:
    torch.save({"model": ref.state_dict()}, path)  # slide_encoder.pth: torch.load(...)["model"]
    return path


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("length", [1, 7, 100, 301])
def test_dilated_attention_equals_the_authors_scattering(length: int, monkeypatch) -> None:
    heads, dim = 8, 8
    ref = RefDilatedAttention(heads * dim, heads, (8, 16, 32, 64, 128), (1, 2, 4, 8, 16)).double()
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, length, heads, dim, generator=g, dtype=torch.float64) * 2 for _ in range(3))
    want = ref.attend(q, k, v)[0].view(length, heads, dim)
    monkeypatch.setattr(ln, "_FUSED_MIN_KEYS", 0)  # every segment through the fused CPU kernel
    got = ln.dilated_attention(q[0], k[0], v[0], (8, 16, 32, 64, 128), (1, 2, 4, 8, 16))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    monkeypatch.setattr(ln, "_CPU_FLASH", None)  # the explicit path (CUDA), a few rows at a time
    monkeypatch.setattr(ln, "ATTN_BLOCK", 5)
    got = ln.dilated_attention(q[0], k[0], v[0], (8, 16, 32, 64, 128), (1, 2, 4, 8, 16))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("layer", [1, None])
def test_tiny_config_equals_the_authors_forward(layer: int | None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ln, "ROW_CHUNK", 37)  # row chunks that do not divide the sequence
    ref = _randomise(RefLongNetViT(TINY, in_chans=48, rows_h=3), seed=3)
    path = _save_authors_checkpoint(ref, tmp_path / "slide_encoder.pth")
    model = type("Tiny", (GigaPath,), {"LAYER": layer})(TINY, in_dim=48)
    load_checked(model, load_state_dict_file(path), path, "gigapath")
    coords_um, _ = _strip_bag(300, rows_h=3, seed=4)
    feats = torch.randn(300, 48)
    got = model.eval().encode(feats, coords_um, 128.0)
    want = _reference_embedding(ref, feats, coords_um, layer)
    assert F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name,layer", [("gigapath", 11), ("gigapath-last", None)])
def test_published_model_equals_the_authors_forward(name: str, layer: int | None, tmp_path: Path) -> None:
    """The full published configuration; 1,100 tiles fill one 1024 segment and pad the next."""
    ref = _randomise(RefLongNetViT(ln.LongNetConfig(), rows_h=2), seed=5)
    _save_authors_checkpoint(ref, tmp_path / "slide_encoder.pth")
    model = build_slide_encoder(name, weights=tmp_path)  # the model folder works: slide_encoder.pth
    coords_um, _ = _strip_bag(1100, rows_h=2, seed=6)
    feats = torch.randn(1100, 1536).half()  # as `wsi embed` stores bags
    got = model.encode(feats, coords_um, 128.0)
    want = _reference_embedding(ref, feats, coords_um, layer)
    assert got.shape == (768,) and F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    assert len(model.weights_sha256) == 64


def test_parameter_count_is_the_published_one() -> None:
    with torch.device("meta"):
        ref = RefLongNetViT(ln.LongNetConfig(), rows_h=1)
    longnet = sum(p.numel() for n, p in ref.named_parameters() if n.startswith("encoder."))
    assert longnet == 85_148_160  # demo/run_gigapath.ipynb: "Number of trainable LongNet parameters"
    total = sum(p.numel() for p in ref.parameters())
    for name in ("gigapath", "gigapath-last"):
        assert count_parameters(name) == total == get_spec(name).params == 86_330_880
    # the notebook prints the segment lengths get_optimal_segment_length(262144, 256) gives
    assert ln.optimal_segment_lengths() == (1024, 5792, 32768, 185363, 1048576)


def test_position_table_is_the_authors() -> None:
    table = get_2d_sincos_pos_embed(32, 7, cls_token=True)
    cells = torch.tensor([(x, y) for x in range(7) for y in range(7)])
    rows = 1 + cells[:, 0] * 7 + cells[:, 1]  # coords_to_pos
    np.testing.assert_allclose(position_embedding(cells, 32).numpy(), table[rows.numpy()], atol=1e-12)


def test_positions_are_tile_indices_from_micrometres() -> None:
    # a 20 x 12 mm slide of 128 um tiles scanned at 0.2525 um/px: level-0 pixels x mpp -> micrometres
    idx = torch.stack(torch.meshgrid(torch.arange(156), torch.arange(94), indexing="ij"), -1).reshape(-1, 2)
    step_px0 = 128.0 / 0.2525  # 506.9 level-0 pixels per tile
    coords_um = (torch.round(idx.double() * step_px0) * 0.2525).float()
    cells = grid_cells(coords_um, 128.0)
    assert torch.equal(cells, idx)  # every tile its own cell: never squashed onto a small grid (STAMP #159)
    with pytest.raises(BagFormatError, match=r"beyond Prov-GigaPath's grid of 1000 x 1000 tiles of 128 um"):
        grid_cells(torch.tensor([[0.0, 0.0], [130_000.0, 10.0]]), 128.0)
    with pytest.raises(BagFormatError, match="needs the tiles' positions"):
        build_slide_encoder("gigapath", random_init=True).encode(torch.randn(3, 1536), None, 128.0)


def test_row_order_does_not_matter_and_positions_do() -> None:
    torch.manual_seed(0)
    model = type("Tiny", (GigaPath,), {"LAYER": None})(TINY, in_dim=48).eval()
    coords_um, _ = _strip_bag(400, rows_h=40, seed=7)
    feats = torch.randn(400, 48)
    a = model.encode(feats, coords_um, 128.0)
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(model.encode(feats[perm], coords_um[perm], 128.0), a, atol=1e-5, rtol=1e-5)
    moved = coords_um.clone()
    moved[:200, 0] += 128.0 * 300  # half the tiles elsewhere on the slide
    assert F.cosine_similarity(model.encode(feats, moved, 128.0), a, dim=0) < 0.9999
    swapped = coords_um[torch.roll(torch.arange(400), 1)]  # the same positions, other tiles on them
    assert not torch.allclose(model.encode(feats, swapped, 128.0), a, atol=1e-4)
    assert math.isfinite(float(a.sum()))


def _bag(path: Path, encoder: str, dim: int, n: int = 30) -> None:
    coords_um = np.stack([np.arange(n) % 6, np.arange(n) // 6], 1).astype(np.float32) * 128.0
    prov = BagProvenance(slide_id=path.stem, encoder=encoder, weights_sha256="b" * 64, tile_um=128.0,
                         tile_px=256, mpp=0.25, level0_width=9000, level0_height=9000,
                         tile_params={"tile_um": 128.0}, target_mpp=0.5)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    feats = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    write_bag(path, feats=feats, coords_um=coords_um, coords_px=(coords_um / 0.25).astype(np.int64),
              provenance=prov, dtype="float16")  # fmt: skip


def test_other_tile_encoders_are_refused_naming_both(tmp_path: Path) -> None:
    _bag(tmp_path / "uni.h5", "uni", 1024)
    with pytest.raises(BagFormatError, match="holds uni features, but slide encoder 'gigapath' reads "
                                             "prov-gigapath features"):  # fmt: skip
        check_bag(read_bag(tmp_path / "uni.h5"), get_spec("gigapath"), "gigapath")


@pytest.mark.slow
def test_embed_slides_end_to_end(tmp_path: Path) -> None:
    _bag(tmp_path / "bags" / "good.h5", "prov-gigapath", 1536)
    _bag(tmp_path / "bags" / "uni.h5", "uni", 1024)
    embedded = embed_slides(tmp_path / "bags", encoder="gigapath", random_init=True, out_dir=tmp_path)
    _, results = embedded.folder, list(embedded)
    by_id = {r.slide_id: r for r in results}
    assert by_id["good"].status == "ok" and by_id["uni"].status == "failed"  # a bad bag fails alone
    assert "'gigapath' reads prov-gigapath features" in by_id["uni"].error
    assert read_embedding(tmp_path / "gigapath-slide" / "good.h5").vector.shape == (768,)


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    ref = RefLongNetViT(TINY, in_chans=48, rows_h=1)
    path = _save_authors_checkpoint(ref, tmp_path / "slide_encoder.pth")
    with pytest.raises(
        WeightsError, match=r"does not fit slide encoder 'gigapath'.*missing: encoder\.layers\.10"
    ):
        build_slide_encoder("gigapath", weights=path)


def test_encoders_cli_lists_it() -> None:
    from click.testing import CliRunner

    from wsi.cli.main import cli

    table = CliRunner().invoke(cli, ["encoders", "--slide"])
    assert table.exit_code == 0
    assert any(row.split()[:2] == ["gigapath", "prov-gigapath"] and "86.33M" in row
               for row in table.output.splitlines())  # fmt: skip
    one = CliRunner().invoke(cli, ["encoders", "--slide", "gigapath"])
    assert "huggingface.co/prov-gigapath/prov-gigapath" in one.output and "slide_encoder.pth" in one.output
    listed = json.loads(CliRunner().invoke(cli, ["encoders", "--slide", "gigapath", "--json"]).output)
    assert listed["gigapath"]["tile_size_um"] == 128.0 and "tile_um" not in listed["gigapath"]  # as bags say


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu() -> None:
    """On CUDA the sparse segments go through chunked matmuls instead of the fused CPU kernel."""
    torch.manual_seed(0)
    model = type("Tiny", (GigaPath,), {"LAYER": None})(TINY, in_dim=48).eval()
    coords_um, _ = _strip_bag(3000, rows_h=40, seed=9)
    feats = torch.randn(3000, 48).half()
    want = model.encode(feats, coords_um, 128.0)
    got = model.cuda().encode(feats.cuda(), coords_um.cuda(), 128.0).cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
