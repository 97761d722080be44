"""PLIP's text tower (Huang et al. 2023, Nature Medicine): the CLIP ViT-B/32 text transformer as
transformers' CLIPTextModel runs it, with the published checkpoint's names (huggingface.co/vinid/plip).

The authors' code (PathologyFoundation/plip f010f3d plip.py) calls CLIPModel.from_pretrained and
CLIPProcessor(text=..., max_length=77, padding="max_length", truncation=True), then get_text_features:
token + position embeddings, 12 pre-norm layers (q/k/v/out projections with bias, head_dim^-0.5 scaling,
causal mask and the padding mask, quick_gelu MLP 512 -> 2048 -> 512), final LayerNorm, the hidden state
at the first <|endoftext|> (argmax of the ids: the highest id), then `text_projection` (no bias). PLIP's
image side is CLIP's `visual_projection` output, what a bag of the `plip` tile encoder holds; the
zero-shot score is the cosine similarity, scaled by `logit_scale.exp()` (CLIPModel's logits_per_image).
Prompt template: "An H&E image of {}." (reproducibility/scripts/zero_shot_evaluation.py text_style_4).
"""

from __future__ import annotations

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
    clip_tokenizer,
    load_tokenizer_json,
    special_token,
)

BOS, EOS = "<|startoftext|>", "<|endoftext|>"


@dataclass(frozen=True)
class ClipTextConfig:
    vocab_size: int = 49408
    width: int = 512
    heads: int = 8
    layers: int = 12
    intermediate: int = 2048
    max_positions: int = 77
    output_dim: int = 512


class _QuickGelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class _Attention(nn.Module):
    def __init__(self, cfg: ClipTextConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (
            p(x).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale head_dim^-0.5, as CLIPAttention
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class _Mlp(nn.Module):
    def __init__(self, cfg: ClipTextConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.intermediate)
        self.act = _QuickGelu()
        self.fc2 = nn.Linear(cfg.intermediate, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, cfg: ClipTextConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width)
        self.self_attn = _Attention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width)
        self.mlp = _Mlp(cfg)


@TEXT_ENCODERS.register("plip")
class PlipText(TextTower):
    """CLIP's text transformer with PLIP's weights; bags of the `plip` tile encoder are its image side."""

    SPEC = TextTowerSpec(
        level="tile",
        image_encoders=("plip",),
        dim=512,
        context_length=77,
        weights_page="https://huggingface.co/vinid/plip",
        weights_files=("pytorch_model.bin", "model.safetensors"),
        tokenizer_files="tokenizer.json (or vocab.json + merges.txt) of vinid/plip, beside the weights",
        templates=("An H&E image of CLASSNAME.",),
        temperature="logit_scale",
        prompt_pooling="mean-embedding",
        reference="PathologyFoundation/plip f010f3d plip.py (CLIPModel, CLIPProcessor max_length 77); "
        "transformers CLIPTextModel / CLIPTokenizerFast (convert_slow_tokenizer.CLIPConverter)",
        licence="research use (see the PLIP terms on its page)",
    )

    def __init__(self, cfg: ClipTextConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or ClipTextConfig()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.width)
        self.position_embedding = nn.Embedding(cfg.max_positions, cfg.width)
        self.layers = nn.ModuleList([_Layer(cfg) for _ in range(cfg.layers)])
        self.final_layer_norm = nn.LayerNorm(cfg.width)
        self.text_projection = nn.Linear(cfg.width, cfg.output_dim, bias=False)
        self.logit_scale_log = nn.Parameter(torch.tensor(2.6592600))

    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def encode_ids(self, tokens: Tokenized) -> torch.Tensor:
        ids = tokens.ids
        b, n = ids.shape
        x = self.token_embedding(ids) + self.position_embedding.weight[:n]
        causal = torch.full((n, n), float("-inf"), device=ids.device).triu_(1)
        # CLIPProcessor's attention_mask: 0 on pad positions; the pad token may be <|endoftext|> itself, so
        # the mask marks what follows the first <|endoftext|>, as the processor's mask does
        eot = ids.argmax(-1)
        pad = torch.arange(n, device=ids.device)[None] > eot[:, None]
        mask = causal[None, None] + torch.zeros(b, 1, 1, n, device=ids.device).masked_fill_(
            pad[:, None, None], float("-inf")
        )
        for layer in self.layers:
            assert isinstance(layer, _Layer)
            x = x + layer.self_attn(layer.layer_norm1(x), mask)
            x = x + layer.mlp(layer.layer_norm2(x))
        x = self.final_layer_norm(x)
        return self.text_projection(x[torch.arange(b, device=ids.device), eot])

    def image_to_joint(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(feats.float(), dim=-1)  # a plip bag holds visual_projection(pooled)

    def image_dim(self) -> int:
        return self.cfg.output_dim  # the joint space itself

    def logit_scale(self) -> float:
        return float(self.logit_scale_log.exp())

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out: StateDict = {}
        for key, value in state.items():
            if key.startswith("text_model.embeddings."):
                name = key.removeprefix("text_model.embeddings.")
                if name == "position_ids":
                    continue  # a buffer older transformers saved; positions are 0..76
                out[name] = value
            elif key.startswith("text_model.encoder.layers."):
                out["layers." + key.removeprefix("text_model.encoder.layers.")] = value
            elif key.startswith("text_model.final_layer_norm."):
                out[key.removeprefix("text_model.")] = value
            elif key == "text_projection.weight":
                out[key] = value
            elif key == "logit_scale":
                out["logit_scale_log"] = value
        return out

    def load_tokenizer(self, folder: Path | None, given: Path | None, random_init: bool) -> Any:
        base = given if given is not None and given.is_dir() else folder
        if given is not None and given.is_file():
            tok, source = load_tokenizer_json(given), given
        elif base is not None and (base / "tokenizer.json").is_file():
            tok, source = load_tokenizer_json(base / "tokenizer.json"), base / "tokenizer.json"
        elif base is not None and (base / "vocab.json").is_file() and (base / "merges.txt").is_file():
            tok, source = clip_tokenizer(base / "vocab.json", base / "merges.txt"), base
        elif random_init and given is None:
            tok = byte_tokenizer(specials=(BOS, EOS), template=(BOS, EOS), vocab_size=self.cfg.vocab_size)
            return HfTokenizer(
                tok, max_length=self.cfg.max_positions, pad_token=EOS, source="bytes (random-init)"
            )
        else:
            cached = hub_file("vinid/plip", ("tokenizer.json",))
            if cached is None:
                raise WeightsError(
                    f"PLIP's tokenizer (tokenizer.json, or vocab.json + merges.txt) was not found in "
                    f"{given or folder or 'the Hugging Face cache'}: download vinid/plip "
                    "(hf download vinid/plip) "
                    "or give --tokenizer FOLDER"
                )
            tok, source = load_tokenizer_json(cached), cached
            base = cached.parent
        pad = special_token(base, "pad_token", EOS) if base is not None else EOS
        return HfTokenizer(tok, max_length=self.cfg.max_positions, pad_token=pad, source=str(source))
