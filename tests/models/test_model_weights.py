"""Model weights across variants and versions: softmax -> seqnorm transfer, weight-decay groups, old
checkpoints that still load (split from test_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_mil import READOUTS, TINY, VARIANTS
from tiny_mil import tiny_mil as _mil

from wsi.core.errors import WeightsError
from wsi.models.base.param_groups import param_groups
from wsi.models.presets import (
    build_model,
    transfer_softmax_to_seqnorm,
)


def test_softmax_weights_transfer_into_seqnorm() -> None:
    src, dst = _mil("softmax"), _mil("seqnorm")
    torch.manual_seed(9)
    for p in src.parameters():
        p.data.normal_()
    new = transfer_softmax_to_seqnorm(src, dst)
    want = {
        f"transformer.blocks.{i}.attn.norm_{w}.{p}"
        for i in range(2)
        for w in "qkv"
        for p in ("gamma", "beta")
    }
    assert set(new) == want
    dropped = {k for k in src.state_dict() if k.endswith("attn.to_qkv.bias")}  # cancel in seqnorm
    assert dropped and not dropped & set(dst.state_dict())
    for k, v in src.state_dict().items():  # every shared weight copied exactly
        if k not in dropped:
            assert torch.equal(dst.state_dict()[k], v), k
    for k in new:
        assert torch.all(dst.state_dict()[k] == (1.0 if k.endswith("gamma") else 0.0))
    with pytest.raises(WeightsError, match="same widths"):
        transfer_softmax_to_seqnorm(src.state_dict(), _mil("seqnorm", mlp_dim=64))
    with pytest.raises(WeightsError, match="lacks"):
        transfer_softmax_to_seqnorm(_mil("gdla"), dst)


def test_transfer_refuses_a_source_that_leaves_shared_weights_random() -> None:
    """A depth-1 softmax checkpoint into a depth-2 seqnorm model would leave a whole block random."""
    src, dst = _mil("softmax", depth=1), _mil("seqnorm", depth=2)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(WeightsError, match=r"lacks \d+ weight.*transformer\.blocks\.1\.attn\.to_qkv\.weight"):
        transfer_softmax_to_seqnorm(src, dst)
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())  # nothing half-loaded
    partial = {k: v for k, v in _mil("softmax").state_dict().items() if not k.startswith("head.")}
    with pytest.raises(WeightsError, match=r"head\.bias, head\.weight"):
        transfer_softmax_to_seqnorm(partial, dst)


@pytest.mark.parametrize("name", VARIANTS)
def test_param_groups_decay_only_weight_matrices(name: str) -> None:
    m = _mil(name, **READOUTS["gated"])
    decay, keep = param_groups(m, 0.05)
    assert (decay["weight_decay"], keep["weight_decay"]) == (0.05, 0.0)
    everything = dict(m.named_parameters())
    assert sorted(decay["names"] + keep["names"]) == sorted(everything)  # each parameter exactly once
    assert [id(p) for p in decay["params"]] == [id(everything[n]) for n in decay["names"]]
    assert all(everything[n].ndim == 2 and n.endswith("weight") and "norm" not in n for n in decay["names"])
    for n in keep["names"]:  # norms, gains, biases, class token, lambdas
        assert n.endswith(
            ("bias", "gamma", "beta", "cls_token", "lam", "lam_local", "rms_weight", "attn_scale")
        ) or ("norm" in n and n.endswith("weight")), n
    assert "cls_token" in keep["names"] and "head.weight" in decay["names"]
    v = build_model("vit-2d", attention=name, **TINY)
    names = param_groups(v, 0.1)[0]["names"]
    assert "patch_embed.weight" in names and "cls_token" not in names


def test_seqnorm_checkpoints_with_the_dead_qkv_bias_still_load(tmp_path: Path) -> None:
    """Runs trained before the bias was dropped: their safetensors load strictly and predict the same."""
    from safetensors.torch import save_file

    from wsi.pipelines.runs.checkpoints import load_into

    m = _mil("seqnorm")
    old = {k: v.clone() for k, v in m.state_dict().items()}
    for i in range(TINY["depth"]):
        old[f"transformer.blocks.{i}.attn.to_qkv.bias"] = torch.randn(3 * TINY["attn_dim"])
    save_file(old, tmp_path / "best.safetensors")
    fresh = _mil("seqnorm")
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_into(fresh, tmp_path / "best.safetensors")
    x = torch.randn(1, 13, 20)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), m(x), rtol=0, atol=0)
