"""FEATHER: ABMIL pretrained on a 108-way pan-cancer classification (PC-108, 24K slides), Shao et al. 2025.

As mahmoodlab/MIL-Lab dfc3c17 builds `abmil.base.<encoder>.pc108-24k` (src/models/abmil.py `ABMIL`,
src/model_configs/abmil/base.yaml: embed 512, attn 384, one gated head): patch_embed Linear(in, 512) +
ReLU, GlobalGatedAttention, softmax over the tiles; the slide embedding is `forward_features`, the
attention-weighted sum of the *embedded* tiles (512-d). The checkpoints carry no classifier and prefix
their tensors `model.` (ABMILModel wraps ABMIL). TRIDENT (a91fa84 slide_encoder_models/load.py
FeatherSlideEncoder) feeds CONCH v1.5 features of 512 px tiles at 20x (UNI2: 256 px at 20x). No
positions: row order cannot matter.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from wsi.models.slide_encoders.base import (
    SLIDE_ENCODERS,
    SlideEncoder,
    SlideEncoderSpec,
    StateDict,
    streaming_attention_pool,
)

_REFERENCE = (
    "mahmoodlab/MIL-Lab dfc3c17 src/models/abmil.py + src/model_configs/abmil/base.yaml; "
    "mahmoodlab/TRIDENT a91fa84 trident/slide_encoder_models/load.py FeatherSlideEncoder"
)
_LICENCE = "CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)"


class _GatedAttention(nn.Module):
    """Tanh branch times sigmoid branch, then one score per tile (MIL-Lab layers.GlobalGatedAttention)."""

    def __init__(self, dim: int, attn_dim: int) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, attn_dim), nn.Tanh(), nn.Dropout(0.0))
        self.attention_b = nn.Sequential(nn.Linear(dim, attn_dim), nn.Sigmoid(), nn.Dropout(0.0))
        self.attention_c = nn.Linear(attn_dim, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (n, dim) -> (n,)
        return self.attention_c(self.attention_a(h) * self.attention_b(h))[:, 0]


class _Feather(SlideEncoder):
    IN_DIM: ClassVar[int] = 768

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Sequential(nn.Linear(self.IN_DIM, 512), nn.ReLU())
        self.global_attn = _GatedAttention(512, 384)

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out = {k.removeprefix("model."): v for k, v in state.items()}
        # a MIL-Lab fine-tuned checkpoint may still hold its task head; the embedding never uses it
        return {k: v for k, v in out.items() if not k.startswith("classifier.")}

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        del coords_um, tile_um  # ABMIL is permutation invariant and reads no positions

        def embedded(x: torch.Tensor) -> torch.Tensor:
            return self.patch_embed(x.float())

        def scores(x: torch.Tensor) -> torch.Tensor:
            return self.global_attn(embedded(x))

        return streaming_attention_pool(scores, embedded, feats)


def _spec(tile_encoder: str, in_dim: int, tile_px: int, hub: str, params: int) -> SlideEncoderSpec:
    return SlideEncoderSpec(
        tile_encoders=(tile_encoder,), tile_um=tile_px * 0.5, tile_mpp=0.5, in_dim=in_dim, dim=512,
        params=params, licence=_LICENCE, weights_page=f"https://huggingface.co/MahmoodLab/{hub}",
        weights_files=("model.safetensors", "pytorch_model.bin"), reference=_REFERENCE,
        uses_positions=False, patient_fusion="late",
    )  # fmt: skip


# parameters: in_dim*512+512 (patch_embed) + 2*(512*384+384) (gates) + 385 (scores); the MIL-Lab README
# rounds every FEATHER-24K to "0.9M"
@SLIDE_ENCODERS.register("feather")
class FeatherConch15(_Feather):
    """FEATHER-24K on CONCH v1.5 features (512 px tiles at 20x)."""

    IN_DIM = 768
    SPEC = _spec("conch-v1.5", 768, 512, "abmil.base.conch_v15.pc108-24k", 788_097)


@SLIDE_ENCODERS.register("feather-uni2")
class FeatherUni2(_Feather):
    """FEATHER-24K on UNI2-h features (256 px tiles at 20x)."""

    IN_DIM = 1536
    SPEC = _spec("uni2-h", 1536, 256, "abmil.base.uni_v2.pc108-24k", 1_181_313)


@SLIDE_ENCODERS.register("feather-uni")
class FeatherUni(_Feather):
    """FEATHER-24K on UNI features (256 px tiles at 20x)."""

    IN_DIM = 1024
    SPEC = _spec("uni", 1024, 256, "abmil.base.uni.pc108-24k", 919_169)
