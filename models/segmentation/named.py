"""The published tissue and artifact segmentation networks, built as their authors build them.

GrandQC's tissue and artifact networks and HEST's tissue network, each checked against the authors'
code and TRIDENT's (which runs all three); the builders below cite file and commit. Weights are the
user's, read as tensors only (`SegmenterSpec.weights_hint` says which file). segmentation_models_pytorch
is an optional extra (`pip install wsi[seg]`); torchvision is a dependency.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import nn

from wsi.core.errors import ConfigError
from wsi.core.registry import Registry
from wsi.storage.hf import hub_weights
from wsi.tiling.params import ArtifactModel, TissueModel

SegKind = Literal["tissue", "artifact"]
StateDict = dict[str, torch.Tensor]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: GrandQC's artifact classes (README "Model Output"), as our rejection reasons
GRANDQC_ARTIFACT_CLASSES = {
    1: "tissue",
    2: "fold",
    3: "dark_spot",
    4: "pen",
    5: "edge_bubble",
    6: "out_of_focus",
    7: "background",
}


@dataclass(frozen=True)
class SegmenterSpec:
    """One published network: how to build it, read its checkpoint, feed it and read its output."""

    name: str
    kind: SegKind
    build: Callable[[], nn.Module]
    #: um/px the network was trained at; windows are read at this resolution
    mpp: float
    #: window side in pixels
    window_px: int = 512
    #: JPEG quality of the round trip the network was trained with (None: none)
    jpeg_quality: int | None = None
    #: class index -> name; for a tissue network the names are "tissue" and "background"
    classes: dict[int, str] = field(default_factory=dict)
    #: "argmax": class = argmax of the logits; "softmax1": class 1 where softmax(logits)[1] > 0.5, else 0
    decision: Literal["argmax", "softmax1"] = "argmax"
    #: the network returns {"out": logits} (torchvision) rather than the logits
    dict_output: bool = False
    #: authors' key names -> ours (the identity for smp models)
    key_layout: Callable[[StateDict], StateDict] = lambda s: s
    #: a hint added to a key mismatch: where the state dict of this model comes from
    weights_hint: str = ""
    #: the Hugging Face repository and file of the weights as a state dict (what `hf download` fetches
    #: and the cache lookup finds when no weights are given); "" when none is published there
    hf_repo: str = ""
    hf_file: str = ""

    @property
    def tissue_class(self) -> int:
        return next(k for k, v in self.classes.items() if v == "tissue")

    @property
    def artifact_classes(self) -> dict[int, str]:
        """The classes that reject a tile (not tissue, not background)."""
        return {k: v for k, v in self.classes.items() if v not in ("tissue", "background")}


SEGMENTERS: Registry[SegmenterSpec] = Registry("segmentation model")


def _smp() -> object:
    try:
        import segmentation_models_pytorch as smp
    except ImportError:
        raise ConfigError(
            "GrandQC models need segmentation_models_pytorch: pip install 'wsi[seg]' "
            "(or pip install segmentation-models-pytorch)"
        ) from None
    return smp


def _smp_net(arch: str, classes: int) -> nn.Module:
    """smp's `arch` on its "timm-efficientnet-b0" encoder: the key layout GrandQC's weights have. smp
    calls that encoder deprecated (in favour of "tu-" names, whose keys differ); it is still the one."""
    smp = _smp()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*timm-.*deprecated", category=DeprecationWarning)
        net: nn.Module = getattr(smp, arch)(
            encoder_name="timm-efficientnet-b0", encoder_weights=None, classes=classes, activation=None
        )
    return net


def _grandqc_tissue() -> nn.Module:
    """GrandQC tissue (cpath-ukk/grandqc@045b7a2, 01_WSI_inference_OPENSLIDE_QC/wsi_tis_detect.py):
    `smp.UnetPlusPlus("timm-efficientnet-b0", classes=2)`, 512 px windows at 10 um/px of a thumbnail
    JPEG-compressed at quality 80 (as it was trained), ImageNet normalisation, argmax: 0 tissue."""
    return _smp_net("UnetPlusPlus", 2)


def _grandqc_artifact() -> nn.Module:
    """GrandQC artifacts (same commit, main.py and wsi_process.py; TRIDENT mahmoodlab/TRIDENT@a91fa84
    trident/segmentation_models/load.py GrandQCArtifactSegmenter): `smp.Unet("timm-efficientnet-b0",
    classes=8)` at 1, 1.5 or 2 um/px, 512 px windows, ImageNet normalisation, argmax over
    GRANDQC_ARTIFACT_CLASSES. GrandQC publishes pickled whole models, never unpickled here: the input is
    TRIDENT's GrandQC_MPP1_state_dict.pth or `torch.save(model.state_dict())` of GrandQC's file."""
    return _smp_net("Unet", 8)


def _hest_tissue() -> nn.Module:
    """HEST tissue (mahmoodlab/HEST@afd42c3 src/hest/HESTData.py segment_tissue: 512 um patches at
    1 um/px; TRIDENT's HESTSegmenter): torchvision deeplabv3_resnet50 with `classifier[4]` a 1 x 1 conv
    to 2 classes, ImageNet normalisation, tissue where softmax(class 1) > 0.5."""
    from torchvision.models.segmentation import deeplabv3_resnet50

    net = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=None)
    net.classifier[4] = nn.Conv2d(256, 2, kernel_size=1, stride=1)
    return net


def _hest_layout(state: StateDict) -> StateDict:
    """HEST's Lightning checkpoint: `model.` prefix, auxiliary head dropped (TRIDENT does the same)."""
    return {k.removeprefix("model."): v for k, v in state.items() if "aux" not in k}


_GRANDQC_ART_HINT = (
    "GrandQC's own GrandQC_MPP*.pth are pickled whole models, which are not loaded (unpickling runs code): "
    "use TRIDENT's GrandQC_MPP1_state_dict.pth or save model.state_dict() of GrandQC's file once"
)


def _register(spec: SegmenterSpec) -> None:
    SEGMENTERS.register(spec.name)(spec)


#: where TRIDENT fetches all three state dicts from (mahmoodlab/TRIDENT@bf55f62,
#: trident/segmentation_models/load.py: snapshot_download of *.ckpt, *MPP10.pth, *MPP1_state_dict.pth)
_HEST_SEG = "MahmoodLab/hest-tissue-seg"
_register(
    SegmenterSpec(
        "grandqc-tissue", "tissue", _grandqc_tissue, mpp=10.0, jpeg_quality=80,
        classes={0: "tissue", 1: "background"},
        weights_hint="GrandQC's Tissue_Detection_MPP10.pth is a state dict",
        hf_repo=_HEST_SEG, hf_file="Tissue_Detection_MPP10.pth",
    )
)  # fmt: skip
for _mpp, _suffix in ((1.0, ""), (1.5, "-mpp15"), (2.0, "-mpp2")):
    _register(
        SegmenterSpec(
            f"grandqc-artifact{_suffix}", "artifact", _grandqc_artifact, mpp=_mpp,
            classes=dict(GRANDQC_ARTIFACT_CLASSES), weights_hint=_GRANDQC_ART_HINT,
            hf_repo=_HEST_SEG if not _suffix else "",  # TRIDENT publishes the 1 um/px one only
            hf_file="GrandQC_MPP1_state_dict.pth" if not _suffix else "",
        )
    )  # fmt: skip
_register(
    SegmenterSpec(
        "hest-tissue", "tissue", _hest_tissue, mpp=1.0, classes={0: "background", 1: "tissue"},
        decision="softmax1", dict_output=True, key_layout=_hest_layout,
        weights_hint="HEST's deeplabv3_seg_v4.ckpt (hf MahmoodLab/hest-tissue-seg) is read as tensors",
        hf_repo=_HEST_SEG, hf_file="deeplabv3_seg_v4.ckpt",
    )
)  # fmt: skip


def segmenter_names(kind: SegKind) -> list[str]:
    """The registered networks of one kind."""
    return [n for n in SEGMENTERS.names() if SEGMENTERS.get(n).kind == kind]


def _check_declared(kind: SegKind, declared: object) -> None:
    """The tile stage's options name the networks by type (wsi.tiling.params, so that `wsi tile --help`
    lists them without importing torch): a network registered here and not there could not be asked for."""
    names = sorted(str(n) for n in get_args(declared))
    if segmenter_names(kind) != names:
        raise ImportError(
            f"{kind} networks registered ({segmenter_names(kind)}) differ from wsi.tiling.params's "
            f"({names}): name a new network in both"
        )


_check_declared("tissue", TissueModel)
_check_declared("artifact", ArtifactModel)


def segmenter_weights(name: str, kind: SegKind, weights: str | os.PathLike[str] | None) -> Path:
    """The local weights file of `name`: as given, a URL's local copy, `hf:ORG/REPO[/FILE]`, or, when none
    is given, its published state dict found in the Hugging Face cache (offline; `wsi.storage.hf`)."""
    spec = segmenter_spec(name, kind)
    found = hub_weights(
        weights, repo=spec.hf_repo or None, files=(spec.hf_file,) if spec.hf_file else (),
        what=f"{kind} model {name!r}", page=f"https://huggingface.co/{spec.hf_repo}" if spec.hf_repo else "",
        option=f"--{kind}-weights",
    )  # fmt: skip
    if found is None:
        raise ConfigError(
            f"--{kind}-model {name} needs --{kind}-weights (no published state dict to look up)"
        )
    return found


def segmenter_spec(name: str, kind: SegKind) -> SegmenterSpec:
    """The spec of `name`, which must be a `kind` model (a tissue model is no artifact model)."""
    if name not in SEGMENTERS:
        known = ", ".join(segmenter_names(kind))
        raise ConfigError(f"unknown {kind} model {name!r}; known: {known}")
    spec = SEGMENTERS.get(name)
    if spec.kind != kind:
        raise ConfigError(f"{name!r} is a {spec.kind} model, not a {kind} model")
    return spec


__all__ = [
    "GRANDQC_ARTIFACT_CLASSES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SEGMENTERS",
    "SegKind",
    "SegmenterSpec",
    "segmenter_names",
    "segmenter_spec",
    "segmenter_weights",
]
