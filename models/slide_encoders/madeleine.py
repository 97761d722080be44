"""MADELEINE: multi-head ABMIL pretrained by multistain (H&E vs IHC) alignment, Jaume et al. ECCV 2024.

As mahmoodlab/MADELEINE 419287d builds it (madeleine/models/Model.py `MADELEINE`, stain_encoding=False,
config of scripts/launch_pretrain_withoutStainEncodings.sh: 512 wide, 4 heads): `pre_attn` = 3 x
(Linear, LayerNorm, GELU, Dropout) widening to 512 * 4; column e*4 + c is feature e of head c (the head
index is the fast one); each head a gated `BatchedABMIL` with its own softmax over the tiles; the
pooled vectors, flattened back, go through `projector` Linear(2048, 512). The slide embedding is
`encode_he`, as TRIDENT a91fa84 (MadeleineSlideEncoder) and STAMP c54ce06 (encoder/madeleine.py) call it.
Weights: huggingface.co/MahmoodLab/madeleine model.pt. Tiles: CONCH v1 (512-d) of 256 px tiles at 10x
(README; TRIDENT `--patch_size 256 --mag 10`). No positions; a patient's tiles form one bag (STAMP).
Precision: float32 with float64 pooling (the authors run CUDA autocast in the config's precision).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from wsi.models.slide_encoders import base
from wsi.models.slide_encoders.base import SLIDE_ENCODERS, SlideEncoder, SlideEncoderSpec, StateDict

N_HEADS = 4
HIDDEN = 512


class _BatchedABMIL(nn.Module):
    """madeleine/models/abmil.py BatchedABMIL(input_dim=512, hidden_dim=512, dropout=True), eval mode."""

    def __init__(self, dim: int = HIDDEN, attn_dim: int = HIDDEN) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, attn_dim), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(dim, attn_dim), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(attn_dim, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (n, dim) -> (n,) raw scores
        return self.attention_c(self.attention_a(h) * self.attention_b(h))[:, 0]


def _block(d_in: int, d_out: int) -> list[nn.Module]:
    return [nn.Linear(d_in, d_out), nn.LayerNorm(d_out), nn.GELU(), nn.Dropout(0.1)]


class _ABMILEmbedder(nn.Module):
    """Model.py ABMILEmbedder: the shared pre-attention MLP and one gated attention per head."""

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.pre_attn = nn.Sequential(
            *_block(in_dim, HIDDEN), *_block(HIDDEN, HIDDEN), *_block(HIDDEN, HIDDEN * N_HEADS)
        )
        self.attn = nn.ModuleList([_BatchedABMIL() for _ in range(N_HEADS)])


def multi_head_pool(
    heads_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    feats: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """Per head c: sum_i softmax_i(s[:, c]) h[i, :, c], `chunk` tiles at a time (online softmax per head).

    heads_of(x (n, D)) -> (scores (n, H), values (n, E, H)); returns (E, H) float32. Exactly the one-pass
    result (running maximum per head, float64 sums), with activations bounded by one chunk.
    """
    if feats.shape[0] == 0:
        raise ValueError("an empty bag has no slide embedding")
    chunk = chunk or base.CHUNK_TILES  # read now: the benchmark sets it to N for one pass
    run_max: torch.Tensor | None = None
    total = acc = None
    for start in range(0, feats.shape[0], chunk):
        s, v = heads_of(feats[start : start + chunk])
        s, v = s.double(), v.double()
        chunk_max = s.max(0).values  # (H,)
        new_max = chunk_max if run_max is None else torch.maximum(run_max, chunk_max)
        w = torch.exp(s - new_max)  # (n, H)
        part_total, part_acc = w.sum(0), (v * w[:, None, :]).sum(0)
        if run_max is None or total is None or acc is None:
            total, acc = part_total, part_acc
        else:
            scale = torch.exp(run_max - new_max)
            total, acc = total * scale + part_total, acc * scale + part_acc
        run_max = new_max
    assert acc is not None and total is not None
    return (acc / total).float()


@SLIDE_ENCODERS.register("madeleine")
class Madeleine(SlideEncoder):
    """MADELEINE (H&E branch, `encode_he`): 512-d CONCH v1 tiles -> 512-d slide embedding."""

    SPEC = SlideEncoderSpec(
        tile_encoders=("conch-v1",), tile_um=256.0, tile_mpp=1.0, in_dim=512, dim=512,
        # every tensor of MADELEINE(config, stain_encoding=False) with the published config: pre_attn
        # 1,582,080 + 4 heads x 525,825 + token_projector 262,272 + projector 1,049,088
        params=4_996_740,
        licence="CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)",
        weights_page="https://huggingface.co/MahmoodLab/madeleine",
        weights_files=("model.pt",),
        reference="mahmoodlab/MADELEINE 419287d madeleine/models/Model.py + abmil.py + "
        "scripts/launch_pretrain_withoutStainEncodings.sh",
        uses_positions=False, patient_fusion="early",  # STAMP: a patient's tiles concatenated
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.token_projector = nn.Linear(HIDDEN * N_HEADS, 128)  # pretraining loss only; in the checkpoint
        self.wsi_embedders = _ABMILEmbedder(self.SPEC.in_dim)
        self.projector = nn.Linear(HIDDEN * N_HEADS, HIDDEN)

    def authors_to_ours(self, state: StateDict) -> StateDict:
        if any("module" in k for k in state):  # a DDP checkpoint: create_model strips 7 characters
            return {k.removeprefix("module."): v for k, v in state.items()}
        return state

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.wsi_embedders.pre_attn(x.float()).unflatten(-1, (HIDDEN, N_HEADS))  # (n, E, H): e*H + c
        scores = torch.stack([net(h[:, :, c]) for c, net in enumerate(self.wsi_embedders.attn)], dim=-1)
        return scores, h

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        del coords_um, tile_um  # attention pooling: permutation invariant, reads no positions
        pooled = multi_head_pool(self._heads, feats)  # (512, 4)
        return self.projector(pooled.flatten())  # flattened e*4 + c, as .view(bs, d_out * n_heads)
