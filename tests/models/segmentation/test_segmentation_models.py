"""Segmentation networks from the user's weights (issue 20, item 2): GrandQC tissue and artifact, HEST tissue.

Random weights in each published key layout; the reference forward is written here the way the authors
(and TRIDENT) run them: smp / torchvision built directly, their preprocessing (JPEG q80 for GrandQC's
tissue model, ImageNet normalisation), their decision rule. Our loader and runner must give the same
classes, pixel for pixel.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.models.segmentation import load_segmenter
from wsi.models.segmentation.run import jpeg_round_trip

smp = pytest.importorskip("segmentation_models_pytorch", reason="the `seg` extra is not installed")

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def _windows(n: int = 1, seed: int = 0, px: int = 128) -> np.ndarray:
    """Smooth random colour windows. 128 px, not the 512 the models run at: the networks are fully
    convolutional, so the comparison holds at any size that is a multiple of 32, at 1/16 of the CPU time."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (n, 16, 16, 3)).astype(np.uint8)
    return np.stack([np.asarray(Image.fromarray(b).resize((px, px), Image.Resampling.BICUBIC)) for b in base])


def _reference_input(windows: np.ndarray, jpeg: bool) -> torch.Tensor:
    """TRIDENT's eval transforms: (JpegCompressionTransform(80) ->) ToTensor -> Normalize(ImageNet)."""
    out = []
    for w in windows:
        if jpeg:  # cv2.imencode of an RGB array treats it as BGR: encode the channel-reversed image
            buf = io.BytesIO()
            Image.fromarray(w[..., ::-1].copy()).save(buf, "JPEG", quality=80)
            w = np.asarray(Image.open(io.BytesIO(buf.getvalue())))[..., ::-1]
        out.append(torch.from_numpy(w.copy()).permute(2, 0, 1).float() / 255.0)
    return (torch.stack(out) - MEAN) / STD


def _randomise(net: nn.Module, seed: int) -> None:
    """Random weights everywhere, batch-norm statistics included (the defaults 0 / 1 would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.dtype.is_floating_point:
                if name.endswith("running_var"):
                    t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
                else:
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.1)


@pytest.fixture(scope="module")
def grandqc_tissue(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    ref = smp.UnetPlusPlus(encoder_name="timm-efficientnet-b0", encoder_weights=None, classes=2)
    _randomise(ref, 1)
    path = tmp_path_factory.mktemp("w") / "Tissue_Detection_MPP10.pth"
    torch.save(ref.state_dict(), path)  # GrandQC's tissue checkpoint is the bare state dict
    return ref.eval(), path


@pytest.fixture(scope="module")
def grandqc_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    ref = smp.Unet(encoder_name="timm-efficientnet-b0", encoder_weights=None, classes=8, activation=None)
    _randomise(ref, 2)
    path = tmp_path_factory.mktemp("w") / "GrandQC_MPP1_state_dict.pth"
    torch.save(ref.state_dict(), path)
    return ref.eval(), path


@pytest.mark.slow
def test_grandqc_tissue_equals_the_authors_forward(grandqc_tissue) -> None:
    ref, path = grandqc_tissue
    seg = load_segmenter("grandqc-tissue", path, kind="tissue")
    windows = _windows(1)
    with torch.no_grad():
        logits = ref.predict(_reference_input(windows, jpeg=True))  # GrandQC: model.predict, then argmax
    ours = seg.logits(seg.preprocess(windows))
    assert torch.allclose(ours, logits, atol=1e-4, rtol=1e-4) and float(logits.std()) > 0
    assert np.array_equal(seg.classify(windows), logits.argmax(dim=1).numpy())
    assert seg.spec.mpp == 10.0 and seg.spec.tissue_class == 0
    assert len(seg.sha256) == 64


@pytest.mark.slow
def test_grandqc_artifact_equals_the_authors_forward_and_names_its_classes(grandqc_artifact) -> None:
    ref, path = grandqc_artifact
    seg = load_segmenter("grandqc-artifact", path, kind="artifact")
    windows = _windows(1, seed=3)
    with torch.no_grad():
        logits = ref.predict(_reference_input(windows, jpeg=False))
    ours = seg.logits(seg.preprocess(windows))
    assert torch.allclose(ours, logits, atol=1e-4, rtol=1e-4) and float(logits.std()) > 0
    assert np.array_equal(seg.classify(windows), logits.argmax(dim=1).numpy())
    assert seg.spec.artifact_classes == {
        2: "fold", 3: "dark_spot", 4: "pen", 5: "edge_bubble", 6: "out_of_focus"
    }  # fmt: skip
    assert load_segmenter("grandqc-artifact-mpp2", path, kind="artifact").spec.mpp == 2.0


@pytest.mark.slow
def test_hest_tissue_equals_the_authors_forward(tmp_path: Path) -> None:
    from torchvision.models.segmentation import deeplabv3_resnet50

    ref = deeplabv3_resnet50(weights=None, weights_backbone=None, aux_loss=True)
    ref.classifier[4] = nn.Conv2d(256, 2, kernel_size=1, stride=1)
    _randomise(ref, 4)
    # HEST's Lightning checkpoint: {"state_dict": {"model.<key>": ...}} with the auxiliary head in it
    ckpt = {"state_dict": {f"model.{k}": v for k, v in ref.state_dict().items()}, "epoch": 7}
    assert any("aux_classifier" in k for k in ckpt["state_dict"])
    path = tmp_path / "deeplabv3_seg_v4.ckpt"
    torch.save(ckpt, path)
    seg = load_segmenter("hest-tissue", path, kind="tissue")
    windows = _windows(1, seed=5)
    ref.eval()
    with torch.no_grad():
        logits = ref(_reference_input(windows, jpeg=False))["out"]
    assert torch.allclose(seg.logits(seg.preprocess(windows)), logits, atol=1e-4, rtol=1e-4)
    expected = (torch.softmax(logits, dim=1)[:, 1] > 0.5).long().numpy()  # TRIDENT's HESTSegmenter.forward
    assert np.array_equal(seg.classify(windows), expected) and float(logits.std()) > 0
    assert seg.spec.mpp == 1.0 and seg.spec.tissue_class == 1


def test_jpeg_round_trip_is_lossy_and_keeps_the_colours() -> None:
    w = _windows(1)[0]
    out = jpeg_round_trip(w, 80)
    assert out.shape == w.shape and out.dtype == np.uint8 and not np.array_equal(out, w)
    assert np.abs(out.astype(int) - w.astype(int)).mean() < 8  # no swapped channels


def test_wrong_weights_are_refused_by_name(grandqc_tissue, grandqc_artifact, tmp_path: Path) -> None:
    _, tissue_path = grandqc_tissue
    _, artifact_path = grandqc_artifact
    with pytest.raises(WeightsError, match=r"does not fit artifact model.*unexpected: decoder\.blocks\.x_0"):
        load_segmenter("grandqc-artifact", tissue_path, kind="artifact")  # UNet++ weights for a UNet
    head = torch.load(artifact_path, weights_only=True)
    head["segmentation_head.0.weight"] = head["segmentation_head.0.weight"][:2]
    torch.save(head, tmp_path / "two.pth")
    with pytest.raises(WeightsError, match=r"wrong shape.*segmentation_head\.0\.weight: file \(2, 16,"):
        load_segmenter("grandqc-artifact", tmp_path / "two.pth", kind="artifact")
    state = torch.load(artifact_path, weights_only=True)
    state.pop("encoder.conv_stem.weight")
    state["extra.weight"] = torch.zeros(1)
    cut = tmp_path / "cut.pth"
    torch.save(state, cut)
    with pytest.raises(WeightsError, match=r"1 missing: encoder\.conv_stem\.weight; 1 unexpected: extra"):
        load_segmenter("grandqc-artifact", cut, kind="artifact")
    pickled = tmp_path / "GrandQC_MPP1.pth"
    torch.save(nn.Linear(2, 2), pickled)  # what GrandQC publishes: a whole pickled model
    with pytest.raises(WeightsError, match=r"not loaded.*TRIDENT's GrandQC_MPP1_state_dict"):
        load_segmenter("grandqc-artifact", pickled, kind="artifact")
    with pytest.raises(ConfigError, match="not a tissue model"):
        load_segmenter("grandqc-artifact", artifact_path, kind="tissue")
    with pytest.raises(ConfigError, match="known: grandqc-tissue, hest-tissue"):
        load_segmenter("nope", artifact_path, kind="tissue")


def _constant_head(net: nn.Module, cls: int) -> None:
    """Make an smp network answer `cls` everywhere: zero head weights, a bias that picks the class."""
    head = net.segmentation_head[0]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-10.0)
        head.bias[cls] = 10.0


@pytest.mark.slow
def test_tile_stage_rejects_artifacts_by_name_and_records_the_models(make_slide, tmp_path: Path) -> None:
    from wsi.formats.tile_file import read_tile_file
    from wsi.pipelines.tile.segment import SegmentationOptions
    from wsi.pipelines.tile.stage import output_paths, tile_slides
    from wsi.slides.sources import SlideSource

    slide = make_slide(name="seg", size_um=1024.0, mpp=0.5, seed=1)  # one window per model
    tissue = smp.UnetPlusPlus(encoder_name="timm-efficientnet-b0", encoder_weights=None, classes=2)
    _constant_head(tissue, 0)  # "tissue" wherever it runs: the mask is every window that is not glass
    artifact = smp.Unet(encoder_name="timm-efficientnet-b0", encoder_weights=None, classes=8)
    _constant_head(artifact, 4)  # "pen marking" everywhere
    torch.save(tissue.state_dict(), tmp_path / "tissue.pth")
    torch.save(artifact.state_dict(), tmp_path / "artifact.pth")
    options = SegmentationOptions(
        tissue_model="grandqc-tissue", tissue_weights=tmp_path / "tissue.pth",
        artifact_model="grandqc-artifact-mpp2", artifact_weights=tmp_path / "artifact.pth",
    )  # fmt: skip
    out = tmp_path / "run"
    [r] = tile_slides([SlideSource("seg", slide.path)], out_dir=out, segmentation=options)
    assert r.status == "empty" and r.n == 0
    tf = read_tile_file(output_paths(out, "seg").h5)
    models = tf.meta.segmentation.models
    assert models["tissue"]["name"] == "grandqc-tissue" and models["artifact"]["mpp"] == 2.0
    assert len(models["artifact"]["sha256"]) == 64
    counts = tf.meta.segmentation.artifact_counts
    assert counts["artifact: pen"] == tf.meta.segmentation.n_artifact == tf.meta.counts.n_tissue > 0
    assert counts["artifact: fold"] == 0
    # a review (qc GeoJSON edited as in QuPath) keeps one tile the network rejected: no model run again
    qc = json.loads(output_paths(out, "seg").geojson.read_text())
    tile = next(f for f in qc["features"] if f["properties"]["objectType"] == "tile")
    assert tile["properties"]["classification"]["name"] == "artifact- pen"  # ":" is QuPath's delimiter
    tile["properties"]["classification"] = {"name": "kept", "color": [0, 170, 0]}
    review = tmp_path / "review.geojson"
    review.write_text(json.dumps({"type": "FeatureCollection", "features": qc["features"]}))
    [kept] = tile_slides([SlideSource("seg", slide.path)], out_dir=out, segmentation=options, review=review)
    assert kept.status == "ok" and kept.n == 1, kept.error
    assert "check filter: artifact: pen removed" in kept.note and "--max-artifact 0.25" in kept.note
    reviewed = read_tile_file(output_paths(out, "seg").h5).meta.segmentation
    assert reviewed.artifact_counts["artifact: pen"] == reviewed.n_artifact == counts["artifact: pen"] - 1
    # the same run again (without the review: back to the filters' verdicts) is done; other weights recompute
    [again] = tile_slides([SlideSource("seg", slide.path)], out_dir=out, segmentation=options)
    assert again.status == "empty"
    _constant_head(artifact, 1)  # "tissue" everywhere: nothing rejected
    torch.save(artifact.state_dict(), tmp_path / "artifact.pth")
    [clean] = tile_slides([SlideSource("seg", slide.path)], out_dir=out, segmentation=options)
    assert clean.status == "ok" and clean.n > 0
    meta = read_tile_file(output_paths(out, "seg").h5).meta
    assert meta.segmentation.artifact_counts["artifact: pen"] == 0
