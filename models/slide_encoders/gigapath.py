"""Prov-GigaPath's slide encoder: a 12-layer LongNet over GigaPath tile features (Xu et al., Nature 2024).

As prov-gigapath/prov-gigapath 09d8e87 builds `gigapath_slide_enc12l768d` (gigapath/slide_encoder.py
LongNetViT: PatchEmbed Linear(1536, 768), a class token, the fixed 2D sin-cos table of pos_embed.py over
a 1000 x 1000 grid, the LongNet encoder of longnet.py with segment lengths from
`get_optimal_segment_length(262144, 256)` and dilations 1..16, a final LayerNorm(eps 1e-6)); 86,330,880
parameters (demo/run_gigapath.ipynb). `slide_encoder.pth` holds {"model": state_dict} in these names.
Positions: `grid_cells`. Which hidden state: `gigapath` takes all_layer_embed[11] (TRIDENT, and the
authors' fine-tuning default `--feat_layer 11`), `gigapath-last` takes `encoder_out` (12 layers and the
encoder's layer_norm: what `slide_encoder(x, coords)` returns and STAMP stores); one checkpoint.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from wsi.core.errors import BagFormatError
from wsi.models.slide_encoders.base import SLIDE_ENCODERS, SlideEncoder, SlideEncoderSpec
from wsi.models.slide_encoders.longnet import ROW_CHUNK, LongNetConfig, LongNetEncoder

#: grid cells per side of the authors' position table (LongNetViT slide_ngrids)
SLIDE_NGRIDS = 1000
#: a coordinate this close below a cell boundary (in tiles) belongs to the next cell: micrometre
#: coordinates of level-0 pixels at e.g. 0.2525 um/px divide to 3.99999 where the authors' pixels give 4
_CELL_TOLERANCE = 1e-3
_REFERENCE = (
    "prov-gigapath/prov-gigapath 09d8e87 gigapath/slide_encoder.py, gigapath/pos_embed.py, "
    "gigapath/torchscale (LongNet, dilated_attention.py); mahmoodlab/TRIDENT a91fa84 GigaPathSlideEncoder"
)


def sincos_1d(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """pos_embed.py get_1d_sincos_pos_embed_from_grid: [sin(pos w), cos(pos w)], w = 1e4^(-2i/dim)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    out = pos.to(torch.float64)[:, None] * omega[None, :]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def position_embedding(cells: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows of get_2d_sincos_pos_embed(dim, ngrids) for cells (N, 2) = (x, y), float64, without the table.

    The table is built from np.meshgrid(grid_w, grid_h), so row 1 + x * ngrids + y holds the embedding of
    the fast index (y) in its first half and of the slow index (x) in its second half."""
    return torch.cat([sincos_1d(cells[:, 1], dim // 2), sincos_1d(cells[:, 0], dim // 2)], dim=1)


def grid_cells(coords_um: torch.Tensor, tile_um: float, ngrids: int = SLIDE_NGRIDS) -> torch.Tensor:
    """Tile top-left corners in micrometres -> the authors' grid cells (N, 2) int64 (x, y).

    The authors' `coords_to_pos` takes floor(coords / tile_size) and indexes row cell_x * 1000 + cell_y + 1
    of the table; their answer (prov-gigapath issue 116) is coordinates at the tiles' own level (256 px at
    0.5 um/px): the cell is the tile index. TRIDENT (a91fa84 GigaPathSlideEncoder: level-0 tile size) and
    STAMP (c54ce06 encoding/encoder/gigapath.py: um / tile um/px, after its issue 159) give the same
    cells. Never rescaled; a slide beyond the 1000-tile grid (128 mm) is refused, not wrapped."""
    if not tile_um > 0:
        raise BagFormatError(f"tile size {tile_um} um: Prov-GigaPath needs the tile size to place tiles")
    cells = torch.floor(coords_um.to(torch.float64) / tile_um + _CELL_TOLERANCE).to(torch.int64)
    if cells.numel() and (int(cells.min()) < 0 or int(cells.max()) >= ngrids):
        hi = coords_um.to(torch.float64).amax(0) / 1000
        raise BagFormatError(
            f"tile positions reach x {hi[0]:.1f} mm, y {hi[1]:.1f} mm (min {coords_um.min():.0f} um): beyond "
            f"Prov-GigaPath's grid of {ngrids} x {ngrids} tiles of {tile_um:g} um (the authors' "
            "slide_ngrids); is this one slide, with coordinates from its top-left corner?"
        )
    return cells


def tiler_order(cells: torch.Tensor, coords_um: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """Row-major order (y, then x), as the authors' tiler lists tiles; exact ties by position, then by
    the features, so that any permutation of a bag's rows gives one sequence."""
    sums = torch.cat([feats[s : s + ROW_CHUNK].float().sum(1) for s in range(0, feats.shape[0], ROW_CHUNK)])
    keys = [sums.double().cpu(), coords_um[:, 0].double().cpu(),
            coords_um[:, 1].double().cpu(), cells[:, 0].cpu(), cells[:, 1].cpu()]  # fmt: skip
    order = torch.arange(cells.shape[0])
    for key in keys:  # stable sorts, least significant key first
        order = order[torch.sort(key[order], stable=True).indices]
    return order.to(feats.device)


class _PatchEmbed(nn.Module):
    """slide_encoder.py PatchEmbed: Linear(in_chans, embed_dim), no norm."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, dim)


class _GigaPath(SlideEncoder):
    """LongNetViT(in_chans=1536, embed_dim=768, depth=12), global pooling, the hidden state `LAYER`."""

    #: index into the authors' all_layer_embed list (0 = input, 12 = last layer); None: encoder_out
    LAYER: ClassVar[int | None] = 11

    def __init__(self, config: LongNetConfig | None = None, in_dim: int = 1536, ngrids: int = SLIDE_NGRIDS):
        super().__init__()
        self.config = cfg = config or LongNetConfig()
        self.ngrids = ngrids
        self.patch_embed = _PatchEmbed(in_dim, cfg.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.encoder = LongNetEncoder(cfg)
        self.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        for module in self.modules():  # the authors' initialisation (only --random-init sees it)
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.cls_token, std=0.02)

    @torch.no_grad()
    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        """The class token is untrained (demo/4_load_slide_encoder.py), so global_pool: the mean of the tile
        tokens after `LAYER` layers, then `norm`. LongNet's segments make the order matter: tiles go in
        the authors' tiler order (gigapath/preprocessing/data/tiling.py), so shuffled rows embed alike."""
        if feats.shape[0] == 0:
            raise ValueError("an empty bag has no slide embedding")
        if coords_um is None:
            raise BagFormatError("Prov-GigaPath's slide encoder needs the tiles' positions in micrometres")
        cells = grid_cells(coords_um, tile_um, self.ngrids)
        order = tiler_order(cells, coords_um, feats)  # rows picked chunk by chunk: the bag is not copied
        cells = cells[order.to(cells.device)]
        dim, device = self.config.dim, self.cls_token.device
        x = torch.empty(feats.shape[0] + 1, dim, dtype=torch.float32, device=device)
        x[0] = self.cls_token[0, 0]  # + pos_embed[0], which is zeros
        proj = self.patch_embed.proj
        for s in range(0, feats.shape[0], ROW_CHUNK):
            pos = position_embedding(cells[s : s + ROW_CHUNK].cpu(), dim).to(device, torch.float32)
            rows = feats[order[s : s + ROW_CHUNK]].to(device, torch.float32)
            x[1 + s : 1 + s + ROW_CHUNK] = proj(rows) + pos
        layers = self.encoder.layers if self.LAYER is None else self.encoder.layers[: self.LAYER]
        for layer in layers:
            x = layer(x)
        if self.LAYER is None:
            x = self.encoder.final_norm(x)
        return self.norm(x[1:].mean(0))


def _spec(output: str) -> SlideEncoderSpec:
    return SlideEncoderSpec(
        tile_encoders=("prov-gigapath",), tile_um=128.0, tile_mpp=0.5, in_dim=1536, dim=768,
        params=86_330_880,  # demo/run_gigapath.ipynb: "Slide encoder param # 86330880"
        licence="Apache-2.0 (LICENSE since 2025-03; model card: research use only, gated on Hugging Face)",
        weights_page="https://huggingface.co/prov-gigapath/prov-gigapath",
        weights_files=("slide_encoder.pth",), reference=f"{_REFERENCE}; output: {output}",
        # the authors say nothing on patients; STAMP lays a patient's slides side by side on one grid,
        # which can overflow the 1000-tile grid: the mean of the slide embeddings instead
        uses_positions=True, patient_fusion="late",
    )  # fmt: skip


@SLIDE_ENCODERS.register("gigapath")
class GigaPath(_GigaPath):
    """Prov-GigaPath slide encoder, all_layer_embed[11] mean-pooled (TRIDENT; authors' fine-tuning)."""

    LAYER = 11
    SPEC = _spec("all_layer_embed[11], global_pool (TRIDENT, finetune --feat_layer 11)")


@SLIDE_ENCODERS.register("gigapath-last")
class GigaPathLast(_GigaPath):
    """Prov-GigaPath slide encoder, encoder_out mean-pooled (slide_encoder(x, coords); STAMP)."""

    LAYER = None
    SPEC = _spec("encoder_out, global_pool (slide_encoder(x, coords), STAMP)")
