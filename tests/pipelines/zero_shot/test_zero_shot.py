"""`wsi zero-shot` / wsi.pipelines.zero_shot: tile embeddings planted so that one class's prompts align with
one tile texture; the slides rich in it are found, with the authors' pooling, similarity and temperature
(CONCH zeroshot_path.py run_mizero: top-k mean of cosines, softmax(logit_scale.exp() * pooled))."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from wsi.formats.bags import BagProvenance, write_bag
from wsi.models.text_encoders import build_text_encoder
from wsi.models.text_encoders.coca import CocaTextConfig
from wsi.pipelines.zero_shot import InputRefused, PromptSet, retrieve, zero_shot
from wsi.pipelines.zero_shot.prompts import class_embeddings

PROMPTS = PromptSet.from_classes(
    {"tumour": ["tumour"], "stroma": ["stroma"]}, ["CLASSNAME.", "an image of CLASSNAME."]
)


@pytest.fixture(scope="module")
def tower():
    cfg = CocaTextConfig(vocab_size=400, width=32, heads=4, layers=2, output_dim=16)
    return build_text_encoder("conch-v1", random_init=True, config=cfg)


def _bag(
    path: Path,
    joint: np.ndarray,
    proj: torch.Tensor,
    *,
    slide_path: str | None = None,
    encoder: str = "conch-v1",
    sha: str = "random",
    tile_um: float = 96.0,
) -> None:
    """A conch-v1 bag whose features land on `joint` (N, 16) directions after proj_contrast."""
    feats = torch.from_numpy(joint).float() @ torch.linalg.inv(proj.float())  # f @ P = joint
    n = len(joint)
    side = int(np.ceil(np.sqrt(n)))
    coords_um = np.stack([np.arange(n) % side, np.arange(n) // side], 1).astype(np.float32) * tile_um
    prov = BagProvenance(
        slide_id=path.stem,
        encoder=encoder,
        weights_sha256=sha,
        tile_um=tile_um,
        tile_px=96,
        mpp=1.0,
        level0_width=side * 96,
        level0_height=side * 96,
        tile_params={"tile_um": tile_um},
        target_mpp=1.0,
        slide_path=slide_path,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bag(
        path,
        feats=feats.numpy(),
        coords_um=coords_um,
        coords_px=coords_um.astype(np.int64),
        provenance=prov,
        dtype="float32",
    )


def _planted(
    classes: torch.Tensor, n_tumour: int, n: int, rng: np.random.Generator, strong: float
) -> np.ndarray:
    """`n_tumour` tiles of the tumour texture (close to the tumour class embedding), the others stroma tiles,
    `strong`-ly aligned with the stroma embedding."""
    e_t, e_s = classes[0].numpy(), classes[1].numpy()
    noise = rng.normal(size=(n, 16)) * 0.15
    rows = [e_t + noise[i] if i < n_tumour else strong * e_s + noise[i] for i in range(n)]
    return np.stack(rows).astype(np.float32)


def _expected(tower, joint: np.ndarray, classes: torch.Tensor, k: int) -> np.ndarray:
    sims = F.normalize(torch.from_numpy(joint), dim=-1) @ classes.T  # cosine to each class
    pooled = sims.topk(min(k, len(joint)), dim=0).values.mean(0)
    return torch.softmax(tower.logit_scale() * pooled, dim=-1).numpy()


def test_planted_texture_finds_the_slides_rich_in_it(tower, tmp_path: Path) -> None:
    classes = class_embeddings(tower, PROMPTS)
    rng = np.random.default_rng(0)
    proj = tower.proj_contrast.detach()
    joints = {}
    for i in range(3):  # rich: 15 of 100 tiles tumour; the stroma tiles only weakly stroma
        joints[f"rich-{i}"] = _planted(classes, 15, 100, rng, strong=0.3)
        joints[f"poor-{i}"] = _planted(classes, 0, 100, rng, strong=1.0)
    for sid, joint in joints.items():
        _bag(tmp_path / "bags" / f"{sid}.h5", joint, proj)
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "slide,label\n" + "".join(f"{s},{'tumour' if s.startswith('rich') else 'stroma'}\n" for s in joints)
    )
    result = zero_shot(
        tmp_path / "bags",
        out_dir=tmp_path / "out",
        prompts=PROMPTS,
        tower=tower,
        top_k=10,
        labels_csv=labels,
        bootstrap=50,
    )
    assert result.predicted() == {s: "tumour" if s.startswith("rich") else "stroma" for s in joints}
    rows = {r["slide"]: r for r in csv.DictReader((tmp_path / "out" / "predictions.csv").open())}
    for sid, joint in joints.items():
        want = _expected(tower, joint, classes, 10)
        got = np.array([float(rows[sid]["prob_tumour"]), float(rows[sid]["prob_stroma"])])
        np.testing.assert_allclose(got, want, atol=2e-5)
    # the mean of all tiles (no top-k) would call the rich slides stroma: the pooling matters here
    rich = F.normalize(torch.from_numpy(joints["rich-0"]), dim=-1) @ classes.T
    assert rich.mean(0).argmax() == 1 and rich.topk(10, dim=0).values.mean(0).argmax() == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (
        metrics["auroc"] == 1.0 and "auroc_ci95" in metrics and (tmp_path / "out" / "report.html").is_file()
    )
    tv = json.loads((tmp_path / "out" / "heatmaps" / "rich-0.json").read_text())
    assert set(tv["outputs"]) == {"tumour", "stroma"} and tv["predicted"] == "tumour"
    np.testing.assert_allclose(tv["outputs"]["tumour"][:15], rich[:15, 0].numpy(), atol=1e-4)
    assert (tmp_path / "out" / "heatmaps" / "rich-0_tumour.png").is_file()
    gj = json.loads((tmp_path / "out" / "geojson" / "rich-0.geojson").read_text())
    tops = [f for f in gj["features"] if f["properties"].get("name", "").startswith("top tumour")]
    assert len(tops) == 10 and gj["properties"]["prediction"]["predicted"] == "tumour"
    assert list((tmp_path / "out" / "text_embeddings").glob("*.safetensors")) == []  # random towers: no cache


def test_plip_bags_are_scored_with_plips_scale(tmp_path: Path) -> None:
    """PLIP: a plip bag holds visual_projection outputs (the joint space itself), cosine to the class
    embeddings, top-k mean, softmax(logit_scale.exp() x pooled) as CLIPModel's logits_per_image."""
    from wsi.models.text_encoders.clip import ClipTextConfig

    cfg = ClipTextConfig(width=32, heads=4, layers=2, intermediate=64, output_dim=16)
    plip = build_text_encoder("plip", random_init=True, config=cfg)
    classes = class_embeddings(plip, PROMPTS)
    rng = np.random.default_rng(5)
    joints = {"rich": _planted(classes, 15, 60, rng, strong=0.3), "poor": _planted(classes, 0, 60, rng, 1.0)}
    for sid, joint in joints.items():
        _bag(tmp_path / "bags" / f"{sid}.h5", joint * 3.0, torch.eye(16), encoder="plip")  # unnormalised
    _bag(tmp_path / "bags" / "nan.h5", joints["poor"], torch.eye(16), encoder="plip")
    with h5py.File(tmp_path / "bags" / "nan.h5", "r+") as h5:  # damaged after writing: fails alone
        h5["feats"][3, 0] = np.nan
    result = zero_shot(tmp_path / "bags", out_dir=tmp_path / "out", prompts=PROMPTS, tower=plip, top_k=10)
    assert result.predicted() == {"rich": "tumour", "poor": "stroma"}
    # the stage result: one row per slide in input order, the failure among them
    assert result.stage == "zero-shot" and [(r.slide_id, r.status, r.n) for r in result] == [
        ("nan", "failed", 0), ("poor", "ok", 60), ("rich", "ok", 60)
    ]  # fmt: skip
    assert [r.slide_id for r in result.problems] == ["nan"] and "non-finite" in result[0].error
    assert result.probabilities().shape == (2, 2) and result.classes == ("tumour", "stroma")
    assert plip.logit_scale() == pytest.approx(np.exp(2.6592600), rel=1e-6)  # CLIP's initial 1 / 0.07
    for score in result.scored:
        np.testing.assert_allclose(
            score.probs, _expected(plip, joints[score.slide_id], classes, 10), atol=2e-5
        )
    # a conch-v1 bag, and a "plip" bag of another width (the 768-d class token before the projection)
    _bag(tmp_path / "conch" / "c.h5", joints["rich"], torch.eye(16))
    with pytest.raises(
        InputRefused, match=r"c\.h5 holds conch-v1 features, but plip's text tower scores plip"
    ):
        zero_shot(tmp_path / "conch", out_dir=tmp_path / "o", prompts=PROMPTS, tower=plip)
    wide = np.concatenate([joints["rich"], joints["rich"]], axis=1)
    _bag(tmp_path / "wide" / "w.h5", wide, torch.eye(32), encoder="plip")
    with pytest.raises(
        InputRefused, match=r"w\.h5 holds 32-d plip features, but plip's text tower maps 16-d"
    ):
        zero_shot(tmp_path / "wide", out_dir=tmp_path / "o", prompts=PROMPTS, tower=plip)


def test_retrieval_finds_the_planted_tiles(tower, tmp_path: Path) -> None:
    classes = class_embeddings(
        tower, PromptSet.from_classes({"t": ["tumour"], "s": ["stroma"]}, ["CLASSNAME."])
    )
    rng = np.random.default_rng(1)
    proj = tower.proj_contrast.detach()
    for name, n_t in (("a", 3), ("b", 2)):  # n_t tiles on the text's direction, the rest anywhere
        joint = rng.normal(size=(40, 16)).astype(np.float32)
        joint[:n_t] = classes[0].numpy() + rng.normal(size=(n_t, 16)) * 0.01
        _bag(tmp_path / "bags" / f"{name}.h5", joint, proj)
    found = retrieve(tmp_path / "bags", out_dir=tmp_path / "r", query="tumour.", top=5, tower=tower)
    top = {(r["slide"], r["row"]) for r in found.rows}
    assert {("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)} == top  # the five tumour tiles of the cohort
    assert [r["rank"] for r in found.rows] == [1, 2, 3, 4, 5] and found.csv.is_file()
    by_tile = retrieve(
        tmp_path / "bags", out_dir=tmp_path / "r2", query_tile=("b", 0.0, 0.0), top=5, tower=tower
    )
    assert {(r["slide"], r["row"]) for r in by_tile.rows} == top
    with h5py.File(tmp_path / "bags" / "a.h5", "r+") as h5:  # a damaged tile is left out, not ranked
        h5["feats"][0, 0] = np.nan
    damaged = retrieve(tmp_path / "bags", out_dir=tmp_path / "r3", query="tumour.", top=100, tower=tower)
    ranked = [(r["slide"], r["row"]) for r in damaged.rows]
    assert len(ranked) == 79 and ("a", 0) not in ranked and set(ranked[:4]) == top - {("a", 0)}


def test_bags_the_tower_cannot_score_are_refused(tower, tmp_path: Path) -> None:
    proj = tower.proj_contrast.detach()
    joint = np.random.default_rng(2).normal(size=(5, 16)).astype(np.float32)
    _bag(tmp_path / "v15" / "x.h5", joint, proj, encoder="conch-v1.5")
    with pytest.raises(
        InputRefused, match=r"x\.h5 holds conch-v1\.5 features.*CONCH v1\.5's text tower is not released"
    ):
        zero_shot(tmp_path / "v15", out_dir=tmp_path / "o", prompts=PROMPTS, tower=tower)
    _bag(tmp_path / "real" / "y.h5", joint, proj, sha="a" * 64)
    with pytest.raises(
        InputRefused, match=r"y\.h5 was made with conch-v1 weights aaaaaaaaaaaa.*not in this tower's"
    ):
        zero_shot(tmp_path / "real", out_dir=tmp_path / "o", prompts=PROMPTS, tower=tower)
    runner = CliRunner()
    from wsi.cli.main import cli

    res = runner.invoke(
        cli,
        [
            "zero-shot",
            str(tmp_path / "v15"),
            "--prompts",
            "nsclc",
            "--random-init",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 2 and "x.h5 holds conch-v1.5 features" in res.output


@pytest.mark.slow
def test_cli_end_to_end_on_generated_slides(tmp_path: Path) -> None:
    """wsi zero-shot with a random full-size CONCH v1 text tower on the demo's generated slides: predictions,
    heatmaps over the slides, QuPath objects, report; `wsi view`'s catalog shows the heatmaps."""
    from wsi.cli.main import cli
    from wsi.synthetic import write_sample_cohort
    from wsi.view.catalog import Catalog

    slides = write_sample_cohort(tmp_path / "slides", n=4, size_um=800, mpp=1.0, styles=("a", "b"))
    tower = build_text_encoder("conch-v1", random_init=True)  # the CLI builds the same seeded tower
    prompts = tmp_path / "p.yaml"
    prompts.write_text(
        "classes:\n  LUAD: [adenocarcinoma]\n  LUSC: [squamous cell carcinoma]\ntemplates: ['CLASSNAME.']\n"
    )
    from wsi.pipelines.zero_shot import load_prompts

    classes = class_embeddings(tower, load_prompts(prompts, ()))
    rng = np.random.default_rng(3)
    proj = tower.proj_contrast.detach()
    rows = []
    for i, s in enumerate(slides):
        label = ("LUAD", "LUSC")[i % 2]
        e = classes[i % 2].numpy()
        joint = (e + rng.normal(size=(64, 512)) * 0.02).astype(np.float32)
        _bag(tmp_path / "bags" / f"{s.path.stem}.h5", joint, proj, slide_path=str(s.path), tile_um=96.0)
        rows.append(f"{s.path.stem},{label}\n")
    (tmp_path / "labels.csv").write_text("slide,label\n" + "".join(rows))
    res = CliRunner().invoke(
        cli,
        [
            "zero-shot",
            str(tmp_path / "bags"),
            "--prompts",
            str(prompts),
            "--random-init",
            "--labels",
            str(tmp_path / "labels.csv"),
            "--top-k",
            "5",
            "--bootstrap",
            "50",
            "--out",
            str(tmp_path / "zs"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = tmp_path / "zs"
    preds = list(csv.DictReader((out / "predictions.csv").open()))
    assert [p["predicted"] for p in preds] == ["LUAD", "LUSC", "LUAD", "LUSC"]
    assert json.loads((out / "metrics.json").read_text())["auroc"] == 1.0 and (out / "report.html").is_file()
    stem = slides[0].path.stem
    assert (out / "heatmaps" / f"{stem}_LUAD.png").is_file() and (
        out / "geojson" / f"{stem}.geojson"
    ).is_file()
    entry = Catalog(out).get(stem)
    assert entry is not None and entry.path == slides[0].path and entry.heatmap_json is not None
    assert "geojson" in entry.geojson and entry.prediction["predicted"] == "LUAD"
