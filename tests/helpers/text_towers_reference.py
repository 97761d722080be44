"""The authors' text towers, written here from their code for the tests of wsi.models.text_encoders
(small sizes; same names as the published checkpoints):

- CONCH v1: mahmoodlab/CONCH 141cc09 conch/open_clip_custom/transformer.py TextTransformer (sequence-first
  nn.MultiheadAttention, build_attention_mask, build_cls_mask), coca_model.py CoCa._encode_text / encode_text
  (text[:, :-1], F.normalize) and VisualModel.forward_project (pooled @ proj_contrast);
- TITAN: open_clip v2.26 src/open_clip/transformer.py TextTransformer (batch-first), as MahmoodLab/TITAN's
  modeling_titan.py encode_text calls it, and zero_shot (slide @ vision_encoder.proj, normalised);
- PLIP: transformers' CLIPTextModel (CLIPTextEmbeddings, CLIPAttention with bmm and additive masks,
  CLIPMLP quick_gelu, final_layer_norm, argmax pooling) + CLIPModel.text_projection;
- PRISM: DIAGNijmegen/unicorn_baseline dec3809 vision_language/prism/biogpt_hf.py BioGptModel (the first
  num_hidden_layers // 2 layers, BioGptAttention, BioGptLearnedPositionalEmbedding) and biogpt.py forward
  (<cls> appended, hidden_states[first_x_attn_layer][:, -1]), modeling_prism.py zero_shot.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------------------------- CONCH v1 / TITAN
class OcResBlock(nn.Module):
    def __init__(self, d: int, h: int, batch_first: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=batch_first)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            OrderedDict([("c_fc", nn.Linear(d, 4 * d)), ("gelu", nn.GELU()), ("c_proj", nn.Linear(4 * d, d))])
        )

    def forward(self, x, attn_mask=None):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=attn_mask)[0]
        return x + self.mlp(self.ln_2(x))


class OcTransformer(nn.Module):
    def __init__(self, d: int, layers: int, h: int, batch_first: bool) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList([OcResBlock(d, h, batch_first) for _ in range(layers)])


class RefCocaText(nn.Module):
    """TextTransformer(embed_cls=True): CONCH's copy (batch_first=False, num_pos = context) or open_clip
    v2.26 (batch_first=True, num_pos = context + 1)."""

    def __init__(
        self,
        *,
        context=128,
        vocab=32007,
        width=768,
        heads=12,
        layers=12,
        output_dim=512,
        pad_id=0,
        open_clip_v2=False,
    ) -> None:
        super().__init__()
        self.heads, self.pad_id, self.batch_first = heads, pad_id, open_clip_v2
        self.num_pos = context + (1 if open_clip_v2 else 0)
        self.text_projection = nn.Parameter(torch.randn(width, output_dim) * width**-0.5)
        self.cls_emb = nn.Parameter(torch.randn(width) * 0.01)
        self.token_embedding = nn.Embedding(vocab, width)
        self.positional_embedding = nn.Parameter(torch.randn(self.num_pos, width) * 0.01)
        self.transformer = OcTransformer(width, layers, heads, open_clip_v2)
        self.ln_final = nn.LayerNorm(width)
        mask = torch.empty(self.num_pos, self.num_pos).fill_(float("-inf")).triu_(1)
        self.register_buffer("attn_mask", mask, persistent=False)

    def build_cls_mask(self, text, cast_dtype):
        cls_mask = (text != self.pad_id).unsqueeze(1)
        cls_mask = F.pad(cls_mask, (1, 0, cls_mask.shape[2], 0), value=1.0)
        additive_mask = torch.empty(cls_mask.shape, dtype=cast_dtype, device=cls_mask.device)
        additive_mask.fill_(0)
        additive_mask.masked_fill_(~cls_mask, float("-inf"))
        return torch.repeat_interleave(additive_mask, self.heads, 0)

    def forward(self, text):
        seq_len = text.shape[1]
        x = self.token_embedding(text)
        seq_len += 1
        x = torch.cat([x, self.cls_emb.reshape(1, 1, -1).repeat(x.shape[0], 1, 1)], dim=1)
        cls_mask = self.build_cls_mask(text, x.dtype)
        attn_mask = self.attn_mask[None, :seq_len, :seq_len] + cls_mask[:, :seq_len, :seq_len]
        x = x + self.positional_embedding[:seq_len]
        if not self.batch_first:
            x = x.permute(1, 0, 2)  # NLD -> LND
        for r in self.transformer.resblocks:
            x = r(x, attn_mask=attn_mask)
        if not self.batch_first:
            x = x.permute(1, 0, 2)
        pooled = self.ln_final(x[:, -1])
        return pooled @ self.text_projection


def coca_encode_text(text_model: RefCocaText, tokens: torch.Tensor) -> torch.Tensor:
    """CoCa.encode_text(normalize=True, embed_cls=True) / Titan.encode_text(normalize=True)."""
    return F.normalize(text_model(tokens[:, :-1]), dim=-1)


def conch_tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    """custom_tokenizer.tokenize, with the `tokenizers` engine under PreTrainedTokenizerFast called as
    batch_encode_plus(max_length=127, truncation=True, padding='max_length') calls it."""
    pad_id = tokenizer.token_to_id("<pad>")
    tokenizer.enable_truncation(max_length=127)
    tokenizer.enable_padding(length=127, pad_id=pad_id, pad_token="<pad>")
    ids = torch.tensor([e.ids for e in tokenizer.encode_batch(texts)], dtype=torch.long)
    return F.pad(ids, (0, 1), value=pad_id)


def zero_shot_classifier(encode, classnames: list[list[str]], templates: list[str]) -> torch.Tensor:
    """zeroshot_path.zero_shot_classifier / Titan.zero_shot_classifier: (D, C)."""
    weights = []
    for names in classnames:
        per = [F.normalize(encode([t.replace("CLASSNAME", n) for t in templates]), dim=-1) for n in names]
        emb = torch.stack(per, dim=0).mean(dim=(0, 1))
        weights.append(emb / emb.norm())
    return torch.stack(weights, dim=1)


def topj_pooling(logits: torch.Tensor, j: int) -> torch.Tensor:
    """zeroshot_path.topj_pooling for one j: (N, C) tile logits -> (1, C)."""
    maxj = min(j, logits.size(0))
    values, _ = logits.topk(maxj, 0, True, True)
    return values[: min(j, maxj)].mean(dim=0, keepdim=True)


# ----------------------------------------------------------------------------------------------- CLIP
class RefClipAttention(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = d, h, d // h
        self.scale = self.head_dim**-0.5
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def _shape(self, t, seq_len, bsz):
        return t.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden_states, attention_mask, causal_attention_mask):
        bsz, tgt_len, embed_dim = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scale
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states = key_states.view(*proj_shape)
        value_states = value_states.view(*proj_shape)
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2)).view(
            bsz, self.num_heads, tgt_len, -1
        )
        attn_weights = attn_weights + causal_attention_mask + attention_mask
        attn_weights = nn.functional.softmax(attn_weights.view(bsz * self.num_heads, tgt_len, -1), dim=-1)
        out = torch.bmm(attn_weights, value_states).view(bsz, self.num_heads, tgt_len, self.head_dim)
        return self.out_proj(out.transpose(1, 2).reshape(bsz, tgt_len, embed_dim))


class RefClipMlp(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x):
        x = self.fc1(x)
        return self.fc2(x * torch.sigmoid(1.702 * x))  # ACT2FN["quick_gelu"]


class RefClipLayer(nn.Module):
    def __init__(self, d: int, h: int, inner: int) -> None:
        super().__init__()
        self.self_attn = RefClipAttention(d, h)
        self.layer_norm1 = nn.LayerNorm(d)
        self.mlp = RefClipMlp(d, inner)
        self.layer_norm2 = nn.LayerNorm(d)

    def forward(self, x, attention_mask, causal_attention_mask):
        x = x + self.self_attn(self.layer_norm1(x), attention_mask, causal_attention_mask)
        return x + self.mlp(self.layer_norm2(x))


class RefClipModelText(nn.Module):
    """CLIPModel's text half with the checkpoint's names (text_model.*, text_projection, logit_scale)."""

    def __init__(
        self, *, vocab=49408, width=512, heads=8, layers=12, inner=2048, positions=77, out=512
    ) -> None:
        super().__init__()
        self.text_model = nn.Module()
        self.text_model.embeddings = nn.Module()
        self.text_model.embeddings.token_embedding = nn.Embedding(vocab, width)
        self.text_model.embeddings.position_embedding = nn.Embedding(positions, width)
        self.text_model.encoder = nn.Module()
        self.text_model.encoder.layers = nn.ModuleList(
            [RefClipLayer(width, heads, inner) for _ in range(layers)]
        )
        self.text_model.final_layer_norm = nn.LayerNorm(width)
        self.text_projection = nn.Linear(width, out, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))

    def get_text_features(self, input_ids, attention_mask):
        bsz, n = input_ids.shape
        tm = self.text_model
        x = tm.embeddings.token_embedding(input_ids) + tm.embeddings.position_embedding(torch.arange(n)[None])
        causal = torch.full((n, n), torch.finfo(x.dtype).min).triu_(1)[None, None].expand(bsz, 1, n, n)
        expanded = (1.0 - attention_mask[:, None, None, :].to(x.dtype)).masked_fill(
            attention_mask[:, None, None, :] == 0, torch.finfo(x.dtype).min
        )
        for layer in tm.encoder.layers:
            x = layer(x, expanded, causal)
        x = tm.final_layer_norm(x)
        pooled = x[torch.arange(bsz), input_ids.to(torch.int).argmax(dim=-1)]
        return self.text_projection(pooled)


# --------------------------------------------------------------------------------------------- BioGPT
class RefBioGptAttention(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.embed_dim = h, d // h, d
        self.scaling = self.head_dim**-0.5
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def _shape(self, t, seq_len, bsz):
        return t.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden_states, attention_mask):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scaling
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states, value_states = key_states.reshape(*proj_shape), value_states.reshape(*proj_shape)
        src_len = key_states.size(1)
        w = torch.bmm(query_states, key_states.transpose(1, 2)).view(bsz, self.num_heads, tgt_len, src_len)
        w = (w + attention_mask).view(bsz * self.num_heads, tgt_len, src_len)
        w = nn.functional.softmax(w, dim=-1)
        out = torch.bmm(w, value_states).view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return self.out_proj(out.reshape(bsz, tgt_len, self.embed_dim))


class RefBioGptLayer(nn.Module):
    def __init__(self, d: int, h: int, inner: int, xattn: bool, x_dim: int) -> None:
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.self_attn = RefBioGptAttention(d, h)
        if xattn:  # present in the checkpoint, never reached by the text embedding
            self.x_attn_layer_norm = nn.LayerNorm(d)
            self.x_attn = nn.Module()
            self.x_attn.k_proj = nn.Linear(x_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x, attention_mask):
        x = x + self.self_attn(self.self_attn_layer_norm(x), attention_mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class RefPrism(nn.Module):
    """The text side of modeling_prism.Prism with its checkpoint names (image_resampler left out)."""

    def __init__(
        self,
        *,
        vocab=42384,
        width=1024,
        heads=16,
        layers=24,
        inner=4096,
        positions=1024,
        latents=5120,
        image_dim=1280,
        pad_id=1,
        cls_id=42383,
    ) -> None:
        super().__init__()
        self.pad_id, self.cls_id, self.width = pad_id, cls_id, width
        self.text_decoder = nn.Module()
        self.text_decoder.model = nn.Module()
        bio = nn.Module()
        self.text_decoder.model.biogpt = bio
        bio.embed_tokens = nn.Embedding(vocab, width, pad_id)
        bio.embed_positions = nn.Embedding(positions + 2, width)
        bio.layers = nn.ModuleList(
            [RefBioGptLayer(width, heads, inner, i >= layers // 2, image_dim) for i in range(layers)]
        )
        bio.layer_norm = nn.LayerNorm(width)
        self.text_decoder.model.output_projection = nn.Linear(width, vocab, bias=False)
        self.first_x_attn_layer = layers // 2
        self.img_to_latents = nn.Module()
        self.img_to_latents.to_latents = nn.Linear(image_dim, latents, bias=False)
        self.text_to_latents = nn.Module()
        self.text_to_latents.to_latents = nn.Linear(width, latents, bias=False)
        self.temperature = nn.Parameter(torch.log(torch.tensor(1.0) / 0.07))

    def text_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        """biogpt.BioGPT.forward -> text_embedding (unimodal layers only; the rest cannot change it)."""
        bio = self.text_decoder.model.biogpt
        input_ids = torch.cat([input_ids, torch.full((input_ids.shape[0], 1), self.cls_id)], dim=-1)
        attention_mask = (input_ids != self.pad_id).to(torch.int8)
        inputs_embeds = bio.embed_tokens(input_ids) * math.sqrt(self.width)
        mask = attention_mask.long()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() - 1
        hidden = inputs_embeds + bio.embed_positions(positions + 2)
        bsz, n = input_ids.shape
        dtype_min = torch.finfo(hidden.dtype).min
        causal = torch.full((n, n), dtype_min).triu_(1)[None, None]  # _prepare_4d_causal_attention_mask
        expanded = (1.0 - attention_mask[:, None, None, :].float()).masked_fill(
            attention_mask[:, None, None, :] == 0, dtype_min
        )
        mask4 = causal.masked_fill(expanded.bool().expand(bsz, 1, n, n), dtype_min)
        all_hidden = []
        for layer in bio.layers[: self.first_x_attn_layer]:
            all_hidden.append(hidden)
            hidden = layer(hidden, mask4)
        all_hidden.append(hidden)
        return all_hidden[self.first_x_attn_layer][:, -1]

    def zero_shot_probs(self, image_embeds, token_ids, groups: list[int]) -> torch.Tensor:
        """modeling_prism.zero_shot generalised to C prompt groups (token_ids already [:, :-1])."""
        text_proj = F.normalize(self.text_to_latents.to_latents(self.text_embedding(token_ids)), dim=-1)
        image_proj = F.normalize(self.img_to_latents.to_latents(image_embeds), dim=-1)
        sim = torch.einsum("i d, j d -> i j", image_proj, text_proj) * self.temperature.exp()
        probs = torch.softmax(sim.float(), dim=-1)
        out, start = [], 0
        for g in groups:
            out.append(probs[:, start : start + g].sum(-1, keepdim=True))
            start += g
        return torch.cat(out, dim=-1)


def randomise(module: nn.Module, seed: int = 1) -> nn.Module:
    """Random weights with LayerNorms away from 1/0, so a swapped or missing norm shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            centre = (
                1.0
                if ("norm" in name or name.startswith("ln") or ".ln" in name) and name.endswith("weight")
                else 0.0
            )
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.ndim == 1 else 0.08) + centre)
    return module.eval()
