"""CoCa text towers: CONCH v1's (Lu et al. 2024) and TITAN's (Ding et al. 2024), from the authors' code.

CONCH: mahmoodlab/CONCH 141cc09, conch/open_clip_custom/transformer.py `TextTransformer` with
conch_ViT-B-16.json's text_cfg (context 128, vocab 32007, width 768, 12 heads, 12 layers, embed_cls,
pad_id 0, output dim 512), coca_model.py `encode_text` (the last token column is dropped to make room for
the appended <cls> embedding) and `encode_image` (the contrastive image embedding is `ln_contrast(pooled) @
visual.proj_contrast`, normalised: a bag of conch-v1 holds `ln_contrast(pooled)`, so only the projection and
the normalisation remain), custom_tokenizer.py (byte-level BPE file conch_byte_level_bpe_uncased.json,
max_length 127, padding to 127, then one <pad> column more: 128), zeroshot_path.py (logits are cosine
similarities; probabilities softmax(logit_scale.exp() * logits)).

TITAN: the Hugging Face repository MahmoodLab/TITAN (config.json text_config: context 128, vocab 32007,
width 768, 12 heads, 12 layers, embed_cls, pad_id 0, output 768, no projection bias) builds open_clip's
TextTransformer (open_clip v2.26 src/open_clip/transformer.py, the version with `pool_type` and `proj_bias`;
its `num_pos` counts one row more for the <cls> embedding, so the published table may have 129 rows: we
take the file's table and use its first 128 rows, as its forward does). modeling_titan.py `encode_text`
drops the last token column too; `zero_shot` maps the slide embedding with `vision_encoder.proj` and
normalises it, and applies the softmax to the cosine similarities without any temperature. The
tokenizer is the repository's tokenizer.json, called as CONCH's (lazyslide-models 0127beb
multimodal/titan.py: max_length 127, padding, one pad column more).

The cls mask is the authors' (build_cls_mask): the appended <cls> query sees key 0 and key j + 1 for every
non-pad token j, an off-by-one the checkpoints were trained with and that is kept here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.text_encoders.base import TEXT_ENCODERS, StateDict, TextTower, TextTowerSpec, hub_file
from wsi.models.text_encoders.text_tokens import (
    HfTokenizer,
    Tokenized,
    byte_tokenizer,
    load_tokenizer_json,
    special_token,
)

#: CONCH's prompt templates for whole-slide NSCLC subtyping (mahmoodlab/CONCH prompts/
#: nsclc_prompts_all_per_class.json; the same 22 templates are in crc100k_prompts_all_per_class.json)
CONCH_TEMPLATES = (
    "CLASSNAME.",
    "a photomicrograph showing CLASSNAME.",
    "a photomicrograph of CLASSNAME.",
    "an image of CLASSNAME.",
    "an image showing CLASSNAME.",
    "an example of CLASSNAME.",
    "CLASSNAME is shown.",
    "this is CLASSNAME.",
    "there is CLASSNAME.",
    "a histopathological image showing CLASSNAME.",
    "a histopathological image of CLASSNAME.",
    "a histopathological photograph of CLASSNAME.",
    "a histopathological photograph showing CLASSNAME.",
    "shows CLASSNAME.",
    "presence of CLASSNAME.",
    "CLASSNAME is present.",
    "an H&E stained image of CLASSNAME.",
    "an H&E stained image showing CLASSNAME.",
    "an H&E image showing CLASSNAME.",
    "an H&E image of CLASSNAME.",
    "CLASSNAME, H&E stain.",
    "CLASSNAME, H&E.",
)
#: TITAN's 23 templates (mahmoodlab/TITAN 33042f5 titan/utils.py TEMPLATES)
TITAN_TEMPLATES = (
    "CLASSNAME.",
    "an image of CLASSNAME.",
    "the image shows CLASSNAME.",
    "the image displays CLASSNAME.",
    "the image exhibits CLASSNAME.",
    "an example of CLASSNAME.",
    "CLASSNAME is shown.",
    "this is CLASSNAME.",
    "I observe CLASSNAME.",
    "the pathology image shows CLASSNAME.",
    "a pathology image shows CLASSNAME.",
    "the pathology slide shows CLASSNAME.",
    "shows CLASSNAME.",
    "contains CLASSNAME.",
    "presence of CLASSNAME.",
    "CLASSNAME is present.",
    "CLASSNAME is observed.",
    "the pathology image reveals CLASSNAME.",
    "a microscopic image of showing CLASSNAME.",
    "histology shows CLASSNAME.",
    "CLASSNAME can be seen.",
    "the tissue shows CLASSNAME.",
    "CLASSNAME is identified.",
)
CONCH_SPECIALS = ("<pad>", "<start_of_text>", "<end_of_text>")
CONCH_TOKENIZER_FILE = "conch_byte_level_bpe_uncased.json"


@dataclass(frozen=True)
class CocaTextConfig:
    context_length: int = 128
    vocab_size: int = 32007
    width: int = 768
    heads: int = 12
    layers: int = 12
    output_dim: int = 512
    num_pos: int = 128  # rows of the position table (open_clip >= 2.1x: context + 1 with embed_cls)
    pad_id: int = 0


class _Block(nn.Module):
    """open_clip ResidualAttentionBlock (pre-norm; nn.MultiheadAttention; c_fc -> GELU -> c_proj)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                [
                    ("c_fc", nn.Linear(width, 4 * width)),
                    ("gelu", nn.GELU()),
                    ("c_proj", nn.Linear(4 * width, width)),
                ]
            )
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    def __init__(self, cfg: CocaTextConfig) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList([_Block(cfg.width, cfg.heads) for _ in range(cfg.layers)])


class CocaText(TextTower):
    """The CoCa text encoder: token embeddings + <cls> embedding, causal transformer, LayerNorm on <cls>,
    projection. Checkpoint prefix and image map are the subclass's."""

    PREFIX = ""
    TOKENIZER_REPO = ""

    def __init__(self, cfg: CocaTextConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or self.default_config()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.width)
        self.positional_embedding = nn.Parameter(torch.randn(cfg.num_pos, cfg.width) * 0.01)
        self.cls_emb = nn.Parameter(torch.randn(cfg.width) * 0.01)
        self.transformer = _Transformer(cfg)
        self.ln_final = nn.LayerNorm(cfg.width)
        self.text_projection = nn.Parameter(torch.randn(cfg.width, cfg.output_dim) * cfg.width**-0.5)

    @classmethod
    def default_config(cls) -> CocaTextConfig:
        return CocaTextConfig()

    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def _mask(self, text: torch.Tensor) -> torch.Tensor:
        """(B * heads, L + 1, L + 1) additive mask: causal + the authors' <cls> row (build_cls_mask)."""
        n = text.shape[1]
        seq = n + 1
        causal = torch.full((seq, seq), float("-inf"), device=text.device).triu_(1)
        keep = F.pad((text != self.cfg.pad_id)[:, None, :], (1, 0, n, 0), value=True)  # (B, L+1, L+1)
        cls = torch.zeros(keep.shape, device=text.device).masked_fill_(~keep, float("-inf"))
        mask = causal[None] + cls
        return mask.repeat_interleave(self.cfg.heads, 0)

    def encode_ids(self, tokens: Tokenized) -> torch.Tensor:
        text = tokens.ids[:, :-1]  # encode_text(embed_cls=True): room for the <cls> embedding
        x = self.token_embedding(text)
        x = torch.cat([x, self.cls_emb.view(1, 1, -1).expand(x.shape[0], 1, -1)], dim=1)
        x = x + self.positional_embedding[: x.shape[1]]
        mask = self._mask(text)
        for block in self.transformer.resblocks:
            x = block(x, mask)
        return self.ln_final(x[:, -1]) @ self.text_projection

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out = {k[len(self.PREFIX) :]: v for k, v in state.items() if k.startswith(self.PREFIX)}
        pos = out.get("positional_embedding")
        used = self.cfg.context_length
        if pos is not None and pos.ndim == 2 and pos.shape[0] != self.cfg.num_pos and pos.shape[0] >= used:
            # open_clip's table has context + 1 rows with embed_cls, CONCH's copy context rows: the file's
            self.positional_embedding = nn.Parameter(torch.empty_like(pos))
        return out

    def load_tokenizer(self, folder: Path | None, given: Path | None, random_init: bool) -> Any:
        path = self._tokenizer_file(folder, given)
        if path is None:
            if not random_init:
                raise WeightsError(self._no_tokenizer(folder))
            return HfTokenizer(
                byte_tokenizer(
                    specials=CONCH_SPECIALS, template=CONCH_SPECIALS[1:], vocab_size=self.cfg.vocab_size
                ),
                max_length=self.cfg.context_length - 1,
                pad_token="<pad>",
                extra_pad=1,
                source="bytes (random-init)",
            )
        pad = special_token(path.parent, "pad_token", "<pad>")
        return HfTokenizer(
            load_tokenizer_json(path),
            max_length=self.cfg.context_length - 1,
            pad_token=pad,
            extra_pad=1,
            source=str(path),
        )

    def _tokenizer_file(self, folder: Path | None, given: Path | None) -> Path | None:
        names = (CONCH_TOKENIZER_FILE, "tokenizer.json")
        if given is not None:
            for p in [given, *(given / n for n in names)]:
                if p.is_file():
                    return p
            raise WeightsError(f"tokenizer {given} does not exist (give {' or '.join(names)} or its folder)")
        for base in [folder] if folder is not None else []:
            for n in names:
                if (base / n).is_file():
                    return base / n
        return hub_file(self.TOKENIZER_REPO, ("tokenizer.json",)) if self.TOKENIZER_REPO else None

    def _no_tokenizer(self, folder: Path | None) -> str:
        raise NotImplementedError


@TEXT_ENCODERS.register("conch-v1")
class ConchV1Text(CocaText):
    """CONCH v1's text tower; its tile features (bags of conch-v1) enter the joint space by proj_contrast."""

    SPEC = TextTowerSpec(
        level="tile",
        image_encoders=("conch-v1",),
        dim=512,
        context_length=128,
        weights_page="https://huggingface.co/MahmoodLab/CONCH",
        weights_files=("pytorch_model.bin",),
        tokenizer_files=f"{CONCH_TOKENIZER_FILE} (github.com/mahmoodlab/CONCH "
        "conch/open_clip_custom/tokenizers/), "
        "beside the weights or --tokenizer",
        templates=CONCH_TEMPLATES,
        temperature="logit_scale",
        prompt_pooling="mean-embedding",
        reference="mahmoodlab/CONCH 141cc09 conch/open_clip_custom/ (transformer.py TextTransformer, "
        "coca_model.py, "
        "custom_tokenizer.py), conch/downstream/zeroshot_path.py",
        licence="CC-BY-NC-ND-4.0 (gated)",
    )
    PREFIX = "text."

    def __init__(self, cfg: CocaTextConfig | None = None) -> None:
        super().__init__(cfg)
        self.proj_contrast = nn.Parameter(torch.randn(self.cfg.output_dim, self.cfg.output_dim) * 768**-0.5)
        self.logit_scale_log = nn.Parameter(torch.tensor(2.6592600))  # log(1 / 0.07), CoCa's initial value

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out = super().authors_to_ours(state)
        for theirs, ours in (("visual.proj_contrast", "proj_contrast"), ("logit_scale", "logit_scale_log")):
            if theirs in state:
                out[ours] = state[theirs]
        return out

    def image_to_joint(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(feats.float() @ self.proj_contrast.float(), dim=-1)

    def image_dim(self) -> int:
        return int(self.proj_contrast.shape[0])

    def logit_scale(self) -> float:
        return float(self.logit_scale_log.exp())

    def _no_tokenizer(self, folder: Path | None) -> str:
        where = f" (looked in {folder})" if folder else ""
        return (
            f"CONCH's tokenizer {CONCH_TOKENIZER_FILE} was not found{where}. It ships with the authors' "
            "code, not "
            "with the weights: copy conch/open_clip_custom/tokenizers/conch_byte_level_bpe_uncased.json from "
            "github.com/mahmoodlab/CONCH beside pytorch_model.bin, or give --tokenizer FILE"
        )


@TEXT_ENCODERS.register("titan")
class TitanText(CocaText):
    """TITAN's text tower; TITAN slide embeddings enter the joint space by vision_encoder.proj."""

    SPEC = TextTowerSpec(
        level="slide",
        image_encoders=("titan",),
        dim=768,
        context_length=128,
        weights_page="https://huggingface.co/MahmoodLab/TITAN",
        weights_files=("model.safetensors",),
        tokenizer_files="tokenizer.json of MahmoodLab/TITAN (beside model.safetensors)",
        templates=TITAN_TEMPLATES,
        temperature="none",
        prompt_pooling="mean-embedding",
        reference="MahmoodLab/TITAN (Hugging Face) modeling_titan.py encode_text / zero_shot_classifier / "
        "zero_shot, config.json text_config; open_clip v2.26 TextTransformer; mahmoodlab/TITAN 33042f5 "
        "titan/utils.py TEMPLATES",
        licence="CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)",
    )
    PREFIX = "text_encoder."
    TOKENIZER_REPO = "MahmoodLab/TITAN"

    @classmethod
    def default_config(cls) -> CocaTextConfig:
        return CocaTextConfig(output_dim=768, num_pos=129)

    def __init__(self, cfg: CocaTextConfig | None = None) -> None:
        super().__init__(cfg)
        self.proj = nn.Parameter(
            torch.randn(self.cfg.output_dim, self.cfg.output_dim) * self.cfg.output_dim**-0.5
        )

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out = super().authors_to_ours(state)
        if "vision_encoder.proj" in state:
            out["proj"] = state["vision_encoder.proj"]
        return out

    def image_to_joint(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(feats.float() @ self.proj.float(), dim=-1)

    def image_dim(self) -> int:
        return int(self.proj.shape[0])

    def logit_scale(self) -> float:
        return 1.0  # modeling_titan.py zero_shot: softmax(slide @ classifier), no temperature

    def _no_tokenizer(self, folder: Path | None) -> str:
        where = f" in {folder}" if folder else ""
        return (
            f"TITAN's tokenizer.json was not found{where} or in the Hugging Face cache: download the "
            "repository "
            "(hf download MahmoodLab/TITAN) or give --tokenizer FILE"
        )
