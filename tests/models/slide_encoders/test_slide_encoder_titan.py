"""TITAN against an independent forward written here from the authors' code (MahmoodLab/TITAN on Hugging
Face, vendored verbatim in DIAGNijmegen/unicorn_baseline dec3809 src/unicorn_baseline/vision/pathology/
titan/vision_transformer.py), with random weights saved in the published key layout; parameter count of
the published config; positions from micrometres; invariances; bounded attention blocks; refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from safetensors.torch import save_file
from timm.layers import Mlp
from torch import nn

from wsi.cli.main import cli
from wsi.core.errors import WeightsError
from wsi.formats.bags import BagProvenance, write_bag
from wsi.models.slide_encoders import SLIDE_ENCODERS, build_slide_encoder, count_parameters, get_spec
from wsi.models.slide_encoders import titan as titan_mod


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these are ~100 small ops per forward, which a shared 2-core machine serves
    several times faster without OpenMP barriers between them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------- the authors' code (B == 1 inference path)
def authors_preprocess(features: torch.Tensor, coords: torch.Tensor, patch_size_lv0: int):
    """vision_transformer.py preprocess_features (coords in level-0 px)."""
    offset = coords.min(dim=0).values
    grid_coords = torch.floor_divide(coords - offset, patch_size_lv0)
    grid_coords = grid_coords - grid_coords.min(dim=0).values
    _H, _W = grid_coords.max(dim=0).values + 1
    feature_grid = torch.zeros((int(_H), int(_W), features.size(-1)))
    indices = grid_coords[:, 0] * _W + grid_coords[:, 1]
    feature_grid.view(-1, features.size(-1)).index_add_(0, indices, features)
    feature_grid = feature_grid.permute(2, 0, 1)
    bg_mask = torch.any(feature_grid != 0, dim=0)
    return feature_grid.unsqueeze(0), bg_mask.unsqueeze(0)


def authors_slopes(n: int) -> list[float]:
    if math.log2(n).is_integer():
        p = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [p * (p**i) for i in range(n)]
    nearest = 2 ** math.floor(math.log2(n))
    return authors_slopes(nearest) + authors_slopes(2 * nearest)[0::2][: n - nearest]


def authors_alibi(num_heads: int, w: int, h: int, bg_mask: torch.Tensor) -> torch.Tensor:
    """VisionTransformer.get_alibi: Euclidean grid distances in NumPy, class token unbiased."""
    x, y = np.meshgrid(np.arange(w), np.arange(h), indexing="ij")
    x, y = x[bg_mask.squeeze(0).numpy()], y[bg_mask.squeeze(0).numpy()]
    points = np.stack([x.ravel(), y.ravel()], axis=1)
    dists = np.sqrt(np.sum((points[:, None, :] - points[None, :, :]) ** 2, axis=-1))
    slopes = torch.tensor(authors_slopes(num_heads), dtype=torch.float32).view(num_heads, 1, 1)
    n = dists.shape[-1]
    bias = torch.tensor(dists, dtype=torch.float32).view(1, n, n) * slopes * -1
    all_bias = torch.zeros(1, num_heads, n + 1, n + 1)
    all_bias[:, :, 1:, 1:] = bias
    return all_bias


class AuthorsAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=0.0)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class AuthorsBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = AuthorsAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(in_features=dim, hidden_features=dim * 4, act_layer=nn.GELU, drop=0.0)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_bias)
        return x + self.mlp(self.norm2(x))


class AuthorsSequential(nn.Module):
    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self.modules_list = nn.ModuleList(modules)


class AuthorsPooler(nn.Module):
    """AttentionalPooler, B == 1 branch."""

    def __init__(self, d_model: int, n_head: int, n_queries: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(n_queries, d_model))
        self.attn = nn.MultiheadAttention(d_model, n_head, kdim=d_model, vdim=d_model)
        self.ln_q, self.ln_k = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_k(x).permute(1, 0, 2).contiguous()
        N = x.shape[1]
        q = self.ln_q(self.query)
        out, _ = self.attn(q.unsqueeze(1).expand(-1, N, -1), x, x, need_weights=False)
        return out.permute(1, 0, 2).contiguous()


class AuthorsVisionTransformer(nn.Module):
    """VisionTransformer built by build_vision_tower from config.json's vision_config (CoCa "parallel")."""

    def __init__(self, embed_dim: int = 768, depth: int = 6, num_heads: int = 12) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.patch_embed = nn.Sequential(nn.Linear(768, embed_dim), nn.GELU())
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.blocks = AuthorsSequential(*[AuthorsBlock(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.attn_pool = AuthorsPooler(embed_dim, 8, 128)
        self.attn_pool_contrastive = AuthorsPooler(embed_dim, 8, 1)
        self.proj = nn.Parameter(embed_dim**-0.5 * torch.randn(embed_dim, embed_dim))

    def forward(self, patch_features, patch_coords, patch_size_lv0) -> torch.Tensor:  # no_proj=True
        x, bg_mask = authors_preprocess(patch_features, patch_coords, patch_size_lv0)
        _, _, w, h = x.shape
        x = x.flatten(2, 3).transpose(1, 2)
        attn_bias = authors_alibi(self.num_heads, w, h, bg_mask)
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        keep = torch.cat((torch.ones((1, 1), dtype=torch.bool), bg_mask.view(1, -1)), dim=1)
        x = x[keep].unsqueeze(0)
        for blk in self.blocks.modules_list:
            x = blk(x, attn_bias)
        x = self.norm(x)
        tokens = self.attn_pool(x)  # computed by the authors, unused for the slide embedding
        del tokens
        return self.attn_pool_contrastive(x).squeeze(1)


class AuthorsTitan(nn.Module):
    """modeling_titan.Titan: `vision_encoder` and the text tower (a stand-in: only its key prefix counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_encoder = AuthorsVisionTransformer()
        self.text_encoder = nn.Module()
        self.text_encoder.token_embedding = nn.Embedding(16, 8)

    def encode_slide_from_patch_features(self, feats, coords, patch_size_lv0) -> torch.Tensor:
        return self.vision_encoder(feats, coords, patch_size_lv0)


def _randomise(module: nn.Module, seed: int = 1) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale, centre = (0.1 if p.ndim == 1 else 0.05), (1.0 if name.endswith("norm.weight") else 0.0)
            p.copy_(torch.randn(p.shape, generator=g) * scale + centre)
    return module.eval()


@pytest.fixture(scope="module")
def authors(tmp_path_factory) -> tuple[AuthorsTitan, Path]:
    ref = _randomise(AuthorsTitan())
    path = tmp_path_factory.mktemp("titan") / "model.safetensors"  # the Hugging Face file and key layout
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref, path


def _slide(n: int = 60, seed: int = 0, mpp0: float = 0.25):
    """A slide at 40x (0.25 um/px): TRIDENT coords in level-0 px, patch_size_level0 = 1024 (512 px at 20x)."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(16 * 12, generator=g)[:n]
    cells = torch.stack([cells // 12, cells % 12], 1)  # gaps: a sparse tissue mask on a 16 x 12 grid
    coords_px = cells * 1024 + torch.tensor([3000, 1700])
    feats = torch.randn(n, 768, generator=g)
    return feats, coords_px, coords_px.double() * mpp0, 1024


def test_grid_from_micrometres_is_the_authors_grid() -> None:
    _, coords_px, coords_um, patch = _slide()
    g = titan_mod.tile_grid(coords_um.float(), 256.0)  # float32 micrometres, as bags hold them
    want = torch.floor_divide(coords_px - coords_px.min(0).values, patch)
    assert torch.equal(g, want)
    # STAMP's conversion (c54ce06 titan.py: coords_um / mpp, tile size in px) lands on the same grid
    stamp_px = (coords_um / 0.5).long()
    assert torch.equal(torch.floor_divide(stamp_px - stamp_px.min(0).values, 512), want)
    # a 20x slide whose micrometres are not exact in float32 (0.2527 um/px) still snaps to its own grid
    odd = (coords_px // 2).double() * 0.2527 * 2
    assert torch.equal(titan_mod.tile_grid(odd.float(), 1024 * 0.2527), want)
    assert titan_mod.alibi_slopes(12).tolist() == pytest.approx(authors_slopes(12), rel=1e-6)


def test_features_equal_the_authors_forward(authors, monkeypatch) -> None:
    ref, path = authors
    feats, coords_px, coords_um, patch = _slide()
    feats[7] = 0.0  # a background tile: dropped by the authors' mask
    coords_px[11] = coords_px[12] + 300  # a tile in another's cell: the authors sum their features
    coords_um = coords_px.double() * 0.25
    with torch.no_grad():
        want = ref.encode_slide_from_patch_features(feats, coords_px, patch)[0]
    model = build_slide_encoder("titan", weights=path)  # text_encoder.* in the file are dropped
    got = model.encode(feats, coords_um.float(), 256.0)
    assert got.shape == (768,) and len(model.weights_sha256) == 64
    assert F.cosine_similarity(got, want, dim=0) > 0.999
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    # float16 bags (wsi embed's default): the authors' fp32 grid refuses them, ours converts
    assert F.cosine_similarity(model.encode(feats.half(), coords_um.float(), 256.0), want, dim=0) > 0.999
    # query rows in blocks of 16 (scores capped at 16 rows x 60 tokens x 12 heads), MLP on 32 rows: same
    monkeypatch.setattr(titan_mod, "SCORE_BYTES", 4 * 12 * 60 * 16)
    monkeypatch.setattr(titan_mod, "ROW_CHUNK", 32)
    torch.testing.assert_close(model.encode(feats, coords_um.float(), 256.0), want, atol=1e-4, rtol=1e-4)


def test_parameter_count_is_the_published_config() -> None:
    vision = AuthorsVisionTransformer()  # config.json vision_config: depth 6, 768 wide, 12 heads, CoCa
    published = sum(p.numel() for p in vision.parameters())
    assert count_parameters("titan") == published == get_spec("titan").params == 48_539_904
    spec = get_spec("titan")
    assert spec.tile_encoders == ("conch-v1.5",) and spec.tile_um == 256.0 and spec.tile_mpp == 0.5
    assert spec.uses_positions and spec.dim == 768 and "titan" in SLIDE_ENCODERS.names()


@pytest.fixture(scope="module")
def model():
    return build_slide_encoder("titan", random_init=True)


def test_row_order_and_positions(model) -> None:
    feats, _, coords_um, _ = _slide(n=60, seed=3)
    coords = coords_um.float()
    a = model.encode(feats, coords, 256.0)
    perm = torch.randperm(60)
    torch.testing.assert_close(model.encode(feats[perm], coords[perm], 256.0), a, atol=1e-5, rtol=1e-5)
    # the grid starts at the first tile: moving the whole slide changes nothing
    torch.testing.assert_close(model.encode(feats, coords + 5000.0, 256.0), a, atol=1e-5, rtol=1e-5)
    # the same tiles spread twice as far apart, or their positions exchanged: other embeddings
    assert not torch.allclose(model.encode(feats, coords * 2, 256.0), a, atol=1e-3)
    assert not torch.allclose(model.encode(feats, coords[perm], 256.0), a, atol=1e-3)


def test_attention_blocks_stay_within_the_budget(model, monkeypatch) -> None:
    """The memory bound: no block of attention scores exceeds SCORE_BYTES, however many tiles."""
    feats, _, coords_um, _ = _slide(n=150, seed=5)
    full = model.encode(feats, coords_um.float(), 256.0)
    budget = 4 * 12 * 151 * 40  # 40 query rows of 151 tokens, 12 heads, float32
    monkeypatch.setattr(titan_mod, "SCORE_BYTES", budget)
    sizes: list[int] = []
    original = titan_mod.Titan._bias

    def spy(self, points, start, stop):
        out = original(self, points, start, stop)
        sizes.append(out.numel() * 4)
        return out

    monkeypatch.setattr(titan_mod.Titan, "_bias", spy)
    blocked = model.encode(feats, coords_um.float(), 256.0)
    assert max(sizes) <= budget and len(sizes) == 6 * math.ceil(151 / 40)
    torch.testing.assert_close(blocked, full, atol=1e-5, rtol=1e-5)


def test_bad_inputs_are_refused(authors, model, tmp_path) -> None:
    feats, _, coords_um, _ = _slide(n=10)
    with pytest.raises(ValueError, match="needs each tile's position"):
        model.encode(feats, None, 256.0)
    with pytest.raises(ValueError, match="all zeros"):
        model.encode(torch.zeros(10, 768), coords_um.float(), 256.0)
    _, path = authors
    from safetensors.torch import load_file

    state = load_file(str(path))
    del state["vision_encoder.attn_pool_contrastive.query"]
    broken = tmp_path / "broken.safetensors"
    save_file(state, str(broken))
    with pytest.raises(WeightsError, match=r"1 missing: attn_pool_contrastive\.query"):
        build_slide_encoder("titan", weights=broken)
    with pytest.raises(WeightsError, match="does not fit slide encoder 'feather'"):
        build_slide_encoder("feather", weights=path)


def _bag(path: Path, *, encoder: str = "conch-v1.5", dim: int = 768, seed: int = 0) -> None:
    _, coords_px, coords_um, _ = _slide(n=30, seed=seed)
    prov = BagProvenance(
        slide_id=path.stem, encoder=encoder, weights_sha256="a" * 64, tile_um=256.0, tile_px=512,
        mpp=0.25, level0_width=40000, level0_height=40000, tile_params={"tile_um": 256.0}, target_mpp=0.5,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bag(path, feats=torch.randn(30, dim).numpy(), coords_um=coords_um.numpy().astype(np.float32),
              coords_px=coords_px.numpy(), provenance=prov, dtype="float16")  # fmt: skip


def test_embed_slides_cli_and_wrong_tile_encoder(tmp_path: Path) -> None:
    _bag(tmp_path / "bags" / "good.h5")
    _bag(tmp_path / "bags" / "uni.h5", encoder="uni", dim=1024)
    result = CliRunner().invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder",
                                      "titan", "--random-init", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 1  # the bad slide fails alone
    assert "uni.h5 holds uni features, but slide encoder 'titan' reads conch-v1.5 features" in result.output
    assert [p.name for p in (tmp_path / "titan-slide").glob("*.h5")] == ["good.h5"]
    listing = CliRunner().invoke(cli, ["encoders", "--slide"])
    assert listing.exit_code == 0 and "titan" in listing.output and "conch-v1.5" in listing.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu(model, monkeypatch) -> None:
    feats, _, coords_um, _ = _slide(n=150, seed=9)
    want = model.encode(feats, coords_um.float(), 256.0)
    gpu = build_slide_encoder("titan", random_init=True).cuda()
    monkeypatch.setattr(titan_mod, "SCORE_BYTES", 4 * 12 * 151 * 40)  # blocks of query rows on the GPU too
    got = gpu.encode(feats.half().cuda(), coords_um.float().cuda(), 256.0).cpu()
    assert F.cosine_similarity(got, want, dim=0) > 0.999
