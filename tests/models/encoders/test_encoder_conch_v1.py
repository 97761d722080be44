"""CONCH v1 tile encoder against its authors' vision tower, written here from mahmoodlab/CONCH 141cc09
(coca_model._build_vision_tower: a timm VisionTransformer trunk; transformer.AttentionalPooler on
nn.MultiheadAttention; vision_tower.VisualModel.forward_no_head; transform.image_transform with the OpenAI
mean/std of factory.py), random weights saved as their whole CoCa checkpoint (text towers included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torchvision.transforms import v2 as T

from wsi.core.errors import WeightsError
from wsi.models.encoders import build_encoder, count_parameters, get_recipe

DEPTH = 2
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


class AttentionalPooler(nn.Module):
    """transformer.py AttentionalPooler(d_model=512, context_dim=768, n_head=8, n_queries=1)."""

    def __init__(self, d_model: int = 512, context_dim: int = 768, n_head: int = 8, n_queries: int = 1):
        super().__init__()
        self.query = nn.Parameter(torch.randn(n_queries, d_model))
        self.attn = nn.MultiheadAttention(d_model, n_head, kdim=context_dim, vdim=context_dim)
        self.ln_q = nn.LayerNorm(d_model)
        self.ln_k = nn.LayerNorm(context_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_k(x).permute(1, 0, 2)  # NLD -> LND
        q = self.ln_q(self.query).unsqueeze(1).repeat(1, x.shape[1], 1)
        return self.attn(q, x, x, need_weights=False)[0].permute(1, 0, 2)


class ConchVisual(nn.Module):
    """vision_tower.py VisualModel with conch_ViT-B-16.json; `forward_no_head` = encode_image(
    proj_contrast=False, normalize=False)."""

    def __init__(self, depth: int = 12) -> None:
        super().__init__()
        self.trunk = VisionTransformer(embed_dim=768, depth=depth, num_heads=12, mlp_ratio=4, img_size=448,
                                       patch_size=16, num_classes=0, dynamic_img_size=True)  # fmt: skip
        self.attn_pool_contrast = AttentionalPooler()
        self.ln_contrast = nn.LayerNorm(512)
        self.proj_contrast = nn.Parameter(torch.randn(512, 512) * 768**-0.5)

    def forward_no_head(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.trunk.forward_features(x)
        return self.ln_contrast(self.attn_pool_contrast(tokens)[:, 0])


def _reference(seed: int = 0) -> ConchVisual:
    torch.manual_seed(seed)
    ref = ConchVisual(DEPTH)
    with torch.no_grad():
        for p in ref.parameters():  # LayerNorms away from 1/0 so a swapped norm is caught
            p.add_(torch.randn_like(p) * 0.02)
    return ref.eval()


def _checkpoint(ref: ConchVisual, path: Path) -> Path:
    state = {f"visual.{k}": v for k, v in ref.state_dict().items()}
    state["visual.attn_pool_caption.query"] = torch.zeros(256, 768)  # the rest of the CoCa model
    state["visual.ln_caption.weight"] = torch.ones(768)
    state["text.token_embedding.weight"] = torch.zeros(10, 768)
    state["text_decoder.ln_final.weight"] = torch.ones(768)
    state["logit_scale"] = torch.tensor(1.0)
    torch.save(state, path)  # huggingface.co/MahmoodLab/CONCH pytorch_model.bin
    return path


def test_features_equal_the_authors_vision_tower(tmp_path: Path) -> None:
    ref = _reference()
    path = _checkpoint(ref, tmp_path / "pytorch_model.bin")
    enc = build_encoder("conch-v1", weights=tmp_path, arch_overrides={"depth": DEPTH})
    g = torch.Generator().manual_seed(1)
    tiles = torch.randint(0, 256, (2, 256, 256, 3), dtype=torch.uint8, generator=g)  # 256 px tiles
    preprocess = T.Compose([T.Resize(448, interpolation=T.InterpolationMode.BICUBIC, antialias=True),
                            T.CenterCrop(448), T.ToDtype(torch.float32, scale=True),
                            T.Normalize(OPENAI_MEAN, OPENAI_STD)])  # fmt: skip
    with torch.inference_mode():
        want = ref.forward_no_head(preprocess(tiles.permute(0, 3, 1, 2)))
        got = enc.embed(tiles)
    assert got.shape == want.shape == (2, 512)
    assert F.cosine_similarity(got, want).min() > 0.999
    assert enc.weights_sha256 and enc.dim == 512
    del path


def test_parameter_count_is_the_published_vision_tower() -> None:
    with torch.device("meta"):
        ref = ConchVisual(12)
    published = sum(p.numel() for n, p in ref.named_parameters() if n != "proj_contrast")
    assert count_parameters("conch-v1") == published == get_recipe("conch-v1").params == 87_567_104
    recipe = get_recipe("conch-v1")
    assert recipe.mean == OPENAI_MEAN and recipe.std == OPENAI_STD and recipe.input_px == 448


def test_another_conch_is_refused(tmp_path: Path) -> None:
    ref = _reference()
    state = {f"visual.{k}": v for k, v in ref.state_dict().items() if "attn_pool_contrast.attn" not in k}
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(WeightsError, match=r"missing: pool\.attn\.in_proj_bias"):
        build_encoder("conch-v1", weights=tmp_path, arch_overrides={"depth": DEPTH})
