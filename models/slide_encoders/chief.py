"""CHIEF's slide encoder: gated-attention pooling of CTransPath tile features (Wang et al., Nature 2024).

Architecture as hms-dbmi/CHIEF builds it (commit 1abed33): models/CHIEF.py `CHIEF(size_arg="small")`
loaded from CHIEF_pretraining.pth with strict=True (Get_CHIEF_WSI_level_feature.py). attention_net =
Linear(768, 512) + ReLU + Dropout + Attn_Net_Gated(512, 256); the slide embedding is `WSI_feature` =
softmax(attention) @ the *raw* 768-d tile features (h_ori), which does not depend on the anatomical
site input (that only enters `WSI_feature_anatomical` and the logits). The classifier, instance
classifiers, att_head, text_to_vision and the organ_embedding buffer are kept so that the authors'
checkpoint loads key for key (STAMP, KatherLab/STAMP c54ce06 src/stamp/encoding/encoder/chief.py, deletes
organ_embedding first; we accept the file with or without it). Tiles: CTransPath at 256 px, 10x
(TRIDENT README: `--patch_encoder ctranspath --patch_size 256 --mag 10`). No positions.
"""

from __future__ import annotations

import torch
from torch import nn

from wsi.models.slide_encoders.base import (
    SLIDE_ENCODERS,
    SlideEncoder,
    SlideEncoderSpec,
    StateDict,
    streaming_attention_pool,
)


class _AttnNetGated(nn.Module):
    """CHIEF's Attn_Net_Gated(L=512, D=256, dropout=True, n_classes=1), eval mode."""

    def __init__(self, dim: int = 512, attn_dim: int = 256) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, attn_dim), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(dim, attn_dim), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(attn_dim, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.attention_c(self.attention_a(h) * self.attention_b(h))[:, 0]


class _AttHead(nn.Module):
    def __init__(self, dim: int = 512, hidden: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, 1)


@SLIDE_ENCODERS.register("chief")
class Chief(SlideEncoder):
    """CHIEF (size "small"): 768-d CTransPath tiles -> 768-d slide embedding."""

    SPEC = SlideEncoderSpec(
        tile_encoders=("ctranspath",), tile_um=256.0, tile_mpp=1.0, in_dim=768, dim=768,
        # every tensor of CHIEF(size_arg="small", n_classes=2) (buffers excluded)
        params=1_185_032,
        licence="GNU AGPL v3 (LICENSE file; the README says GPLv3, non-commercial academic use)",
        weights_page="https://github.com/hms-dbmi/CHIEF (CHIEF_pretraining.pth, Google Drive link)",
        weights_files=("CHIEF_pretraining.pth",),
        reference="hms-dbmi/CHIEF 1abed33 models/CHIEF.py + Get_CHIEF_WSI_level_feature.py",
        uses_positions=False, patient_fusion="early",  # STAMP encode_patients_: all tiles in one bag
        # CHIEF_CTransPath.pth (CHIEF's own CTransPath weights), the digest STAMP pins in
        # src/stamp/preprocessing/extractor/chief_ctranspath.py: features of the original TransPath
        # weights are another feature space
        tile_weights_sha256=("1646f23001214f74cf432ef0e80b808ee6605143802ae6ed53a87564ddc4924a",),
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.attention_net = nn.Sequential(nn.Linear(768, 512), nn.ReLU(), nn.Dropout(0.25), _AttnNetGated())
        self.classifiers = nn.Linear(512, 2)
        self.instance_classifiers = nn.ModuleList([nn.Linear(512, 2) for _ in range(2)])
        self.att_head = _AttHead()
        self.text_to_vision = nn.Sequential(nn.Linear(768, 512), nn.ReLU(), nn.Dropout(0.25))
        self.register_buffer("organ_embedding", torch.zeros(19, 768))

    def authors_to_ours(self, state: StateDict) -> StateDict:
        if "organ_embedding" not in state:  # STAMP's copy drops it; only the anatomical logits use it
            state = {**state, "organ_embedding": torch.zeros(19, 768)}
        return state

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        del coords_um, tile_um
        net = self.attention_net

        def scores(x: torch.Tensor) -> torch.Tensor:
            return net[3](net[2](net[1](net[0](x.float()))))

        return streaming_attention_pool(scores, lambda x: x.float(), feats)
