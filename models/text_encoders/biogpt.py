"""PRISM's text tower (Shaikovski et al. 2024): the unimodal half of its BioGPT decoder and the text side of
its contrastive head, written from the authors' code (paige-ai/Prism on Hugging Face, as copied in
DIAGNijmegen/unicorn_baseline dec3809 src/unicorn_baseline/vision_language/prism/: modeling_prism.py
`zero_shot`, biogpt.py `tokenize` / `forward`, biogpt_hf.py BioGptModel, config.json biogpt_config).

Text: each prompt + '</s>' is tokenized by BioGPT's tokenizer (microsoft/biogpt at eb0d815e: Moses + BPE;
'</s>' is also prepended), the batch padded with <pad> (id 1) to its longest prompt, and - as `zero_shot`
does - the last column dropped; then the <cls> id 42383 is appended to every row. BioGPT embeds tokens
times sqrt(1024) plus learned positions (offset 2, counted over non-pad tokens), runs its first 12 layers
(the unimodal ones, without cross-attention: pre-norm, 16 heads, GELU MLP 1024 -> 4096 -> 1024, causal
and padding masks), and the text embedding is the hidden state after layer 12 at the <cls> position,
before any final LayerNorm. `text_to_latents` (bias-free 1024 -> 5120) and a unit norm give the joint
space; the slide embedding goes through `img_to_latents` (1280 -> 5120) and a unit norm. Similarities
are scaled by `temperature.exp()`, softmaxed over all prompts of all classes, and a class's probability
is the sum over its prompts (`zero_shot`'s marginalisation). The 12 cross-attention layers, the final
LayerNorm and the output projection only serve captioning and are not loaded.

The authors drop the last token column of the whole batch, so the longest prompt(s) of a prompt set lose
their closing '</s>' while shorter ones keep it: embeddings depend on the prompt set, as theirs do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.text_encoders.base import TEXT_ENCODERS, StateDict, TextTower, TextTowerSpec, hub_file
from wsi.models.text_encoders.text_tokens import BioGptTokenizer, HfTokenizer, Tokenized, byte_tokenizer

#: PRISM's <cls>: an unused BioGPT token ("madeupword0006</w>", biogpt.py cls_token_id)
CLS_ID = 42383
BIOGPT_REVISION = "eb0d815e95434dc9e3b78f464e52b899bee7d923"
_DECODER = "text_decoder.model.biogpt."


@dataclass(frozen=True)
class BioGptConfig:
    vocab_size: int = 42384
    width: int = 1024
    heads: int = 16
    layers: int = 24  # all decoder layers; the first half are unimodal and make the text embedding
    intermediate: int = 4096
    max_positions: int = 1024
    latent_dim: int = 5120  # PrismConfig.dim_latents
    image_dim: int = 1280  # the Perceiver's latent width (slide embedding)
    pad_id: int = 1
    cls_id: int = CLS_ID

    @property
    def unimodal(self) -> int:
        return self.layers // 2  # BioGptModel.first_x_attn_layer


class _Attention(nn.Module):
    def __init__(self, cfg: BioGptConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (
            p(x).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class _Layer(nn.Module):
    def __init__(self, cfg: BioGptConfig) -> None:
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(cfg.width)
        self.self_attn = _Attention(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.width)
        self.fc1 = nn.Linear(cfg.width, cfg.intermediate)
        self.fc2 = nn.Linear(cfg.intermediate, cfg.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


@TEXT_ENCODERS.register("prism")
class PrismText(TextTower):
    """PRISM's BioGPT text embedding and contrastive projections (text and slide)."""

    SPEC = TextTowerSpec(
        level="slide",
        image_encoders=("prism",),
        dim=5120,
        context_length=1024,
        weights_page="https://huggingface.co/paige-ai/Prism",
        weights_files=("model.safetensors", "pytorch_model.bin"),
        tokenizer_files="BioGPT's vocab.json + merges.txt (microsoft/biogpt, the Hugging Face cache, or a "
        "biogpt/ "
        "folder beside the weights)",
        templates=("CLASSNAME",),
        temperature="temperature",
        prompt_pooling="sum-probability",
        reference="paige-ai/Prism modeling_prism.py zero_shot, biogpt.py, biogpt_hf.py, as copied in "
        "DIAGNijmegen/unicorn_baseline dec3809 src/unicorn_baseline/vision_language/prism/",
        licence="CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)",
    )

    def __init__(self, cfg: BioGptConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or BioGptConfig()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.width)
        self.embed_positions = nn.Embedding(cfg.max_positions + 2, cfg.width)  # offset 2
        self.layers = nn.ModuleList([_Layer(cfg) for _ in range(cfg.unimodal)])
        self.text_to_latents = nn.Linear(cfg.width, cfg.latent_dim, bias=False)
        self.img_to_latents = nn.Linear(cfg.image_dim, cfg.latent_dim, bias=False)
        self.temperature = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def encode_ids(self, tokens: Tokenized) -> torch.Tensor:
        ids = tokens.ids[:, :-1]  # modeling_prism.zero_shot: self.tokenize(prompts)[:, :-1]
        ids = torch.cat([ids, torch.full((ids.shape[0], 1), self.cfg.cls_id, device=ids.device)], dim=1)
        keep = ids != self.cfg.pad_id  # biogpt.py: attention_mask = input_ids != pad_id
        positions = (torch.cumsum(keep.long(), 1) * keep.long()) - 1 + 2
        x = self.embed_tokens(ids) * math.sqrt(self.cfg.width) + self.embed_positions(positions)
        n = ids.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril_()
        allowed = causal[None, None] & keep[:, None, None, :]
        mask = torch.zeros(allowed.shape, device=ids.device).masked_fill_(
            ~allowed, torch.finfo(torch.float32).min
        )
        for layer in self.layers:
            x = layer(x, mask)
        return self.text_to_latents(x[:, -1])  # hidden_states[first_x_attn_layer][:, -1]

    def image_to_joint(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.img_to_latents(feats.float()), dim=-1)

    def image_dim(self) -> int:
        return int(self.img_to_latents.in_features)

    def logit_scale(self) -> float:
        return float(self.temperature.exp())

    def authors_to_ours(self, state: StateDict) -> StateDict:
        out: StateDict = {}
        for key, value in state.items():
            if key.startswith(_DECODER + "layers."):
                index, rest = key.removeprefix(_DECODER + "layers.").split(".", 1)
                if int(index) < self.cfg.unimodal:
                    out[f"layers.{index}.{rest}"] = value
            elif key in (_DECODER + "embed_tokens.weight", _DECODER + "embed_positions.weight"):
                out[key.removeprefix(_DECODER)] = value
            elif key in ("text_to_latents.to_latents.weight", "img_to_latents.to_latents.weight"):
                out[key.split(".")[0] + ".weight"] = value
            elif key == "temperature":
                out[key] = value
        return out

    def load_tokenizer(self, folder: Path | None, given: Path | None, random_init: bool) -> Any:
        candidates = [given] if given is not None else []
        if folder is not None:
            candidates += [folder / "biogpt", folder]
        cached = hub_file("microsoft/biogpt", ("vocab.json",))
        if given is None and cached is not None:
            candidates.append(cached.parent)
        for base in candidates:
            if (base / "vocab.json").is_file() and (base / "merges.txt").is_file():
                return BioGptTokenizer(base / "vocab.json", base / "merges.txt")
        if random_init and given is None:
            specials = ("<s>", "<pad>", "</s>", "<unk>")  # BioGPT's first ids: pad 1, </s> 2
            tok = byte_tokenizer(specials=specials, template=None, vocab_size=self.cfg.vocab_size)
            return _ByteBioGpt(
                HfTokenizer(tok, max_length=64, pad_token="<pad>", source="bytes (random-init)")
            )
        raise WeightsError(
            "PRISM's tokenizer (BioGPT's vocab.json + merges.txt) was not found in "
            f"{', '.join(str(c) for c in candidates) or 'the Hugging Face cache'}: download it "
            f"(hf download microsoft/biogpt vocab.json merges.txt --revision {BIOGPT_REVISION}) "
            "or give --tokenizer FOLDER"
        )


class _ByteBioGpt:
    """Random-init stand-in with BioGPT's framing: '</s>' + bytes + '</s>', padded to the longest prompt."""

    def __init__(self, inner: HfTokenizer) -> None:
        self.inner = inner
        self.source = inner.source

    def __call__(self, prompts: list[str]) -> Tokenized:
        tok = self.inner._tok
        tok.no_truncation()
        tok.no_padding()
        rows = [[2, *e.ids, 2] for e in tok.encode_batch(prompts, add_special_tokens=False)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), 1, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return Tokenized(ids, 1)
