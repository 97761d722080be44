"""PLIP tile encoder against transformers' CLIP image tower (tests/helpers/clip_vision_reference.py), random
weights saved as the whole CLIPModel checkpoint huggingface.co/vinid/plip publishes (text tower included),
tiles preprocessed as CLIPProcessor does (shortest side to 224 bicubic, centre crop, OpenAI mean/std)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from clip_vision_reference import RefClipVision
from text_towers_reference import RefClipModelText, randomise
from torchvision.transforms import v2 as T

from wsi.core.errors import WeightsError
from wsi.models.encoders import build_encoder, count_parameters, get_recipe

DEPTH = 2
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@pytest.fixture(scope="module")
def reference() -> RefClipVision:
    return randomise(RefClipVision(layers=DEPTH), seed=4)


def _checkpoint(ref: RefClipVision, folder: Path, drop: str = "") -> Path:
    """pytorch_model.bin as CLIPModel.save_pretrained writes it: both towers, the projections, logit_scale."""
    state = {k: v for k, v in ref.state_dict().items() if not (drop and drop in k)}
    text = RefClipModelText(width=32, heads=4, layers=1, inner=64, out=512)
    state |= text.state_dict()  # text_model.*, text_projection.weight, logit_scale
    state["vision_model.embeddings.position_ids"] = torch.arange(50)[None]  # older transformers saved it
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (3, 256, 256, 3), dtype=torch.uint8, generator=g)  # the default 256 px


def test_features_equal_get_image_features(tmp_path: Path, reference: RefClipVision, tiles) -> None:
    enc = build_encoder("plip", weights=_checkpoint(reference, tmp_path / "plip"),
                        arch_overrides={"depth": DEPTH})  # fmt: skip
    processor = T.Compose([T.Resize(224, interpolation=T.InterpolationMode.BICUBIC, antialias=True),
                           T.CenterCrop(224), T.ToDtype(torch.float32, scale=True),
                           T.Normalize(OPENAI_MEAN, OPENAI_STD)])  # fmt: skip
    with torch.inference_mode():
        want = reference.get_image_features(processor(tiles.permute(0, 3, 1, 2)))
        got = enc.embed(tiles)
    assert got.shape == want.shape == (3, 512) and enc.dim == 512
    with torch.inference_mode():  # the network alone, on the same input: equal to float rounding
        x = enc.preprocess(tiles)
        torch.testing.assert_close(enc(x), reference.get_image_features(x), rtol=1e-4, atol=1e-4)
    assert F.cosine_similarity(got.double(), want.double()).min() > 0.9999
    torch.testing.assert_close(got.norm(dim=-1), want.norm(dim=-1), rtol=2e-3, atol=0)  # unnormalised
    # the comparison can fail: the class token before the final norm gives other features
    post = reference.vision_model.post_layernorm
    reference.vision_model.post_layernorm = torch.nn.Identity()
    try:
        with torch.inference_mode():
            unnormed = reference.get_image_features(processor(tiles.permute(0, 3, 1, 2)))
    finally:
        reference.vision_model.post_layernorm = post
    assert F.cosine_similarity(got.double(), unnormed.double()).min() < 0.999


def test_parameter_count_and_preprocessing_are_the_published_ones() -> None:
    with torch.device("meta"):
        full = RefClipVision()
    published = sum(p.numel() for p in full.parameters())
    assert count_parameters("plip") == published == get_recipe("plip").params == 87_849_216  # "87.8M"
    r = get_recipe("plip")
    assert (r.mean, r.std, r.input_px, r.resize_to, r.interpolation) == (
        OPENAI_MEAN, OPENAI_STD, 224, 224, "bicubic"
    )  # fmt: skip
    assert (r.pooling, r.dim) == ("cls-proj", 512)  # the joint-space embedding the text tower scores


def test_a_checkpoint_of_another_shape_is_named(tmp_path: Path, reference: RefClipVision) -> None:
    folder = _checkpoint(reference, tmp_path / "noq", drop="layers.1.self_attn.q_proj")
    with pytest.raises(WeightsError, match=r"layers\.1\.self_attn lacks q_proj\.(weight|bias)"):
        build_encoder("plip", weights=folder, arch_overrides={"depth": DEPTH})
    folder = _checkpoint(reference, tmp_path / "noproj", drop="visual_projection")
    with pytest.raises(WeightsError, match=r"1 missing: pool\.proj\.weight"):
        build_encoder("plip", weights=folder, arch_overrides={"depth": DEPTH})
