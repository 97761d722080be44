"""COBRA II: Mamba-2 over tile embeddings, multi-head gated attention, weights for the raw tiles (Lenz et al.
CVPR 2025).

As KatherLab/COBRA 49d2311 builds it (cobra/model/cobra.py `Cobra`, cobra/utils/load_cobra.py
`get_cobraII`: one layer, 4 heads, d_state 128, embed_dim 768), which STAMP (c54ce06
src/stamp/encoding/encoder/cobra.py) loads. Eval forward: a per-width embedding (LayerNorm, Linear,
SiLU, Linear), `Mamba2Enc` (pre-norm residual Mamba-2 layers, cobra/utils/mamba2.py, written out in plain
torch: mamba_ssm is CUDA only), LayerNorm, 4 heads of gated-attention scores averaged, softmax over the
tiles; the slide embedding is that softmax @ the *raw* tile features (the tile encoder's width). Tiles:
CONCH v1, UNI, Virchow2 (its class-token half of wsi's [class, mean] bags), H-optimus-0 at 224 um /
224 px (extract_feats.py). A patient's bags are concatenated in slide order (get_pat_embs).
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import nn

from wsi.models.slide_encoders import base
from wsi.models.slide_encoders.base import SLIDE_ENCODERS, SlideEncoder, SlideEncoderSpec, StateDict
from wsi.models.slide_encoders.mamba2 import Mamba2Mixer, State

EMBED_DIM = 768
INPUT_DIMS = (512, 1024, 1280, 1536)
N_HEADS, ATT_DIM, D_STATE, LAYERS = 4, 256, 128, 1


class _Embed(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, EMBED_DIM), nn.Dropout(0.25), nn.SiLU(),
                                  nn.Linear(EMBED_DIM, EMBED_DIM))  # fmt: skip


class _Mamba2Enc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._fc1 = nn.Sequential(nn.Linear(EMBED_DIM, EMBED_DIM), nn.GELU(), nn.Dropout(0.2))
        self.norm = nn.LayerNorm(EMBED_DIM)  # in the checkpoint, unused by the authors' forward
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(EMBED_DIM), Mamba2Mixer(EMBED_DIM, D_STATE)) for _ in range(LAYERS)]
        )
        self.classifier = nn.Linear(EMBED_DIM, EMBED_DIM)

    def forward(self, x: torch.Tensor, states: list[State]) -> torch.Tensor:
        h = self._fc1(x)
        for i, layer in enumerate(self.layers):
            norm, mixer = cast(nn.Sequential, layer)
            out, states[i] = mixer(norm(h), states[i])
            h = h + out
        return self.classifier(h)


class _BatchedABMIL(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, ATT_DIM), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(dim, ATT_DIM), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(ATT_DIM, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # raw scores (n,)
        return self.attention_c(self.attention_a(h) * self.attention_b(h))[:, 0]


class _Cobra(SlideEncoder):
    """COBRA II on one tile encoder's features (the model holds all four input branches)."""

    TILE_DIM: ClassVar[int] = 1024  # the embed branch used
    IN_DIM: ClassVar[int] = 1024  # the bag's width (Virchow2: wsi's [class, mean] bags)

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.ModuleDict({str(d): _Embed(d) for d in INPUT_DIMS})
        self.norm = nn.LayerNorm(EMBED_DIM)
        self.mamba_enc = _Mamba2Enc()
        self.attn = nn.ModuleList([_BatchedABMIL(EMBED_DIM // N_HEADS) for _ in range(N_HEADS)])

    def authors_to_ours(self, state: StateDict) -> StateDict:
        """As get_cobraII: a pretraining checkpoint's `momentum_enc.` tensors (not `momentum_enc.proj`),
        a STAMP fine-tune's `cobra.` ones, or a bare state dict."""
        if any("momentum_enc" in k for k in state):  # a pretraining checkpoint, as get_cobraII reads it
            return {k.split("momentum_enc.")[-1]: v for k, v in state.items()
                    if "momentum_enc" in k and "momentum_enc.proj" not in k}  # fmt: skip
        if any(k.startswith("cobra.") for k in state):  # a STAMP fine-tune
            return {k.split("cobra.")[-1]: v for k, v in state.items() if "cobra" in k}
        return state

    def _scores(self, x: torch.Tensor, states: list[State]) -> torch.Tensor:
        embed = cast(_Embed, self.embed[str(self.TILE_DIM)])
        h = self.norm(self.mamba_enc(embed.head(x), states))
        h = h.unflatten(-1, (EMBED_DIM // N_HEADS, N_HEADS))  # (n, e, c): column e*4 + c
        return torch.stack([net(h[:, :, c]) for c, net in enumerate(self.attn)], -1).mean(-1)

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        """Mamba-2 reads the tiles as a sequence. The authors feed the file's row order and pretrained on
        randomly permuted tiles (cobra/ssl/data.py pad_or_sample), so no order is theirs: the tiles are
        sorted by position so that the embedding is a function of the slide, not of the bag's row order.
        Streamed `CHUNK_TILES` at a time (Mamba's states carried between chunks, online softmax): exact,
        and bounded on 100,000-tile slides."""
        del tile_um
        n = feats.shape[0]
        order = raster_order(coords_um) if coords_um is not None else torch.arange(n, device=feats.device)
        states = [cast(Mamba2Mixer, cast(nn.Sequential, layer)[1]).initial_state(feats.device)
                  for layer in self.mamba_enc.layers]  # fmt: skip

        def rows(idx: torch.Tensor) -> torch.Tensor:  # gathered per chunk: the bag is never copied whole
            return feats[idx, : self.TILE_DIM].float()

        def scores(idx: torch.Tensor) -> torch.Tensor:  # called once per chunk, in sequence order
            return self._scores(rows(idx), states)

        return base.streaming_attention_pool(scores, rows, order)


def raster_order(coords_um: torch.Tensor) -> torch.Tensor:
    """Row indices sorted by y, then x (a stable sort: tiles at one position keep their file order)."""
    by_x = torch.argsort(coords_um[:, 0].double(), stable=True)
    return by_x[torch.argsort(coords_um[by_x, 1].double(), stable=True)]


def _spec(tile_encoder: str, in_dim: int, dim: int) -> SlideEncoderSpec:
    return SlideEncoderSpec(
        tile_encoders=(tile_encoder,), tile_um=224.0, tile_mpp=1.0, in_dim=in_dim, dim=dim,
        params=COBRA_II_PARAMS,
        licence="GPL-3.0 (KatherLab/COBRA LICENSE; weights gated on Hugging Face, model card terms)",
        weights_page="https://huggingface.co/KatherLab/COBRA", weights_files=("cobraII.pth.tar",),
        reference="KatherLab/COBRA 49d2311 cobra/model/cobra.py + utils/load_cobra.py get_cobraII + "
        "utils/mamba2.py; state-spaces/mamba e9594ce mamba_ssm/modules/mamba2.py",
        # positions order the sequence (`encode`), so bags without micrometre positions are refused
        uses_positions=True, patient_fusion="early",  # COBRA get_pat_embs and STAMP: tiles concatenated
    )  # fmt: skip


# embed branches 5,716,480 (sum over D of LayerNorm(D), Linear(D, 768), Linear(768, 768)) + Mamba2Enc
# 4,948,808 (fc1, unused norm, LayerNorm, in_proj 768x3352, conv 1792x4 + 1792, dt_bias/A_log/D 3x24, rmsnorm
# 1536, out_proj 1536x768, classifier) + norm 1,536 +
# 4 heads x (2 x (192x256 + 256) + 257); checked against the authors' module in the test
COBRA_II_PARAMS = 11_063_116


@SLIDE_ENCODERS.register("cobra-uni")
class CobraUni(_Cobra):
    TILE_DIM = IN_DIM = 1024
    SPEC = _spec("uni", 1024, 1024)


@SLIDE_ENCODERS.register("cobra-h-optimus-0")
class CobraHOptimus0(_Cobra):
    TILE_DIM = IN_DIM = 1536
    SPEC = _spec("h-optimus-0", 1536, 1536)


@SLIDE_ENCODERS.register("cobra-virchow2")
class CobraVirchow2(_Cobra):
    TILE_DIM, IN_DIM = 1280, 2560
    SPEC = _spec("virchow2", 2560, 1280)


@SLIDE_ENCODERS.register("cobra-conch")
class CobraConch(_Cobra):
    TILE_DIM = IN_DIM = 512
    SPEC = _spec("conch-v1", 512, 512)
