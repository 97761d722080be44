"""TITAN's slide encoder: a ViT over the 2D grid of CONCH v1.5 tile features with 2D ALiBi (Ding et al. 2024).

The authors publish the code only on Hugging Face (MahmoodLab/TITAN); we follow its verbatim copy in
DIAGNijmegen/unicorn_baseline dec3809 (src/unicorn_baseline/vision/pathology/titan/) and its config.json:
depth 6, width 768, 12 heads, MLP ratio 4, qkv bias, patch_embed Linear + GELU, a class token, ALiBi
instead of absolute positions, final LayerNorm (eps 1e-6), CoCa attentional poolers (`attn_pool`, 128
queries; `attn_pool_contrastive`, 1 query; 8 heads) and `proj`. `encode_slide_from_patch_features` uses
`no_proj=True`: the embedding is `attn_pool_contrastive`'s 768-d output over all tokens, before `proj`
(kept, with `attn_pool`, so the checkpoint loads key for key; `text_encoder.*` is dropped). Tiles on the
grid of `tile_grid`; all-zero features are background and dropped; tiles sharing a cell are summed.
Tiles: CONCH v1.5 features of 512 px tiles at 20x (0.5 um/px; TRIDENT `--patch_size 512 --mag 20`).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from wsi.models.slide_encoders.base import SLIDE_ENCODERS, SlideEncoder, SlideEncoderSpec, StateDict

log = logging.getLogger("wsi.models.slide_encoders")

#: bytes of attention scores (heads x query rows x all tokens, float32) one block may hold
SCORE_BYTES = 128 * 2**20
#: rows embedded (patch_embed, K/V projections, final norm) at once
ROW_CHUNK = 8192
#: a coordinate this close (in tiles) below a grid line counts as on it (float32 micrometres)
_GRID_TOL = 1e-3


def alibi_slopes(heads: int) -> torch.Tensor:
    """Press et al.'s ALiBi slopes (a geometric sequence; interleaved when `heads` is not a power of 2)."""

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return torch.tensor(power_of_2(heads))
    low = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_2(low) + power_of_2(2 * low)[0::2][: heads - low])


def tile_grid(coords_um: torch.Tensor, tile_um: float) -> torch.Tensor:
    """(N, 2) grid cells floor((coords - min) / tile side), int64: TITAN's positions from micrometres.

    As vision_transformer.py `preprocess_features` places tiles: TRIDENT (a91fa84 TitanSlideEncoder, IO.py)
    passes level-0 pixels and patch_size_level0, STAMP (c54ce06 encoder/titan.py) coords_um / mpp and the
    tile px; both give this grid at the slide's own scale, never a rescaled or squashed one (STAMP issue
    159). The ALiBi bias between two tiles is -slope_h * their Euclidean grid distance (none to or from
    the class token)."""
    if tile_um <= 0:
        raise ValueError(f"TITAN needs the tile side in micrometres, got {tile_um}")
    coords = coords_um.detach().cpu().double()  # float64 on the CPU: MPS has no float64
    rel = (coords - coords.min(0).values) / float(tile_um)
    return torch.floor(rel + _GRID_TOL).long()


class _Mlp(nn.Module):
    """timm Mlp as the authors' Block uses it (fc1, GELU, fc2; no dropout in eval)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)


class _Block(nn.Module):
    """Pre-norm transformer block (norm1, attn, norm2, mlp), LayerNorm eps 1e-6, no layer scale."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio))


class _Blocks(nn.Module):
    """The authors' CustomSequential (its modules live in `modules_list`)."""

    def __init__(self, blocks: list[_Block]) -> None:
        super().__init__()
        self.modules_list = nn.ModuleList(blocks)


class _AttentionalPooler(nn.Module):
    """CoCa attentional pooler: learned queries attend (nn.MultiheadAttention) over LayerNormed tokens."""

    def __init__(self, dim: int, heads: int, queries: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(queries, dim))
        self.attn = nn.MultiheadAttention(dim, heads, kdim=dim, vdim=dim)
        self.ln_q = nn.LayerNorm(dim)
        self.ln_k = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, dim) -> (queries, dim)
        q = self.ln_q(self.query)[:, None]  # (L, 1, dim): sequence-first, batch of one
        kv = self.ln_k(x)[:, None]
        return self.attn(q, kv, kv, need_weights=False)[0][:, 0]


@SLIDE_ENCODERS.register("titan")
class Titan(SlideEncoder):
    """TITAN's vision tower (TITAN-V + CoCa poolers): 768-d CONCH v1.5 tiles -> 768-d slide embedding."""

    SPEC = SlideEncoderSpec(
        tile_encoders=("conch-v1.5",), tile_um=256.0, tile_mpp=0.5, in_dim=768, dim=768,
        # every tensor of the vision tower built from config.json (the text tower is not loaded)
        params=48_539_904,
        licence="CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)",
        weights_page="https://huggingface.co/MahmoodLab/TITAN",
        weights_files=("model.safetensors",),
        reference=(
            "MahmoodLab/TITAN (Hugging Face) vision_transformer.py + modeling_titan.py + config.json, as "
            "vendored in DIAGNijmegen/unicorn_baseline dec3809 src/unicorn_baseline/vision/pathology/titan/; "
            "positions as mahmoodlab/TRIDENT a91fa84 and KatherLab/STAMP c54ce06 pass them"
        ),
        # the authors do not combine slides; STAMP lays a patient's slides side by side as one virtual
        # slide (encode_patients_), we average the slide embeddings instead
        uses_positions=True, patient_fusion="late",
    )  # fmt: skip
    _neg_slopes: torch.Tensor  # -ALiBi slope per head (a buffer: follows the model to its device)

    def __init__(
        self,
        *,
        dim: int = 768,
        depth: int = 6,
        heads: int = 12,
        mlp_ratio: float = 4.0,
        in_dim: int = 768,
        pool_heads: int = 8,
        pool_queries: int = 128,
    ) -> None:
        """Defaults: the published config; smaller ones only for benchmarks of a tiny model on CPU."""
        super().__init__()
        self.heads = heads
        self.patch_embed = nn.Sequential(nn.Linear(in_dim, dim), nn.GELU())
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = _Blocks([_Block(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.attn_pool = _AttentionalPooler(dim, pool_heads, pool_queries)
        self.attn_pool_contrastive = _AttentionalPooler(dim, pool_heads, 1)
        self.proj = nn.Parameter(dim**-0.5 * torch.randn(dim, dim))
        self.register_buffer("_neg_slopes", -alibi_slopes(heads), persistent=False)

    def authors_to_ours(self, state: StateDict) -> StateDict:
        """Hugging Face layout: `vision_encoder.*` (kept, prefix removed) and `text_encoder.*` (dropped)."""
        out = {k.removeprefix("vision_encoder."): v for k, v in state.items()}
        return {k: v for k, v in out.items() if not k.startswith("text_encoder.")}

    # ----------------------------------------------------------------------------------------- input
    def tokens(
        self, feats: torch.Tensor, coords_um: torch.Tensor, tile_um: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Grid features (raster order, duplicates summed, all-zero cells dropped) and their cells (float)."""
        cells = tile_grid(coords_um, tile_um).to(feats.device)
        width = int(cells[:, 1].max()) + 1
        key = cells[:, 0] * width + cells[:, 1]  # the authors' raster order: x outer, y inner
        uniq, inverse = torch.unique(key, return_inverse=True)
        if len(uniq) < len(key):
            log.warning(
                "TITAN: %d of %d tiles share a grid cell of %g um with another tile (overlapping tiles?); "
                "their features are summed, as the authors' preprocess_features does",
                len(key) - len(uniq), len(key), tile_um,
            )  # fmt: skip
        grid = torch.zeros(len(uniq), feats.shape[1], device=feats.device)
        for start in range(0, len(key), ROW_CHUNK):  # float16 bags: convert a chunk at a time
            grid.index_add_(0, inverse[start : start + ROW_CHUNK], feats[start : start + ROW_CHUNK].float())
        keep = grid.ne(0).any(1)  # the authors' background mask
        if not bool(keep.any()):
            raise ValueError("every tile feature is all zeros: TITAN sees only background")
        grid, uniq = grid[keep], uniq[keep]
        points = torch.stack([uniq // width, uniq % width], 1).float()
        return grid, points

    # ------------------------------------------------------------------------------------- attention
    def _bias(self, points: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """ALiBi bias (heads, stop - start, T) of token rows start:stop against all T tokens (0 = class)."""
        # exact Euclidean distances (not the |a|^2 + |b|^2 - 2ab matrix-product shortcut)
        dist = torch.cdist(points[start:stop], points, compute_mode="donot_use_mm_for_euclid_dist")
        dist[:, 0] = 0.0  # the class token is at no distance from anything
        if start == 0:
            dist[0] = 0.0
        return self._neg_slopes[:, None, None] * dist[None]

    def _block(self, blk: _Block, x: torch.Tensor, points: torch.Tensor) -> None:
        """x (T, dim) <- blk(x), in place: K/V of all tokens, then rows a chunk at a time (projections and
        MLP on `ROW_CHUNK` rows, attention scores on as many query rows as `SCORE_BYTES` allows).

        The authors build the dense (N+1)^2 bias for every head (~0.5 TB at 100,000 tiles); here attention
        is exact over every tile, its bias built per block of rows: memory O(N * width), time O(N^2)."""
        t, dim = x.shape
        h, hd = self.heads, dim // self.heads
        w_q, w_k, w_v = blk.attn.qkv.weight.split(dim)
        b_q, b_k, b_v = blk.attn.qkv.bias.split(dim)
        k = torch.empty(1, h, t, hd, device=x.device)
        v = torch.empty(1, h, t, hd, device=x.device)
        for s in range(0, t, ROW_CHUNK):
            y = blk.norm1(x[s : s + ROW_CHUNK])
            k[0, :, s : s + len(y)] = F.linear(y, w_k, b_k).view(-1, h, hd).transpose(0, 1)
            v[0, :, s : s + len(y)] = F.linear(y, w_v, b_v).view(-1, h, hd).transpose(0, 1)
        rows = max(1, min(t, SCORE_BYTES // (4 * h * t)))
        for s in range(0, t, ROW_CHUNK):
            e = min(t, s + ROW_CHUNK)
            # rows s:e of x are still this block's input: earlier chunks only changed their own rows
            q = F.linear(blk.norm1(x[s:e]), w_q, b_q).view(-1, h, hd).transpose(0, 1)[None]
            out = torch.empty(e - s, h, hd, device=x.device)
            for a in range(s, e, rows):
                b = min(e, a + rows)
                bias = self._bias(points, a, b)[None]
                att = F.scaled_dot_product_attention(q[:, :, a - s : b - s], k, v, attn_mask=bias)
                out[a - s : b - s] = att[0].transpose(0, 1)
            x[s:e] += blk.attn.proj(out.view(e - s, dim))
            x[s:e] += blk.mlp(blk.norm2(x[s:e]))

    @torch.no_grad()
    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        if coords_um is None:
            raise ValueError("TITAN needs each tile's position (coords in micrometres)")
        if feats.shape[0] == 0:
            raise ValueError("an empty bag has no slide embedding")
        if coords_um.shape != (feats.shape[0], 2):
            raise ValueError(f"coords {tuple(coords_um.shape)} do not match features {tuple(feats.shape)}")
        grid, cells = self.tokens(feats, coords_um, tile_um)
        n, dim = grid.shape[0], self.cls_token.shape[-1]
        x = torch.empty(n + 1, dim, device=grid.device)
        x[0] = self.cls_token[0, 0]
        for s in range(0, n, ROW_CHUNK):
            x[1 + s : 1 + s + ROW_CHUNK] = self.patch_embed(grid[s : s + ROW_CHUNK])
        del grid
        points = torch.cat([cells.new_zeros(1, 2), cells])  # row 0: the class token (never biased)
        for blk in self.blocks.modules_list:
            self._block(blk, x, points)  # type: ignore[arg-type]
        for s in range(0, n + 1, ROW_CHUNK):
            x[s : s + ROW_CHUNK] = self.norm(x[s : s + ROW_CHUNK])
        return self.attn_pool_contrastive(x)[0].float()  # no_proj=True: before `proj`
