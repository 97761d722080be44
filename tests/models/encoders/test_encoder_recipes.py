"""Every named encoder gives the features of its published recipe, computed independently in this file.

For each encoder the test writes random weights under the tensor names of the authors' checkpoint, loads
them with `build_encoder(NAME, weights=FILE)` and compares the features with a forward pass written here
from the published recipe (model cards; mahmoodlab/TRIDENT trident/patch_encoder_models/load.py;
KatherLab/STAMP src/stamp/preprocessing/extractor/; CONCH v1.5: TRIDENT model_zoo/conchv1_5/conchv1_5.py)
with torchvision doing the preprocessing on the same uint8 tiles. Giant widths run at depth 2 (the
architecture's own width, heads, MLP and tokens); parameter counts use the real depth on the meta device.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from encoder_recipes_published import PUBLISHED, Published
from safetensors.torch import save_file
from torchvision.transforms.v2 import functional as TF

from wsi.models.encoders import ENCODERS, build_encoder, count_parameters, get_recipe

DEPTH = 2


def _weights(p: Published, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under canonical names (q/k/v apart); `_publish` renames them as the authors do."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 0.02, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std + mean

    w, n_pos = p.width, p.grid_in_file**2 + p.pos_prefix
    sd = {
        "cls": rnd(1, 1, w),
        "pos": rnd(1, n_pos, w),
        "patch.w": rnd(w, 3, p.patch, p.patch),
        "patch.b": rnd(w),
    }
    if p.reg:
        sd["reg"] = rnd(1, p.reg, w)
    out_hidden = p.hidden // 2 if p.swiglu else p.hidden
    for i in range(DEPTH):
        for name, shape in [
            ("q", (w, w)),
            ("k", (w, w)),
            ("v", (w, w)),
            ("proj", (w, w)),
            ("fc1", (p.hidden, w)),
            ("fc2", (w, out_hidden)),
        ]:
            sd[f"{i}.{name}.w"] = rnd(*shape)
            sd[f"{i}.{name}.b"] = rnd(shape[0])
        for name in ("n1", "n2"):
            sd[f"{i}.{name}.w"], sd[f"{i}.{name}.b"] = rnd(w, std=0.1, mean=1.0), rnd(w, std=0.1)
        sd[f"{i}.ls1"], sd[f"{i}.ls2"] = rnd(w, std=0.3), rnd(w, std=0.3)
    sd["norm.w"], sd["norm.b"] = rnd(w, std=0.1, mean=1.0), rnd(w, std=0.1)
    if p.pooling == "attn-pool":  # CONCH: AttentionalPooler(d_model=768, context_dim=1024, n_queries=1)
        sd.update(
            {
                "pq": rnd(1, 768, std=1.0),
                "lnq.w": rnd(768, std=0.1, mean=1.0),
                "lnq.b": rnd(768, std=0.1),
                "lnk.w": rnd(w, std=0.1, mean=1.0),
                "lnk.b": rnd(w, std=0.1),
                "toq": rnd(768, 768),
                "tokv": rnd(1536, w),
                "toout": rnd(768, 768),
                "lnc.w": rnd(768, std=0.1, mean=1.0),
                "lnc.b": rnd(768, std=0.1),
            }
        )
    return sd


def _publish(sd: dict[str, torch.Tensor], p: Published) -> dict[str, torch.Tensor]:
    """The tensor names of the authors' checkpoint: timm's ViT, transformers' Dinov2Model, CONCH's tower."""
    if p.layout == "hf-dinov2":
        out = {
            "embeddings.cls_token": sd["cls"],
            "embeddings.position_embeddings": sd["pos"],
            "embeddings.mask_token": torch.zeros(1, p.width),
            "embeddings.patch_embeddings.projection.weight": sd["patch.w"],
            "embeddings.patch_embeddings.projection.bias": sd["patch.b"],
            "layernorm.weight": sd["norm.w"],
            "layernorm.bias": sd["norm.b"],
        }
        for i in range(DEPTH):
            e = f"encoder.layer.{i}."
            for ours, theirs in [
                ("q", "attention.attention.query"),
                ("k", "attention.attention.key"),
                ("v", "attention.attention.value"),
                ("proj", "attention.output.dense"),
                ("fc1", "mlp.fc1"),
                ("fc2", "mlp.fc2"),
                ("n1", "norm1"),
                ("n2", "norm2"),
            ]:
                out[e + theirs + ".weight"], out[e + theirs + ".bias"] = (
                    sd[f"{i}.{ours}.w"],
                    sd[f"{i}.{ours}.b"],
                )
            out[e + "layer_scale1.lambda1"], out[e + "layer_scale2.lambda1"] = sd[f"{i}.ls1"], sd[f"{i}.ls2"]
        return out
    out = {
        "cls_token": sd["cls"],
        "pos_embed": sd["pos"],
        "patch_embed.proj.weight": sd["patch.w"],
        "patch_embed.proj.bias": sd["patch.b"],
        "norm.weight": sd["norm.w"],
        "norm.bias": sd["norm.b"],
    }
    if p.reg:
        out["reg_token"] = sd["reg"]
    for i in range(DEPTH):
        b = f"blocks.{i}."
        out[b + "attn.qkv.weight"] = torch.cat([sd[f"{i}.{x}.w"] for x in "qkv"])  # timm packs q, k, v
        out[b + "attn.qkv.bias"] = torch.cat([sd[f"{i}.{x}.b"] for x in "qkv"])
        for ours, theirs in [
            ("proj", "attn.proj"),
            ("fc1", "mlp.fc1"),
            ("fc2", "mlp.fc2"),
            ("n1", "norm1"),
            ("n2", "norm2"),
        ]:
            out[b + theirs + ".weight"], out[b + theirs + ".bias"] = sd[f"{i}.{ours}.w"], sd[f"{i}.{ours}.b"]
        out[b + "ls1.gamma"], out[b + "ls2.gamma"] = sd[f"{i}.ls1"], sd[f"{i}.ls2"]
    if p.layout == "conch":
        out = {f"trunk.{k}": v for k, v in out.items()}
        a = "attn_pool_contrast."
        out.update(
            {
                a + "query": sd["pq"],
                a + "ln_q.weight": sd["lnq.w"],
                a + "ln_q.bias": sd["lnq.b"],
                a + "ln_k.weight": sd["lnk.w"],
                a + "ln_k.bias": sd["lnk.b"],
                a + "to_q.weight": sd["toq"],
                a + "to_kv.weight": sd["tokv"],
                a + "to_out.weight": sd["toout"],
                "ln_contrast.weight": sd["lnc.w"],
                "ln_contrast.bias": sd["lnc.b"],
            }
        )
    return out


def _reference(
    sd: dict[str, torch.Tensor], p: Published, tiles: torch.Tensor, *, swap_glu: bool = False
) -> torch.Tensor:
    """The published forward pass, from the recipe: torchvision preprocessing, then the ViT by hand."""
    mode = TF.InterpolationMode.BICUBIC if p.bicubic else TF.InterpolationMode.BILINEAR
    img = TF.resize(tiles.permute(0, 3, 1, 2), [p.resize], interpolation=mode, antialias=True)  # uint8
    img = TF.center_crop(img, [p.crop]).float() / 255.0
    x = TF.normalize(img, list(p.norm[0]), list(p.norm[1]))  # (B, 3, S, S)
    b, w = x.shape[0], p.width
    t = F.conv2d(x, sd["patch.w"], sd["patch.b"], stride=p.patch).flatten(2).transpose(1, 2)  # (B, P, W)
    grid = p.crop // p.patch
    pos = sd["pos"]
    if grid != p.grid_in_file:  # CONCH: DINO's interpolate_pos_encoding, bicubic by scale factor (+0.1)
        s = p.grid_in_file
        patches = pos[:, 1:].reshape(1, s, s, w).permute(0, 3, 1, 2)
        patches = F.interpolate(patches, scale_factor=((grid + 0.1) / s, (grid + 0.1) / s), mode="bicubic")
        pos = torch.cat([pos[:, :1], patches.permute(0, 2, 3, 1).reshape(1, -1, w)], dim=1)
    prefix = [sd["cls"].expand(b, -1, -1)] + ([sd["reg"].expand(b, -1, -1)] if p.reg else [])
    # pos_prefix 0: class and register tokens carry no position; else every token has one (Virchow2's too)
    t = torch.cat([*prefix, t + pos], dim=1) if p.pos_prefix == 0 else torch.cat([*prefix, t], dim=1) + pos
    n, d = t.shape[1], w // p.heads
    for i in range(DEPTH):
        h = F.layer_norm(t, (w,), sd[f"{i}.n1.w"], sd[f"{i}.n1.b"], eps=1e-6)
        q, k, v = (
            F.linear(h, sd[f"{i}.{x}.w"], sd[f"{i}.{x}.b"]).view(b, n, p.heads, d).transpose(1, 2)
            for x in "qkv"
        )
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v  # (B, heads, N, d)
        t = t + sd[f"{i}.ls1"] * F.linear(
            att.transpose(1, 2).reshape(b, n, w), sd[f"{i}.proj.w"], sd[f"{i}.proj.b"]
        )
        h = F.linear(
            F.layer_norm(t, (w,), sd[f"{i}.n2.w"], sd[f"{i}.n2.b"], eps=1e-6),
            sd[f"{i}.fc1.w"],
            sd[f"{i}.fc1.b"],
        )
        if p.swiglu:  # SwiGLU-packed: the first half gates the second
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(value) * gate if swap_glu else F.silu(gate) * value
        else:
            h = F.gelu(h)
        t = t + sd[f"{i}.ls2"] * F.linear(h, sd[f"{i}.fc2.w"], sd[f"{i}.fc2.b"])
    t = F.layer_norm(t, (w,), sd["norm.w"], sd["norm.b"], eps=1e-6)
    if p.pooling == "cls":
        return t[:, 0]
    if p.pooling == "cls+mean":
        return torch.cat([t[:, 0], t[:, 1 + p.reg :].mean(dim=1)], dim=-1)
    kv = F.linear(F.layer_norm(t, (w,), sd["lnk.w"], sd["lnk.b"]), sd["tokv"])  # CONCH pooler, 8 heads
    q = F.linear(F.layer_norm(sd["pq"], (768,), sd["lnq.w"], sd["lnq.b"]), sd["toq"]).view(1, 8, 1, 96)
    kk, vv = (z.view(b, n, 8, 96).transpose(1, 2) for z in kv.chunk(2, dim=-1))
    att = torch.softmax(q @ kk.transpose(-2, -1) / math.sqrt(96), dim=-1) @ vv  # (B, 8, 1, 96)
    out = F.linear(att.transpose(1, 2).reshape(b, 768), sd["toout"])
    return F.layer_norm(out, (768,), sd["lnc.w"], sd["lnc.b"])


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    if path.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.double(), b.double(), dim=-1)


@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    """Two 256 px tiles (the pipeline's default size), smooth enough that resize filters matter little."""
    g = torch.Generator().manual_seed(3)
    small = torch.rand(2, 3, 32, 32, generator=g)
    return (
        (F.interpolate(small, size=(256, 256), mode="bilinear") * 255)
        .round()
        .to(torch.uint8)
        .permute(0, 2, 3, 1)
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_named_vit_gives_the_published_features(name: str, tmp_path: Path, tiles: torch.Tensor) -> None:
    p = PUBLISHED[name]
    sd = _weights(p)
    folder = tmp_path / name  # the authors' hub folder: config.json + the weights file
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    path = _save(_publish(sd, p), folder / p.file)
    enc = build_encoder(name, weights=folder, arch_overrides={"depth": DEPTH})
    assert enc.weights_sha256 == _sha256(path) and enc.name == f"{name}@test"
    with torch.inference_mode():
        ours = enc.embed(tiles)
        reference = _reference(sd, p, tiles)
    assert ours.shape == reference.shape == (2, get_recipe(name).dim)
    assert _cosine(ours, reference).min() > 0.999, _cosine(ours, reference)
    if p.swiglu:  # the comparison can fail: gating the other half of the packed MLP is caught
        assert _cosine(ours, _reference(sd, p, tiles, swap_glu=True)).min() < 0.999


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ENCODERS.names())
def test_parameter_counts_match_the_published_ones(name: str) -> None:
    count = count_parameters(name)  # the real depth, on the meta device
    assert count == get_recipe(name).params
    published = (
        PUBLISHED[name].params
        if name in PUBLISHED
        # conch-v1: its vision tower as coca_model builds it, counted in
        # tests/models/encoders/test_encoder_conch_v1.py; plip: transformers' CLIP ViT-B/32 + projection,
        # counted in tests/models/encoders/test_encoder_plip.py
        else {"retccl": 23.5e6, "ctranspath": 27.5e6, "conch-v1": 87_567_104, "plip": 87_849_216}[name]
    )
    assert abs(count - published) / published < 0.005, (name, count)


def test_every_named_encoder_has_its_facts() -> None:
    for name in ENCODERS.names():
        r = get_recipe(name)
        assert r.dim > 0 and r.training_mpp and r.licence and r.source and r.reference and r.params, name
