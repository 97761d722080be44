"""PLIP end to end from slides: `wsi embed --encoder plip` makes bags that `wsi zero-shot --model plip` scores
(random-initialised towers, as the demo runs without weights), and the numbers are the tower's on the bag."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner


@pytest.mark.slow
def test_plip_bags_from_wsi_embed_are_scored_and_searched(tmp_path: Path) -> None:
    from wsi.cli.main import cli
    from wsi.formats.bags import read_bag
    from wsi.models.text_encoders import build_text_encoder
    from wsi.pipelines.zero_shot import load_prompts
    from wsi.pipelines.zero_shot.prompts import class_embeddings
    from wsi.synthetic import write_sample_cohort

    slides = write_sample_cohort(tmp_path / "slides", n=4, size_um=400, mpp=0.5, styles=("a", "b"))
    runner = CliRunner()
    embed = runner.invoke(cli, ["-q", "embed", str(tmp_path / "slides"), "--out", str(tmp_path / "run"),
                                "--encoder", "plip", "--random-init", "--tile-um", "112", "--tile-px", "224",
                                "--readers", "0"])  # fmt: skip
    assert embed.exit_code == 0, embed.output
    bags = tmp_path / "run" / "features" / "plip"
    stems = sorted(s.path.stem for s in slides)
    assert sorted(p.stem for p in bags.glob("*.h5")) == stems
    bag = read_bag(bags / f"{stems[0]}.h5")
    assert bag.feats.shape[1] == 512 and bag.provenance is not None
    assert bag.provenance.encoder == "plip" and (bag.provenance.encoder_recipe or {})["pooling"] == "cls-proj"

    prompts = tmp_path / "p.yaml"
    prompts.write_text("classes:\n  tumour: [tumour, carcinoma]\n  stroma: [stroma]\n")  # PLIP's template
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "slide,label\n" + "".join(f"{s},{('tumour', 'stroma')[i % 2]}\n" for i, s in enumerate(stems))
    )
    zs = runner.invoke(cli, ["zero-shot", str(bags), "--model", "plip", "--random-init", "--prompts",
                             str(prompts), "--labels", str(labels), "--top-k", "5", "--bootstrap", "20",
                             "--out", str(tmp_path / "zs")])  # fmt: skip
    assert zs.exit_code == 0, zs.output
    out = tmp_path / "zs"
    tower = build_text_encoder("plip", random_init=True)  # the CLI's seeded tower
    prompt_set = load_prompts(prompts, tower.SPEC.templates)
    assert prompt_set.prompts()[0][0] == "An H&E image of tumour."
    classes = class_embeddings(tower, prompt_set)
    rows = {r["slide"]: r for r in csv.DictReader((out / "predictions.csv").open())}
    assert sorted(rows) == stems
    joint = {s: F.normalize(torch.from_numpy(np.asarray(read_bag(bags / f"{s}.h5").feats)).float(), dim=-1)
             for s in stems}  # fmt: skip
    for stem in stems:
        sims = joint[stem] @ classes.T
        k = min(5, len(sims))
        want = torch.softmax(tower.logit_scale() * sims.topk(k, dim=0).values.mean(0), dim=-1)
        got = [float(rows[stem]["prob_tumour"]), float(rows[stem]["prob_stroma"])]
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    metrics = json.loads((out / "metrics.json").read_text())
    assert "auroc" in metrics and (out / "report.html").is_file()
    assert (out / "heatmaps" / f"{stems[0]}_tumour.png").is_file()
    assert (out / "geojson" / f"{stems[0]}.geojson").is_file()

    query_text = "tumour-infiltrating lymphocytes"
    found = runner.invoke(cli, ["zero-shot", str(bags), "--model", "plip", "--random-init", "--top", "3",
                                "--query", query_text, "--out", str(tmp_path / "r")])  # fmt: skip
    assert found.exit_code == 0, found.output
    top = list(csv.DictReader((tmp_path / "r" / "top_tiles.csv").open()))
    query = tower.encode_text([query_text])[0]
    every = sorted(((float(joint[s][i] @ query), s, i) for s in stems for i in range(len(joint[s]))),
                   reverse=True)[:3]  # fmt: skip
    assert [(r["slide"], int(r["row"])) for r in top] == [(s, i) for _, s, i in every]
    assert all((tmp_path / "r" / r["picture"]).is_file() for r in top)  # cut from the slides
