"""ABMIL (models/abmil.py): gated attention pooling as in Ilse et al. 2018, eq. 9.

The reference used below is written from the paper's equations, independently of the model's helpers:
h_k = ReLU(W_1 x_k + b_1), s_k = w^T (tanh(V h_k) * sigmoid(U h_k)), a = softmax(s) over real tiles,
logits = W_cls (sum_k a_k h_k) + b_cls. Checked against the same equations in
AMLab-Amsterdam/AttentionDeepMIL model.py and mahmoodlab/CLAM models/model_clam.py (Attn_Net_Gated).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wsi import configs
from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.models.abmil import ABMIL, ABMILConfig
from wsi.pipelines.train.metrics import auroc


def _model(seed: int = 0, **fields: object) -> ABMIL:
    torch.manual_seed(seed)
    base: dict[str, object] = {"in_dim": 12, "hidden_dim": 16, "attn_dim": 8, "num_classes": 3, **fields}
    return ABMIL(parse_config(ABMILConfig, base, source="test")).eval()


def _bags(
    lengths: list[int], dim: int = 12, seed: int = 1
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Bags of the given lengths, their zero-padded batch (B, N_max, dim) and mask (B, N_max)."""
    g = torch.Generator().manual_seed(seed)
    bags = [torch.randn(n, dim, generator=g) for n in lengths]
    x = torch.zeros(len(bags), max(lengths), dim)
    mask = torch.zeros(len(bags), max(lengths), dtype=torch.bool)
    for i, b in enumerate(bags):
        x[i, : len(b)] = b
        mask[i, : len(b)] = True
    return bags, x, mask


def _reference(model: ABMIL, bag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights (N,), tile class scores W_cls h_k (N, C), logits (C,)) of one bag, from the paper."""
    lin1, v, u, w, head = model.embed[0], model.pool.attn_v, model.pool.attn_u, model.pool.attn_w, model.head
    assert isinstance(lin1, torch.nn.Linear) and u is not None
    h = torch.relu(bag @ lin1.weight.T + lin1.bias)
    s = (torch.tanh(h @ v.weight.T + v.bias) * torch.sigmoid(h @ u.weight.T + u.bias)) @ w.weight[0]
    a = torch.softmax(s, dim=0)
    return a, h @ head.weight.T, head.weight @ (a @ h) + head.bias


def test_attention_weights_sum_to_one_per_bag_and_are_zero_at_padding() -> None:
    model = _model()
    _, x, mask = _bags([5, 1, 9])
    x[~mask] = 1e4  # padding values must not matter
    with torch.no_grad():
        a = model.attention_weights(x, mask)
    assert a.shape == (3, 9)
    torch.testing.assert_close(a.sum(1), torch.ones(3), atol=1e-6, rtol=0)
    assert torch.all(a[~mask] == 0)
    assert torch.all(a[mask] > 0)
    assert a[1, 0].item() == pytest.approx(1.0)  # a one-tile bag puts all its weight on that tile


def test_matches_the_gated_attention_equations() -> None:
    model = _model()
    bags, x, mask = _bags([4, 7])
    with torch.no_grad():
        logits = model(x, mask)
        weights = model.attention_weights(x, mask)
        contrib = model.tile_contributions(x, mask)
    for i, bag in enumerate(bags):
        a_ref, tile_scores, logits_ref = _reference(model, bag)
        n = len(bag)
        torch.testing.assert_close(weights[i, :n], a_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(logits[i], logits_ref, atol=1e-5, rtol=1e-5)
        # contributions are the attention weights times each tile's own class scores
        torch.testing.assert_close(contrib[i, :n], a_ref[:, None] * tile_scores, atol=1e-6, rtol=1e-5)


def test_padded_batch_equals_each_bag_alone() -> None:
    model = _model(dropout=0.5, feature_dropout=0.3, attention_dropout=0.5)  # eval: all off
    bags, x, mask = _bags([3, 11, 1, 6])
    x[~mask] = float("nan")  # NaN padding must not leak into any sum
    with torch.no_grad():
        batch_logits = model(x, mask)
        batch_contrib = model.tile_contributions(x, mask)
        for i, bag in enumerate(bags):
            torch.testing.assert_close(batch_logits[i], model(bag[None])[0], atol=1e-5, rtol=0)
            n = len(bag)
            torch.testing.assert_close(
                batch_contrib[i, :n], model.tile_contributions(bag[None])[0], atol=1e-5, rtol=0
            )
            assert torch.all(batch_contrib[i, n:] == 0)


def test_contributions_plus_base_equal_logits() -> None:
    model = _model()
    _, x, mask = _bags([8, 2, 5])
    with torch.no_grad():
        contrib, base = model.logit_decomposition(x, mask)
        logits = model(x, mask)
    assert contrib.shape == (3, 8, 3) and base.shape == (3, 3)
    torch.testing.assert_close(base + contrib.sum(1), logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(base, model.head.bias.expand(3, -1))


def test_chunked_inference_equals_one_pass() -> None:
    model = _model()
    _, x, mask = _bags([50, 23])
    with torch.no_grad():
        plain = model(x, mask)
        chunked = model(x, mask, max_tokens_per_chunk=7)
    torch.testing.assert_close(chunked, plain, atol=1e-5, rtol=0)


def test_order_of_tiles_does_not_matter() -> None:
    model = _model()
    _, x, _ = _bags([10])
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(x[:, perm]), model(x), atol=1e-6, rtol=0)
        torch.testing.assert_close(model.tile_contributions(x[:, perm]), model.tile_contributions(x)[:, perm])


@pytest.mark.parametrize("attention", ["gated", "plain"])
def test_one_tile_bag_trains_and_predicts_finite_values(attention: str) -> None:
    model = _model(attention=attention, dropout=0.25, feature_dropout=0.2, attention_dropout=0.5).train()
    x = torch.randn(1, 1, 12)
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([2]))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(x)).all() and torch.isfinite(model.tile_contributions(x)).all()


def test_attention_dropout_drops_tiles_in_training_only_and_keeps_weights_convex() -> None:
    model = _model(attention_dropout=0.5).train()
    _, x, mask = _bags([40, 1, 2])
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(20):
            a = model.attention_weights(x, mask)
            torch.testing.assert_close(a.sum(1), torch.ones(3), atol=1e-6, rtol=0)
            dropped = (a == 0) & mask
            assert 5 < dropped[0].sum() < 35  # about half of the 40 real tiles left out
            assert a[1, 0] == 1  # a bag never loses its last tile
            assert torch.all(a[~mask] == 0)  # padding stays out
    model.eval()
    with torch.no_grad():
        first, second = model(x, mask), model(x, mask)
        assert torch.equal(first, second)
        assert torch.all(model.attention_weights(x, mask)[mask] > 0)


def test_empty_bag_gives_the_bias_not_nan() -> None:
    model = _model()
    x = torch.randn(1, 3, 12)
    with torch.no_grad():
        logits = model(x, torch.zeros(1, 3, dtype=torch.bool))
    torch.testing.assert_close(logits[0], model.head.bias)


def test_plain_attention_has_no_gate() -> None:
    gated, plain = _model(attention="gated"), _model(attention="plain")
    assert plain.pool.attn_u is None and gated.pool.attn_u is not None
    assert (
        sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in plain.parameters()) == 16 * 8 + 8
    )


def test_checkpoints_saved_before_the_shared_pooling_module_still_load() -> None:
    """ABMIL's attention MLP moved into models.pooling (keys `attn_v.*` -> `pool.attn_v.*`): weights
    written under the old names load into the same model and give the same outputs."""
    model = _model(seed=3)
    old = {k.replace("pool.", "", 1): v for k, v in model.state_dict().items()}
    assert "attn_v.weight" in old and not any(k.startswith("pool.") for k in old)
    fresh = _model(seed=4)
    fresh.load_state_dict(old)  # strict: every key must find its place
    _, x, mask = _bags([6, 3])
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, mask), model(x, mask), rtol=0, atol=0)


def test_preset_parses_and_config_round_trips() -> None:
    data, source = configs.load_yaml("models", "abmil")
    cfg = parse_config(ABMILConfig, data, source=source)
    assert (cfg.kind, cfg.attention, cfg.in_dim, cfg.hidden_dim, cfg.attn_dim) == (
        "abmil",
        "gated",
        2048,
        512,
        256,
    )
    model = ABMIL(cfg)
    assert model.config_dict() == model.to_dict() == data  # the YAML spells out every field
    assert parse_config(ABMILConfig, model.config_dict(), source="config.json") == cfg
    # the rebuilt model takes the same weights
    ABMIL(parse_config(ABMILConfig, model.config_dict(), source="x")).load_state_dict(model.state_dict())


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"hidden_dim": 0}, ["hidden_dim", "greater than 0"]),
        ({"dropout": 1.0}, ["dropout", "less than 1"]),
        ({"attention": "seqnorm"}, ["attention", "gated", "plain"]),
        ({"depth": 2}, ["unknown field 'depth'"]),
        ({"in_dim": True}, ["in_dim"]),
    ],
)
def test_bad_config_is_refused_naming_the_field(bad: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(ABMILConfig, bad, source="my-preset.yaml")
    assert "my-preset.yaml" in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_wrong_feature_width_or_mask_is_a_config_error() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="in_dim"):
        model(torch.randn(1, 4, 13))
    with pytest.raises(ConfigError, match="mask"):
        model(torch.randn(1, 4, 12), torch.ones(1, 4))


def _key_instance_bags(n_bags: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """Positive iff the bag holds one 'key' instance (feature 0 at +3, the rest noise); 2..40 tiles."""
    bags, labels = [], rng.permutation(np.arange(n_bags) % 2)
    for label in labels:
        x = rng.standard_normal((int(rng.integers(2, 41)), 8)).astype(np.float32)
        x[:, 0] = np.clip(x[:, 0], -3, 1.5)  # ordinary instances never look like the key
        if label:
            x[rng.integers(len(x)), 0] = 3.0
        bags.append(x)
    return bags, labels


def test_learns_a_key_instance_task_quickly_on_cpu() -> None:
    rng = np.random.default_rng(0)
    train_bags, train_labels = _key_instance_bags(160, rng)
    test_bags, test_labels = _key_instance_bags(100, rng)
    model = _model(seed=0, in_dim=8, hidden_dim=32, attn_dim=16, num_classes=2, dropout=0.0).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _epoch in range(15):
        for i in rng.permutation(len(train_bags)):
            logits = model(torch.from_numpy(train_bags[i])[None])
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([int(train_labels[i])]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        probs = np.stack([torch.softmax(model(torch.from_numpy(b)[None])[0], 0).numpy() for b in test_bags])
        key_weight = [
            float(model.attention_weights(torch.from_numpy(b)[None])[0, int(np.argmax(b[:, 0]))])
            for b, y in zip(test_bags, test_labels, strict=True)
            if y
        ]
    assert auroc(test_labels, probs) > 0.95
    assert np.median(key_weight) > 0.5  # attention finds the key instance
