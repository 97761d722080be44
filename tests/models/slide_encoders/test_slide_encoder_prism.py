"""PRISM's slide encoder against an independent forward written here from the authors' Perceiver
(paige-ai/Prism perceiver.py + modeling_prism.py, as copied in DIAGNijmegen/unicorn_baseline dec3809
src/unicorn_baseline/vision_language/prism/), with random weights saved under the authors' tensor names
(the full checkpoint: text decoder included); parameter count of the published config; refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file, save_model
from slide_bags import make_bag
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.encoders import load_state_dict_file
from wsi.models.slide_encoders import build_slide_encoder, count_parameters, get_spec
from wsi.models.slide_encoders.base import load_checked
from wsi.models.slide_encoders.prism import PerceiverConfig, Prism
from wsi.pipelines.embed_slides import embed_slides, read_embedding


# -------------------------------------------------- the authors' Perceiver, as perceiver.py builds it
class RefCrossAttention(nn.Module):
    """perceiver.py CrossAttention(c_norm=False), the SDPA path with the float mask of ones."""

    def __init__(self, query_dim: int, context_dim: int, head_dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim, inner = heads, head_dim, heads * head_dim
        self.x_norm = nn.LayerNorm(query_dim)
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_kv = nn.Linear(context_dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, query_dim, bias=False)

    def forward(self, x, c=None, kvt=None, attn_mask=None):
        bx, nx, _ = x.shape
        q = self.to_q(self.x_norm(x)).reshape(bx, nx, self.heads, self.head_dim)
        if c is not None:
            bc, nc, _ = c.shape
            k, v = self.to_kv(c).reshape(bc, nc, 2, self.heads, self.head_dim).unbind(2)
            kvt = (k, v)
        else:
            k, v = kvt
            bc, nc = k.shape[:2]
        mask = attn_mask.reshape(bc, 1, nx, nc).expand(-1, self.heads, -1, -1)
        a = F.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), attn_mask=mask
        ).transpose(1, 2)
        return self.to_out(a.reshape(bx, nx, self.heads * self.head_dim)), kvt


class RefMHSA(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, num_heads, bias=False, kdim=dim, vdim=dim, batch_first=True)

    def forward(self, x):
        x = self.norm(x)
        return self.mha(x, x, x, need_weights=False)[0]


class RefGEGLU(nn.Module):
    def forward(self, x):
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class RefFeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.net = nn.Sequential(nn.Linear(dim, dim * 2), RefGEGLU(), nn.Linear(dim, dim), nn.Dropout(0.0))

    def forward(self, x):
        return self.net(self.norm(x))


class RefPerceiver(nn.Module):
    """perceiver.py Perceiver: modules shared across layers exactly as the authors share them."""

    def __init__(self, c: PerceiverConfig) -> None:
        super().__init__()
        self.share_x, self.share_tf = c.share_xattn_start_layer, c.share_tf_start_layer
        self.latent_seq = c.latent_seq + 1
        self.latents = nn.Parameter(torch.randn(c.latent_seq + 1, c.latent_dim))
        d = c.latent_dim

        def get_xattn() -> nn.ModuleDict:
            xattn = RefCrossAttention(d, c.context_dim, d // c.xattn_heads, c.xattn_heads)
            return nn.ModuleDict({"xattn": xattn, "ff": RefFeedForward(d)})

        def get_transformer() -> nn.ModuleList:
            blocks = [
                {"mhsa": RefMHSA(d, c.mhsa_heads), "ff": RefFeedForward(d)}
                for _ in range(c.transformer_depth)
            ]
            return nn.ModuleList([nn.ModuleDict(b) for b in blocks])

        layers: list[nn.ModuleDict] = []
        for i in range(c.perceiver_depth):
            xattn = get_xattn() if i <= self.share_x else layers[-1]["xattn"]
            tf = get_transformer() if i <= self.share_tf else layers[-1]["tf"]
            layers.append(nn.ModuleDict({"xattn": xattn, "tf": tf}))
        self.layers = nn.ModuleList(layers)

    def forward(self, context, attn_mask):
        b, n, _ = context.shape
        attn_mask = attn_mask.reshape(b, 1, n).expand(-1, self.latent_seq, -1)
        x = self.latents.unsqueeze(0).expand(b, -1, -1)
        kvt = None
        for i, layer in enumerate(self.layers):
            xa = layer["xattn"]
            if i <= self.share_x:
                out, kvt = xa["xattn"](x, c=context, attn_mask=attn_mask)
            else:  # the previous layer's keys and values (same W_kv)
                out, kvt = xa["xattn"](x, kvt=kvt, attn_mask=attn_mask)
            x = out + x
            x = xa["ff"](x) + x
            for block in layer["tf"]:
                x = block["mhsa"](x) + x
                x = block["ff"](x) + x
        return x


class RefResampler(nn.Module):
    def __init__(self, c: PerceiverConfig) -> None:
        super().__init__()
        self.cls_norm, self.img_norm = nn.LayerNorm(c.latent_dim), nn.LayerNorm(c.latent_dim)
        self.perceiver = RefPerceiver(c)

    def forward(self, tile_embeddings):
        # PerceiverResampler.forward, batch of one: tile_mask = ones in the embeddings' (float) dtype
        mask = torch.ones(tile_embeddings.shape[:2], dtype=tile_embeddings.dtype)
        x = self.perceiver(context=tile_embeddings, attn_mask=mask)
        return {"image_embedding": self.cls_norm(x[:, 0]), "image_latents": self.img_norm(x[:, 1:])}


class RefPrism(nn.Module):
    """modeling_prism.Prism's tensors: the resampler, the contrastive heads, temperature, and a stand-in
    for the BioGPT text decoder (its tensor names only matter: the loader must skip them by prefix)."""

    def __init__(self, c: PerceiverConfig) -> None:
        super().__init__()
        self.image_resampler = RefResampler(c)
        self.text_decoder = nn.Module()
        self.text_decoder.model = nn.Module()
        self.text_decoder.model.biogpt = nn.Embedding(10, 8)
        self.img_to_latents = nn.Module()
        self.img_to_latents.to_latents = nn.Linear(c.latent_dim, c.dim_latents, bias=False)
        self.text_to_latents = nn.Module()
        self.text_to_latents.to_latents = nn.Linear(8, c.dim_latents, bias=False)
        self.temperature = nn.Parameter(torch.log(torch.tensor(1.0) / 0.07))

    def slide_representations(self, tile_embeddings):
        return self.image_resampler(tile_embeddings)


# paige-ai/Prism config.json perceiver_config, and PrismConfig.dim_latents (typed in from the authors' files)
PUBLISHED = PerceiverConfig(
    latent_seq=512, latent_dim=1280, context_dim=2560, mhsa_heads=8, perceiver_depth=8, transformer_depth=6,
    share_xattn_start_layer=1, share_tf_start_layer=0, xattn_heads=1, dim_latents=5120,
)  # fmt: skip
TINY = PerceiverConfig(latent_seq=8, latent_dim=32, context_dim=2560, mhsa_heads=4, perceiver_depth=4,
                       transformer_depth=2, dim_latents=40)  # fmt: skip


def _reference(cfg: PerceiverConfig, seed: int = 1) -> RefPrism:
    ref = RefPrism(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ref.named_parameters():  # shared modules are one parameter: randomised once
            # unit-scale outputs from every sublayer, so each one shows in the embedding
            z = torch.randn(p.shape, generator=g)
            if name.endswith("latents") or name == "temperature" or "biogpt" in name:
                p.copy_(z)
            elif p.ndim == 2:
                p.copy_(z / p.shape[1] ** 0.5)
            else:  # LayerNorm weights near 1, biases near 0
                p.copy_(z * 0.1 + (1.0 if name.endswith("norm.weight") else 0.0))
    return ref.eval()


def _load(cfg: PerceiverConfig, path: Path) -> Prism:
    model = Prism(cfg)
    load_checked(model, load_state_dict_file(path), path, "prism")
    return model.eval()


def _embedding(ref: RefPrism, feats: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.slide_representations(feats[None])["image_embedding"][0]


def test_features_equal_the_authors_forward_from_the_published_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _reference(TINY)
    safetensors_file = tmp_path / "model.safetensors"  # shared layers stored once, as safetensors must
    save_model(ref, str(safetensors_file))
    keys = set(load_state_dict_file(safetensors_file))
    assert "image_resampler.perceiver.layers.1.xattn.xattn.to_kv.weight" in keys
    assert "image_resampler.perceiver.layers.2.xattn.xattn.to_kv.weight" not in keys  # a shared copy
    assert "text_decoder.model.biogpt.weight" in keys and "temperature" in keys
    full_file = tmp_path / "pytorch_model.bin"  # torch.save keeps every layer's name
    torch.save(ref.state_dict(), full_file)
    feats = torch.randn(300, 2560)
    want = _embedding(ref, feats)
    for path in (safetensors_file, full_file):
        got = _load(TINY, path).encode(feats, None, 112.0)
        assert got.shape == (32,)
        assert F.cosine_similarity(got, want, dim=0) > 0.999
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with monkeypatch.context() as m:  # the comparison can fail: gating the other GEGLU half is caught
        m.setattr(RefGEGLU, "forward", lambda self, x: x.chunk(2, -1)[1] * F.gelu(x.chunk(2, -1)[0]))
        assert F.cosine_similarity(got, _embedding(ref, feats), dim=0) < 0.999
    model = _load(TINY, safetensors_file)
    half = model.encode(feats.half(), None, 112.0)  # float16 bags (wsi embed's default)
    assert F.cosine_similarity(half, want, dim=0) > 0.999
    import wsi.models.slide_encoders.base as base

    old, base.CHUNK_TILES = base.CHUNK_TILES, 7  # chunked softmax is exact, whatever the chunk
    try:
        torch.testing.assert_close(model.encode(feats, None, 112.0), want, atol=1e-4, rtol=1e-4)
    finally:
        base.CHUNK_TILES = old


def test_every_vision_tensor_is_checked_and_only_text_is_skipped(tmp_path: Path) -> None:
    ref = _reference(TINY)
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    dropped = tmp_path / "no_img_to_latents.safetensors"
    save_file({k: v for k, v in state.items() if not k.startswith("img_to_latents")}, str(dropped))
    with pytest.raises(WeightsError, match=r"1 missing: img_to_latents\.weight"):
        _load(TINY, dropped)
    extra = tmp_path / "extra.safetensors"
    save_file({**state, "image_resampler.pos_embed": torch.zeros(3)}, str(extra))
    with pytest.raises(WeightsError, match=r"1 unexpected: image_resampler\.pos_embed"):
        _load(TINY, extra)
    unshared = dict(state)  # layers 1 and 2 must share their cross-attention
    unshared["image_resampler.perceiver.layers.2.xattn.xattn.to_q.weight"] = torch.zeros_like(
        state["image_resampler.perceiver.layers.2.xattn.xattn.to_q.weight"]
    )
    path = tmp_path / "unshared.pth"
    torch.save(unshared, path)
    with pytest.raises(WeightsError, match=r"layers\.1\.xattn\.xattn\.to_q\.weight and .*layers\.2\.xattn"):
        _load(TINY, path)
    vision_only = tmp_path / "vision.safetensors"  # a checkpoint without the text side loads too
    save_file(
        {k: v for k, v in state.items() if not k.startswith(("text_", "temperature"))}, str(vision_only)
    )
    feats = torch.randn(20, 2560)
    torch.testing.assert_close(_load(TINY, vision_only).encode(feats, None, 112.0), _embedding(ref, feats),
                               atol=1e-4, rtol=1e-4)  # fmt: skip


def test_parameter_count_is_the_published_config() -> None:
    assert PerceiverConfig() == PUBLISHED  # what `--encoder prism` builds
    with torch.device("meta"):  # built here from the authors' modules; shared ones count once
        ref = RefPrism(PUBLISHED)
    vision = sum(p.numel() for n, p in ref.named_parameters() if not n.startswith(("text_", "temperature")))
    assert count_parameters("prism") == vision == get_spec("prism").params == 105_591_040
    resampler = sum(p.numel() for p in ref.image_resampler.parameters())
    assert resampler == 99_037_440  # the Perceiver that makes the embedding; + img_to_latents 6,553,600


def test_row_order_does_not_change_the_embedding_and_positions_are_not_read() -> None:
    model = Prism(TINY).eval()
    feats, coords = torch.randn(200, 2560), torch.rand(200, 2) * 50_000
    perm = torch.randperm(200)
    a = model.encode(feats, coords, 112.0)
    torch.testing.assert_close(model.encode(feats[perm], coords[perm], 112.0), a, atol=1e-5, rtol=1e-5)
    # the authors' Perceiver has no positional encoding: other coordinates give the same embedding
    torch.testing.assert_close(model.encode(feats, coords * 3 + 7, 112.0), a)
    assert not torch.allclose(model.encode(feats[:100], coords[:100], 112.0), a, atol=1e-4)
    assert not get_spec("prism").uses_positions
    with pytest.raises(ValueError, match="empty bag"):
        model.encode(feats[:0], None, 112.0)


@pytest.fixture
def tiny_prism(monkeypatch: pytest.MonkeyPatch) -> None:
    """`wsi embed-slides --encoder prism --random-init` builds the tiny config (the pipeline is the test)."""
    monkeypatch.setattr(Prism, "CONFIG", TINY)


def test_bags_of_another_tile_encoder_are_refused(tmp_path: Path, tiny_prism: None) -> None:
    make_bag(tmp_path / "bags" / "v2.h5", encoder="virchow2", dim=2560, tile_um=112.0)
    make_bag(tmp_path / "bags" / "big.h5", encoder="virchow", dim=2560, tile_um=256.0)
    make_bag(tmp_path / "bags" / "ok.h5", encoder="virchow", dim=2560, tile_um=112.0)
    embedded = embed_slides(tmp_path / "bags", encoder="prism", random_init=True, out_dir=tmp_path)
    _, results = embedded.folder, list(embedded)
    by_id = {r.slide_id: r for r in results}
    assert "holds virchow2 features, but slide encoder 'prism' reads virchow features" in by_id["v2"].error
    assert "holds tiles of 256 um, but slide encoder 'prism' was trained on 112 um" in by_id["big"].error
    assert by_id["ok"].status == "ok"
    emb = read_embedding(tmp_path / "prism-slide" / "ok.h5")
    assert emb.vector.shape == (TINY.latent_dim,) and np.isfinite(emb.vector).all()
    assert emb.attrs["tile_encoder"] == "virchow"


def test_stamp_virchow_full_bags_are_virchow(tmp_path: Path, tiny_prism: None) -> None:
    import h5py

    for name, extractor, dim in (("full", "virchow-full", 2560), ("cls", "virchow", 1280)):
        with h5py.File(tmp_path / f"{name}.h5", "w") as h5:  # STAMP tile bags (coords in um)
            h5["feats"] = np.random.default_rng(0).normal(size=(12, dim)).astype(np.float32)
            h5["coords"] = np.arange(24, dtype=np.float32).reshape(12, 2) * 112
            h5.attrs["tile_size_um"], h5.attrs["extractor"], h5.attrs["unit"] = 112.0, extractor, "um"
    embedded = embed_slides(tmp_path, encoder="prism", random_init=True, out_dir=tmp_path / "o")
    _, results = embedded.folder, list(embedded)
    by_id = {r.slide_id: r for r in results}
    assert by_id["full"].status == "ok", by_id["full"].error
    assert "class token only" in by_id["cls"].error and "reads virchow features" in by_id["cls"].error


@pytest.mark.slow
def test_full_published_config_equals_the_authors_forward(tmp_path: Path) -> None:
    ref = _reference(PUBLISHED, seed=3)
    path = tmp_path / "model.safetensors"
    save_model(ref, str(path))
    del ref.text_decoder
    feats = torch.randn(64, 2560)
    model = build_slide_encoder("prism", weights=tmp_path)  # the model folder, as downloaded
    got = model.encode(feats, None, 112.0)
    want = _embedding(ref, feats)
    assert got.shape == (1280,)
    assert F.cosine_similarity(got, want, dim=0) > 0.999
