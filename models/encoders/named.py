"""The named tile encoders, each exactly as its authors publish it.

Every recipe was checked against the authors' model card or reference code and the encoder code of the
peers that run it (the files are named beside each recipe; read at mahmoodlab/TRIDENT a91fa84,
KatherLab/STAMP c54ce06, rendeirolab/lazyslide-models 0127beb). Where they disagree the comment says
which one we follow and why. `params` is the architecture's exact count (tests build it on the meta
device and compare, and compare with the published rounded figure).

To add an encoder: one factory here with `@ENCODERS.register("name")`, a key layout in weights.py if
the checkpoint does not use timm's names, and a row in tests/models/encoders/test_encoders.py's table.
"""

from __future__ import annotations

from wsi.core.json_types import JsonObject
from wsi.models.encoders.recipe import ENCODERS, EncoderRecipe

RETCCL_SHA256 = "931956f31d3f1a3f6047f3172b9e59ee3460d29f7c0c2bb219cbc8e9207795ff"
# ctranspath.pth from the TransPath authors' Google Drive link, as STAMP pins it
# (KatherLab/STAMP src/stamp/preprocessing/extractor/ctranspath.py)
CTRANSPATH_SHA256 = "7c998680060c8743551a412583fac689db43cec07053b72dfec6dcd810113539"
HOPTIMUS_MEAN = (0.707223, 0.578729, 0.703617)
HOPTIMUS_STD = (0.211883, 0.230117, 0.177517)


@ENCODERS.register("retccl")
def retccl() -> EncoderRecipe:
    # RetCCL (Wang et al. 2023, Medical Image Analysis): a torchvision ResNet-50 whose fc was replaced by
    # Identity before saving best_ckpt.pth; timm's resnet50 uses the same tensor names. 256 px at 1 um/px,
    # no crop, ImageNet statistics (Xiyue-Wang/RetCCL get_feature.py; the paper's pipeline).
    return EncoderRecipe(
        arch="resnet50",
        dim=2048,
        input_px=256,
        pooling="model",  # global average pool
        ignore_keys=(r"^fc\.",),
        weights_files=("best_ckpt.pth",),
        published_sha256=RETCCL_SHA256,
        params=23_508_032,
        training_mpp=1.0,
        licence="none stated (no licence file in Xiyue-Wang/RetCCL: academic use; ask the authors otherwise)",
        source="best_ckpt.pth linked from github.com/Xiyue-Wang/RetCCL",
        reference="Xiyue-Wang/RetCCL get_feature.py",
        channels_last=True,
    )


@ENCODERS.register("uni")
def uni() -> EncoderRecipe:
    # UNI (Chen et al. 2024, Nature Medicine): ViT-L/16, LayerScale 1e-5, class token, 224 px.
    # TRIDENT UNIInferenceEncoder (trident/patch_encoder_models/load.py): vit_large_patch16_224, init_values
    # 1e-5, Resize(224) + CenterCrop(224) (bilinear), ImageNet mean/std; the same in lazyslide-models
    # vision/uni.py
    # and STAMP preprocessing/extractor/uni.py.
    return EncoderRecipe(
        arch="vit_large_patch16_224",
        dim=1024,
        input_px=224,
        kwargs={"img_size": 224, "patch_size": 16, "init_values": 1e-5},
        pooling="cls",
        weights_files=("pytorch_model.bin", "model.safetensors"),
        params=303_350_784,
        training_mpp=0.5,  # 20x
        licence="CC-BY-NC-ND-4.0 (gated: accept the terms on the authors' page)",
        source="huggingface.co/MahmoodLab/UNI: pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (UNIInferenceEncoder)",
    )


@ENCODERS.register("uni2-h")
def uni2_h() -> EncoderRecipe:
    # UNI2-h: ViT-H/14-sized giant (1536 wide, 24 deep, 24 heads), SwiGLU-packed MLP (ratio 2.66667 * 2),
    # SiLU, 8 register tokens without position embeddings (no_embed_class), class token output.
    # TRIDENT UNIv2InferenceEncoder and STAMP preprocessing/extractor/uni2.py give the same timm kwargs on
    # vit_giant_patch14_224; Resize(224) + CenterCrop(224), ImageNet mean/std.
    return EncoderRecipe(
        arch="vit_giant_patch14_224",
        dim=1536,
        input_px=224,
        kwargs={
            "img_size": 224,
            "patch_size": 14,
            "depth": 24,
            "num_heads": 24,
            "init_values": 1e-5,
            "embed_dim": 1536,
            "mlp_ratio": 2.66667 * 2,
            "no_embed_class": True,
            "mlp_layer": "swiglu_packed",
            "act_layer": "silu",
            "reg_tokens": 8,
        },
        pooling="cls",
        weights_files=("pytorch_model.bin", "model.safetensors"),
        params=681_394_176,
        training_mpp=0.5,
        licence="CC-BY-NC-ND-4.0 (gated)",
        source="huggingface.co/MahmoodLab/UNI2-h: pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (UNIv2InferenceEncoder)",
    )


#: Virchow's and Virchow2's ViT-H/14 (the hub configs): SwiGLU-packed MLP, SiLU, LayerScale 1e-5
_VIRCHOW_VIT: JsonObject = {
    "img_size": 224,
    "init_values": 1e-5,
    "mlp_ratio": 5.3375,
    "mlp_layer": "swiglu_packed",
    "act_layer": "silu",
}


@ENCODERS.register("virchow")
def virchow() -> EncoderRecipe:
    # Virchow (v1; Vorontsov et al. 2024, Nature Medicine), PRISM's tile encoder: ViT-H/14 as Virchow2 but
    # without register tokens (1 + 256 positions), SwiGLU-packed MLP (ratio 5.3375), SiLU, LayerScale
    # 1e-5; output = [class token, mean of the 256 patch tokens] = 2560, the tile embedding PRISM reads.
    # The hub config (tag virchow_v1): vit_huge_patch14_224, img_size 224, init_values 1e-5, mlp_ratio
    # 5.3375, global_pool "", bicubic, crop_pct 1.0, ImageNet mean/std. TRIDENT VirchowInferenceEncoder
    # (cls + mean of output[:, 1:]) and STAMP preprocessing/extractor/virchow_full.py ("virchow-full",
    # what STAMP's PRISM requires) agree; STAMP's "virchow" keeps the class token only (1280).
    return EncoderRecipe(
        arch="vit_huge_patch14_224",
        dim=2560,
        input_px=224,
        kwargs=dict(_VIRCHOW_VIT),
        interpolation="bicubic",
        pooling="cls+mean",
        weights_files=("pytorch_model.bin", "model.safetensors"),
        params=631_229_184,
        training_mpp=0.5,  # 224 px tiles at 20x (the Virchow paper; PRISM's tiling)
        licence="Apache-2.0 with the authors' terms of use (gated; research use)",
        source="huggingface.co/paige-ai/Virchow: pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (VirchowInferenceEncoder)",
    )


@ENCODERS.register("virchow2")
def virchow2() -> EncoderRecipe:
    # Virchow2 (Zimmermann et al. 2024): ViT-H/14, SwiGLU-packed MLP (ratio 5.3375), SiLU, LayerScale 1e-5,
    # 4 register tokens that DO have position embeddings (no_embed_class False: 1 + 4 + 256 positions);
    # output = [class token, mean of the 256 patch tokens] = 2560. TRIDENT Virchow2InferenceEncoder
    # (patch tokens output[:, 5:]) and lazyslide-models vision/virchow.py agree; STAMP keeps the class token
    # only (a choice of theirs, not the model card's). Resize(224, bicubic), crop_pct 1.0, ImageNet mean/std.
    return EncoderRecipe(
        arch="vit_huge_patch14_224",
        dim=2560,
        input_px=224,
        kwargs={**_VIRCHOW_VIT, "reg_tokens": 4},
        interpolation="bicubic",
        pooling="cls+mean",
        weights_files=("model.safetensors", "pytorch_model.bin"),
        params=631_239_424,
        training_mpp=0.5,  # mixed magnification 5x-40x (2.0-0.25 um/px) in training; 20x is its main scale
        licence="CC-BY-NC-ND-4.0 (gated)",
        source="huggingface.co/paige-ai/Virchow2: model.safetensors or pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (Virchow2InferenceEncoder)",
    )


def _h_optimus(version: str, licence: str) -> EncoderRecipe:
    # H-optimus-0/1 (Bioptimus): vit_giant_patch14_reg4_dinov2 (1536 wide, 40 deep, SwiGLU-packed, SiLU,
    # 4 registers, no_embed_class), init_values 1e-5, class token, 224 px at 0.5 um/px, their own mean/std.
    # TRIDENT HOptimus0/1InferenceEncoder and STAMP preprocessing/extractor/h_optimus_1.py resize with
    # Resize(224) (bilinear); lazyslide-models vision/h_optimus.py uses bicubic. The model card feeds 224 px
    # tiles without any resize, so the filter only matters for other tile sizes: we follow TRIDENT and STAMP.
    return EncoderRecipe(
        arch="vit_giant_patch14_reg4_dinov2",
        dim=1536,
        input_px=224,
        mean=HOPTIMUS_MEAN,
        std=HOPTIMUS_STD,
        kwargs={"img_size": 224, "init_values": 1e-5},
        pooling="cls",
        weights_files=("model.safetensors", "pytorch_model.bin"),
        params=1_134_774_272,
        training_mpp=0.5,
        licence=licence,
        source=f"huggingface.co/bioptimus/H-optimus-{version}: model.safetensors or pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py "
        f"(HOptimus{version}InferenceEncoder)",
    )


@ENCODERS.register("h-optimus-0")
def h_optimus_0() -> EncoderRecipe:
    return _h_optimus("0", "Apache-2.0 (gated)")


@ENCODERS.register("h-optimus-1")
def h_optimus_1() -> EncoderRecipe:
    return _h_optimus("1", "CC-BY-NC-ND-4.0 (gated; academic research)")


@ENCODERS.register("prov-gigapath")
def prov_gigapath() -> EncoderRecipe:
    # Prov-GigaPath tile encoder (Xu et al. 2024, Nature): the hub config builds vit_giant_patch14_dinov2 with
    # patch_size 16 (not 14), 1536 wide, 40 deep, 24 heads, mlp_ratio 5.33334 SwiGLU-packed (timm default for
    # this architecture), LayerScale, class token; Resize(256, bicubic) + CenterCrop(224), ImageNet mean/std.
    # TRIDENT GigaPathInferenceEncoder and STAMP preprocessing/extractor/gigapath.py agree.
    return EncoderRecipe(
        arch="vit_giant_patch14_dinov2",
        dim=1536,
        input_px=224,
        resize_px=256,
        interpolation="bicubic",
        kwargs={
            "img_size": 224,
            "in_chans": 3,
            "patch_size": 16,
            "embed_dim": 1536,
            "depth": 40,
            "num_heads": 24,
            "init_values": 1e-5,
            "mlp_ratio": 5.33334,
        },
        pooling="cls",
        weights_files=("pytorch_model.bin", "model.safetensors"),
        params=1_134_953_984,
        training_mpp=0.5,
        licence="Apache-2.0 with the authors' conditions (research use; gated)",
        source="huggingface.co/prov-gigapath/prov-gigapath: pytorch_model.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (GigaPathInferenceEncoder)",
    )


@ENCODERS.register("ctranspath")
def ctranspath() -> EncoderRecipe:
    # CTransPath (Wang et al. 2022): Swin-T/4 window 7 whose patch embedding is a convolutional stem; the
    # head is removed and the globally averaged last stage (768) is the feature. Resize(224), no crop,
    # ImageNet
    # mean/std (Xiyue-Wang/TransPath get_features_CTransPath.py; TRIDENT CTransPathInferenceEncoder). The
    # checkpoint uses timm 0.5's Swin layout ("swin-v1": downsample at the end of a stage) and carries
    # relative_position_index / attn_mask buffers that timm derives itself.
    return EncoderRecipe(
        arch="swin_tiny_patch4_window7_224",
        dim=768,
        input_px=224,
        kwargs={"embed_layer": "conv_stem"},
        pooling="model",
        key_layout="swin-v1",
        ignore_keys=(r"relative_position_index$", r"attn_mask$", r"^head\."),
        weights_files=("ctranspath.pth", "CHIEF_CTransPath.pth"),
        published_sha256=CTRANSPATH_SHA256,
        params=27_520_038,
        training_mpp=1.0,  # TCGA + PAIP regions at 20x resized for pretraining; STAMP tiles it at ~1.14 um/px
        licence="GPL-3.0 (Xiyue-Wang/TransPath)",
        source="ctranspath.pth linked from github.com/Xiyue-Wang/TransPath",
        reference="KatherLab/STAMP src/stamp/preprocessing/extractor/ctranspath.py; "
        "Xiyue-Wang/TransPath ctran.py",
    )


@ENCODERS.register("phikon-v2")
def phikon_v2() -> EncoderRecipe:
    # Phikon-v2 (Filiot et al. 2024): a transformers Dinov2Model, ViT-L/16 (1024 wide, 24 deep, 16 heads,
    # LayerScale, GELU MLP ratio 4, LayerNorm eps 1e-6), output last_hidden_state[:, 0] (class token after
    # the final LayerNorm). Built here as the same timm ViT-L/16; the "hf-dinov2" key layout packs q/k/v.
    # Resize(224) + CenterCrop(224), ImageNet mean/std (TRIDENT Phikonv2InferenceEncoder).
    return EncoderRecipe(
        arch="vit_large_patch16_224",
        dim=1024,
        input_px=224,
        kwargs={"img_size": 224, "patch_size": 16, "init_values": 1.0},
        pooling="cls",
        key_layout="hf-dinov2",
        ignore_keys=(r"^embeddings\.mask_token$",),  # masked-image-modelling token, unused at inference
        weights_files=("model.safetensors",),
        params=303_350_784,
        training_mpp=0.5,
        licence="Owkin non-commercial licence",
        source="huggingface.co/owkin/phikon-v2: model.safetensors + config.json",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/load.py (Phikonv2InferenceEncoder)",
    )


@ENCODERS.register("conch-v1.5")
def conch_v15() -> EncoderRecipe:
    # CONCH v1.5 (the TITAN paper's tile encoder): ViT-L/16 trunk (qkv bias, LayerScale) at 448 px, its
    # 14 x 14 position table interpolated DINO-style, then an attentional pooler (1 query, 8 heads) +
    # LayerNorm to 768.
    # TRIDENT model_zoo/conchv1_5/conchv1_5.py: Resize(448, bilinear) + CenterCrop(448), ImageNet mean/std;
    # lazyslide-models multimodal/titan.py resizes bicubic: we follow the authors' own TRIDENT.
    return EncoderRecipe(
        arch="vit_large_patch16_224",
        dim=768,
        input_px=448,
        kwargs={"img_size": 448, "patch_size": 16, "init_values": 1.0},
        pooling="attn-pool",
        key_layout="conch-v1.5",
        weights_files=("pytorch_model_vision.bin",),
        params=306_711_296,
        training_mpp=0.5,
        licence="CC-BY-NC-ND-4.0 (gated)",
        source="huggingface.co/MahmoodLab/conchv1_5: pytorch_model_vision.bin",
        reference="mahmoodlab/TRIDENT trident/patch_encoder_models/model_zoo/conchv1_5/conchv1_5.py",
    )


@ENCODERS.register("conch-v1")
def conch_v1() -> EncoderRecipe:
    # CONCH v1 (Lu et al., Nature Medicine 2024), mahmoodlab/CONCH 141cc09: conch_ViT-B-16.json (image_size
    # 448, patch 16, attentional pooler 8 heads, 1 contrast query, embed_dim 512) builds a timm ViT-B/16
    # trunk (coca_model._build_vision_tower: class token, qkv bias, no LayerScale, forward_features = normed
    # tokens); the feature is encode_image(proj_contrast=False, normalize=False) = ln_contrast(pooled), 512-d,
    # what MADELEINE (madeleine/preprocessing/conch_patch_embedder.py), TRIDENT Conchv1InferenceEncoder and
    # STAMP preprocessing/extractor/conch.py all take. transform.py: Resize(448, bicubic) + CenterCrop(448),
    # OpenAI CLIP mean/std (factory.py). MADELEINE's own extraction forced 224 px; TRIDENT and STAMP run
    # the model's 448: we follow the model's config.
    return EncoderRecipe(
        arch="vit_base_patch16_224",
        dim=512,
        input_px=448,
        mean=(0.48145466, 0.4578275, 0.40821073),
        std=(0.26862954, 0.26130258, 0.27577711),
        kwargs={"img_size": 448, "patch_size": 16},
        interpolation="bicubic",
        pooling="mha-pool",
        key_layout="conch-v1",
        ignore_keys=(  # the caption pooler, the contrastive projection and the text towers
            r"^(visual\.)?(proj_contrast|attn_pool_caption\.|ln_caption\.)",
            r"^(text|text_decoder)\.",
            r"^logit_scale$",
        ),
        weights_files=("pytorch_model.bin",),
        params=CONCH_V1_PARAMS,
        training_mpp=0.5,
        licence="CC-BY-NC-ND-4.0 (gated)",
        source="huggingface.co/MahmoodLab/CONCH: pytorch_model.bin",
        reference="mahmoodlab/CONCH 141cc09 conch/open_clip_custom/ (coca_model.py, vision_tower.py, "
        "transformer.py, factory.py, transform.py)",
    )


@ENCODERS.register("plip")
def plip() -> EncoderRecipe:
    # PLIP (Huang et al. 2023, Nature Medicine): CLIP ViT-B/32 fine-tuned on OpenPath, published as a
    # transformers CLIPModel (huggingface.co/vinid/plip). The authors' encode_images (PathologyFoundation/plip
    # f010f3d plip.py) returns CLIPModel.get_image_features = visual_projection(post_layernorm(class token)),
    # 512-d, unnormalised; lazyslide-models multimodal/plip.py takes the same. That is the bag feature: it
    # lies in the joint space the text tower (wsi.models.text_encoders "plip") scores. CLIPProcessor:
    # shortest side to 224 (bicubic), CenterCrop(224), OpenAI mean/std; the authors' reproducibility
    # transform (embedders/transform.py _transform) is the same. The key layout "hf-clip" maps the
    # checkpoint's names (models/encoders/clip_vision.py). No stated training resolution: OpenPath's images
    # are at assorted magnifications; 0.5 um/px is that of its zero-shot benchmark Kather colon (224 px at
    # 0.5 um/px) and of LazySlide's PLIP example (tile_tissues(256, mpp=0.5)).
    return EncoderRecipe(
        arch="vit_base_patch32_clip_quickgelu_224",
        dim=512,
        input_px=224,
        mean=(0.48145466, 0.4578275, 0.40821073),
        std=(0.26862954, 0.26130258, 0.27577711),
        kwargs={"img_size": 224},
        interpolation="bicubic",
        pooling="cls-proj",
        key_layout="hf-clip",
        ignore_keys=(  # the text tower and the temperature (wsi.models.text_encoders reads them)
            r"^text_model\.",
            r"^text_projection\.",
            r"^logit_scale$",
            r"^vision_model\.embeddings\.position_ids$",  # a buffer older transformers saved
        ),
        weights_files=("pytorch_model.bin", "model.safetensors"),
        params=PLIP_VISION_PARAMS,
        training_mpp=0.5,
        licence="research use (see the PLIP terms on huggingface.co/vinid/plip)",
        source="huggingface.co/vinid/plip: pytorch_model.bin",
        reference="PathologyFoundation/plip f010f3d plip.py (CLIPModel.get_image_features); huggingface/"
        "transformers 000f1ff src/transformers/models/clip/modeling_clip.py (CLIPVisionTransformer)",
    )


#: CLIP ViT-B/32 vision tower 87,456,000 + visual_projection 768 x 512 (lazyslide-models: "87.8M")
PLIP_VISION_PARAMS = 87_849_216

#: timm ViT-B/16 at 448 px (784 + 1 positions) 86,250,240 + the contrastive pooler and ln_contrast 1,316,864
CONCH_V1_PARAMS = 87_567_104


__all__ = ["CTRANSPATH_SHA256", "RETCCL_SHA256"]
