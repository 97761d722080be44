"""PLIP's image tower as transformers runs it, written here from huggingface/transformers 000f1ff
src/transformers/models/clip/modeling_clip.py for tests/models/encoders/test_encoder_plip.py:
CLIPVisionEmbeddings (class_embedding, bias-free patch_embedding, position_embedding), pre_layrnorm,
CLIPEncoderLayer (the same layer as the text tower's, without masks), post_layernorm on the class
token, and CLIPModel's visual_projection (get_image_features), under the checkpoint's names."""

from __future__ import annotations

import torch
from text_towers_reference import RefClipLayer
from torch import nn


class RefClipVision(nn.Module):
    """CLIPModel's image half: `get_image_features(pixel_values)` -> (B, out), unnormalised."""

    def __init__(
        self, *, width=768, heads=12, layers=12, inner=3072, image=224, patch=32, out=512, eps=1e-5
    ) -> None:
        super().__init__()
        vm = nn.Module()
        self.vision_model = vm
        vm.embeddings = nn.Module()
        vm.embeddings.class_embedding = nn.Parameter(torch.randn(width))
        vm.embeddings.patch_embedding = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        vm.embeddings.position_embedding = nn.Embedding((image // patch) ** 2 + 1, width)
        vm.pre_layrnorm = nn.LayerNorm(width, eps=eps)
        vm.encoder = nn.Module()
        vm.encoder.layers = nn.ModuleList([RefClipLayer(width, heads, inner) for _ in range(layers)])
        vm.post_layernorm = nn.LayerNorm(width, eps=eps)
        self.visual_projection = nn.Linear(width, out, bias=False)

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        emb = self.vision_model.embeddings
        b = pixel_values.shape[0]
        patches = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # (B, P, D)
        x = torch.cat([emb.class_embedding.expand(b, 1, -1), patches], dim=1)
        x = x + emb.position_embedding(torch.arange(x.shape[1])[None])
        x = self.vision_model.pre_layrnorm(x)
        zero = torch.zeros(())
        for layer in self.vision_model.encoder.layers:
            x = layer(x, zero, zero)  # CLIPVisionTransformer passes no attention mask
        pooled = self.vision_model.post_layernorm(x[:, 0, :])  # pooler_output
        return self.visual_projection(pooled)
