"""TransMIL, CLAM-SB/MB, DSMIL and DTFD-MIL (models/baselines) against their authors' code (issue 32).

Per model: random weights in the authors' parameter layout (tests/helpers/mil_baselines_reference.py, written
from their repositories) loaded into ours through `from_authors_state_dict`, the forward compared
(max |difference| <= 1e-5), the parameter count equal to the authors' at their default configuration,
and the authors' training loss on a fixed batch equal to our objective's. Then what every model must do
here: exact chunked and streamed inference, contributions that add up (or a refusal by name), padded
batches equal to each bag alone, bf16 autocast, and categorical-only kinds refused for other tasks.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from mil_baselines_reference import RefCLAM, RefDTFD, RefMILNet, RefTransMIL

from wsi.core.errors import ConfigError
from wsi.models import build_model
from wsi.models.base.objectives import LossInputs, training_step
from wsi.models.baselines import clam, dsmil, dtfd, transmil
from wsi.pipelines.study.tasks import load_task
from wsi.pipelines.train.preflight import refuse_model_for_kind

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ATOL = 1e-5
IN = 12
TINY: dict[str, dict[str, Any]] = {
    "transmil": {"dim": 16, "heads": 2, "landmarks": 8},
    "clam-sb": {"hidden_dim": 16, "attn_dim": 8, "k_sample": 3},
    "clam-mb": {"hidden_dim": 16, "attn_dim": 8, "k_sample": 3},
    "dsmil": {"query_dim": 8},
    "dtfd": {"hidden_dim": 16, "attn_dim": 8},
    "dtfd-maxmin": {"hidden_dim": 16, "attn_dim": 8, "distill": "MaxMinS", "total_instance": 8},
}


def _tiny(name: str, seed: int = 0, num_classes: int = 3, **extra: Any) -> Any:
    torch.manual_seed(seed)
    preset = "dtfd" if name.startswith("dtfd") else name
    return build_model(preset, in_dim=IN, num_classes=num_classes, **{**TINY[name], **extra}).eval()


def _ce(labels: torch.Tensor) -> LossInputs:
    return LossInputs(task_loss=lambda lg: F.cross_entropy(lg.float(), labels), labels=labels)


def _n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# --------------------------------------------------------------------------------- against the authors
def test_transmil_equals_the_authors_forward_parameters_and_loss() -> None:
    torch.manual_seed(0)
    ref = RefTransMIL().eval()
    ours = build_model("transmil").eval()
    ours.load_state_dict(transmil.from_authors_state_dict(ref.state_dict()))  # strict: every key placed
    assert _n_params(ours) == _n_params(ref) == 2_672_146
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n in (1, 7, 300):  # 7: two padding copies; 300: 325 tokens, two rows per landmark
            x = torch.randn(1, n, 1024, generator=g)
            want = ref(x)
            assert (ours(x) - want).abs().max() <= ATOL
            if n == 300:
                assert (ours(x, max_tokens_per_chunk=64) - want).abs().max() <= ATOL  # the lean path
    x, y = torch.randn(1, 40, 1024, generator=g), torch.tensor([1])
    step = training_step(ours, x)
    assert step.objective is None  # the authors train TransMIL on the plain cross-entropy
    with torch.no_grad():
        assert abs(F.cross_entropy(ours(x), y) - F.cross_entropy(ref(x), y)) <= ATOL


def test_transmil_attention_is_the_authors_class_token_row() -> None:
    """`attention_weights` = the last layer's return_attn row of the class token, heads averaged, a
    padding copy's weight added to the tile it copies (7 tiles: 9 - 7 = 2 copies of tiles 0 and 1)."""
    n = 7
    torch.manual_seed(3)
    ref = RefTransMIL().eval()
    ref.layer2.attn.keep_attn = True
    ours = build_model("transmil").eval()
    ours.load_state_dict(transmil.from_authors_state_dict(ref.state_dict()))
    x = torch.randn(1, n, 1024)
    with torch.no_grad():
        ref(x)
        weights = ours.attention_weights(x)[0]
    attn = ref.layer2.attn.last_attn.mean(1)[0]  # (N_padded, N_padded)
    pad = attn.shape[0] - 10  # 1 + 9 tokens, front padding to 256
    row = attn[pad, pad + 1 :]  # the class token's row over the 9 square positions
    want = row[:n].clone()
    want[: 9 - n] += row[n:]
    torch.testing.assert_close(weights, want, atol=ATOL, rtol=0)
    with pytest.raises(ConfigError, match="transmil: per-tile contributions are not defined"):
        ours.tile_contributions(x)


@pytest.mark.parametrize(
    ("n", "landmarks_of_padding"),
    [(8, 0), (15, 0), (7, 1), (20, 1), (3, 5), (9, 3)],  # 8 landmarks; 9 and 15: two rows each, 20: three
)
def test_nystrom_on_the_reduced_landmarks_gives_the_authors_output_and_gradients(
    n: int, landmarks_of_padding: int
) -> None:
    """`NystromAttention` runs the pinv on the landmark matrix with its all-padding landmarks as one index
    and computes no padding row: the authors' full (m, m) computation's output and every gradient."""
    from mil_baselines_reference import RefNystrom

    from wsi.models.baselines.nystrom import NystromAttention

    m, seg = 8, -(-n // 8)
    assert ((-n) % m) // seg == landmarks_of_padding
    torch.manual_seed(n)
    ref = RefNystrom(dim=16, dim_head=8, heads=2, num_landmarks=m).eval()
    ours = NystromAttention(16, heads=2, dim_head=8, landmarks=m).eval()
    ours.load_state_dict({k.replace("to_out.0", "to_out"): v for k, v in ref.state_dict().items()})
    x = torch.randn(1, n, 16, requires_grad=True)  # one bag: the authors scale the pinv over the batch
    y = torch.randn(1, n, 16)
    (ref(x) * y).sum().backward()
    want_x, x.grad = x.grad, None
    out = ours(x)
    (out * y).sum().backward()
    torch.testing.assert_close(out, ref(x), atol=ATOL, rtol=0)
    torch.testing.assert_close(x.grad, want_x, atol=ATOL, rtol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("preset", "n_classes", "subtyping"),
    [("clam-sb", 2, False), ("clam-mb", 2, True), ("clam-sb", 3, True), ("clam-mb", 3, False)],
)
def test_clam_equals_the_authors_forward_parameters_and_loss(
    preset: str, n_classes: int, subtyping: bool
) -> None:
    torch.manual_seed(0)
    mb = preset == "clam-mb"
    ref = RefCLAM(n_classes, multi_branch=mb, subtyping=subtyping).eval()
    ours = build_model(preset, num_classes=n_classes, subtyping=subtyping).eval()
    ours.load_state_dict(clam.from_authors_state_dict(ref.state_dict()))
    assert _n_params(ours) == _n_params(ref)
    if n_classes == 2:
        assert _n_params(ours) == (791_048 if mb else 790_791)
    g = torch.Generator().manual_seed(2)
    for label in range(n_classes):
        x, y = torch.randn(1, 37, 1024, generator=g), torch.tensor([label])
        logits, a_raw, inst = ref(x[0], y)
        with torch.no_grad():
            assert (ours(x) - logits).abs().max() <= ATOL
            branch = int(logits.argmax()) if mb else 0
            want_a = torch.softmax(a_raw[branch], 0)
            assert (ours.attention_weights(x)[0] - want_a).abs().max() <= ATOL
            loss = training_step(ours, x).objective(_ce(y))  # type: ignore[misc]
        want = 0.7 * F.cross_entropy(logits, y) + 0.3 * inst
        assert abs(float(loss) - float(want.detach())) <= ATOL


def test_dsmil_equals_the_authors_forward_parameters_and_loss() -> None:
    torch.manual_seed(0)
    ref = RefMILNet().eval()
    ours = build_model("dsmil").eval()
    ours.load_state_dict(dsmil.from_authors_state_dict(ref.state_dict()))
    assert _n_params(ours) == _n_params(ref) == 85_252
    g = torch.Generator().manual_seed(4)
    for label in (0, 1):
        x = torch.randn(1, 53, 512, generator=g)
        classes, bag, a = ref(x[0])
        with torch.no_grad():
            inst, top, ours_bag, ours_a = ours.streams(x)
            assert (inst[0] - classes).abs().max() <= ATOL
            assert (ours_bag - bag).abs().max() <= ATOL and (
                ours(x) - bag
            ).abs().max() <= ATOL  # readout: bag
            assert (ours_a[0] - a).abs().max() <= ATOL
            assert (top[0] - classes.max(0).values).abs().max() <= ATOL
            y = torch.tensor([label])
            loss = training_step(ours, x).objective(_ce(y))  # type: ignore[misc]
            want = ref.loss(x[0], F.one_hot(y, 2).float())
        assert abs(float(loss) - float(want.detach())) <= ATOL


@pytest.mark.parametrize("distill", ["AFS", "MaxS", "MaxMinS"])
def test_dtfd_equals_the_authors_tiers_parameters_and_losses(
    distill: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ref = RefDTFD().eval()
    ours = build_model("dtfd", distill=distill).eval()
    ours.load_state_dict(dtfd.from_authors_state_dict(ref.state_dict()))
    assert _n_params(ours) == _n_params(ref) == 789_254
    x, y = torch.randn(1, 45, 1024, generator=torch.Generator().manual_seed(5)), torch.tensor([1])
    chunks = ref.split(45, 4, seed=7)  # the authors' np.array_split of a shuffled index list
    split = [torch.tensor(c) for c in chunks]
    monkeypatch.setattr(ours, "eval_splits", lambda n: [split])
    monkeypatch.setattr(ours, "splits", lambda n, generator=None: split)
    loss0, loss1, pred = ref.losses(x[0], y, chunks, distill)
    with torch.no_grad():
        assert (ours(x) - pred).abs().max() <= ATOL
        assert (ours(x, max_tokens_per_chunk=10) - pred).abs().max() <= ATOL
        loss = training_step(ours, x).objective(_ce(y))  # type: ignore[misc]
    assert abs(float(loss) - float(loss0 + loss1)) <= ATOL


def test_dtfd_one_loss_gives_the_gradients_of_the_authors_two_optimizers() -> None:
    """The authors step tier 1 on loss0 and tier 2 on loss1; their order (second backward after the
    first step) fails on current PyTorch, and on 1.x the tier-2 gradients reaching tier 1 were zeroed
    unused. Ours: one loss with the distilled features detached gives each tier exactly its own loss's
    gradients."""
    torch.manual_seed(0)
    ref = RefDTFD()
    x, y = torch.randn(30, 1024), torch.tensor([0])
    chunks = ref.split(30, 4, seed=1)
    opt0 = torch.optim.Adam(
        [*ref.classifier.parameters(), *ref.attention.parameters(), *ref.dim_reduction.parameters()]
    )
    loss0, loss1, _ = ref.losses(x, y, chunks, "AFS")
    opt0.zero_grad()
    loss0.backward(retain_graph=True)
    opt0.step()
    with pytest.raises(RuntimeError, match="inplace operation"):
        loss1.backward()
    torch.manual_seed(0)
    ref = RefDTFD()
    ours = build_model("dtfd")
    ours.load_state_dict(dtfd.from_authors_state_dict(ref.state_dict()))
    ours.splits = lambda n, generator=None: [torch.tensor(c) for c in chunks]  # type: ignore[method-assign]
    training_step(ours, x[None]).objective(_ce(y)).backward()  # type: ignore[misc]
    loss0, loss1, _ = ref.losses(x, y, chunks, "AFS")
    loss0.backward(retain_graph=True)
    tier1 = {"reduce.fc.weight": ref.dim_reduction.fc1.weight, "tier1_head.weight": ref.classifier.fc.weight}
    for name, p in tier1.items():
        torch.testing.assert_close(dict(ours.named_parameters())[name].grad, p.grad, atol=1e-6, rtol=1e-5)
    loss1.backward()  # tier 2's parameters get loss1's gradient only (they had none from loss0)
    want = ref.att_classifier.classifier.fc.weight.grad
    torch.testing.assert_close(ours.tier2_head.weight.grad, want, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------- what every model does
MODELS = list(TINY)


@pytest.mark.parametrize("name", MODELS)
def test_chunked_streamed_and_padded_inference_equal_the_plain_forward(name: str) -> None:
    model = _tiny(name)
    g = torch.Generator().manual_seed(6)
    lengths = [31, 4, 17]
    bags = [torch.randn(n, IN, generator=g) for n in lengths]
    x = torch.full((3, 31, IN), float("nan"))
    mask = torch.zeros(3, 31, dtype=torch.bool)
    for i, b in enumerate(bags):
        x[i, : len(b)], mask[i, : len(b)] = b, True
    with torch.no_grad():
        batch = model(x, mask)
        assert torch.isfinite(batch).all()
        for i, b in enumerate(bags):
            alone = model(b[None])
            assert (batch[i] - alone[0]).abs().max() <= ATOL
            assert (model(b[None], max_tokens_per_chunk=5) - alone).abs().max() <= ATOL
            source = [(b[s : s + 6], None) for s in range(0, len(b), 6)]  # re-iterable: a list
            assert (model.logits_from_chunks(source, n_tiles=len(b)) - alone).abs().max() <= ATOL


@pytest.mark.parametrize("name", [m for m in MODELS if m != "transmil"])
def test_contributions_add_up_to_the_logits_and_attention_is_convex(name: str) -> None:
    model = _tiny(name)
    x = torch.randn(2, 20, IN)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 12:] = False
    with torch.no_grad():
        contrib, base = model.logit_decomposition(x, mask)
        torch.testing.assert_close(base + contrib.sum(1), model(x, mask), atol=ATOL, rtol=0)
        assert torch.all(contrib[1, 12:] == 0)
        a = model.attention_weights(x, mask)
    torch.testing.assert_close(a.sum(1), torch.ones(2), atol=1e-5, rtol=0)
    assert torch.all(a[1, 12:] == 0) and torch.all(a >= 0)


def test_dsmil_mean_readout_contributions_include_the_critical_tiles() -> None:
    model = _tiny("dsmil", readout="mean")
    x = torch.randn(1, 15, IN)
    with torch.no_grad():
        contrib, base = model.logit_decomposition(x)
        _, top, bag, _ = model.streams(x)
        torch.testing.assert_close(model(x), 0.5 * (bag + top))
    torch.testing.assert_close(base + contrib.sum(1), model(x), atol=ATOL, rtol=0)


def test_two_pass_models_refuse_a_one_shot_iterator() -> None:
    for name in ("dsmil", "dtfd"):
        chunks = iter([(torch.randn(5, IN), None)])
        with pytest.raises(ConfigError, match="re-iterable"):
            _tiny(name).logits_from_chunks(chunks, n_tiles=5)


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_forward_and_training_objective(name: str) -> None:
    """The CUDA path trains and predicts under bf16 autocast; here the same on the CPU: finite, close to
    float32, and an objective computed outside autocast (as the loop does) back-propagates."""
    model = _tiny(name, num_classes=2)
    x = torch.randn(1, 40, IN)
    with torch.no_grad():
        full = torch.softmax(model(x), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = torch.softmax(model(x).float(), -1)
    assert torch.isfinite(half).all() and (half - full).abs().max() < 0.05
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        step = training_step(model, x)
    y = torch.tensor([1])
    loss = F.cross_entropy(step.logits.float(), y) if step.objective is None else step.objective(_ce(y))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("n_tiles", [1, 2, 5])
def test_tiny_bags_train_in_every_model(n_tiles: int) -> None:
    """Bags with fewer tiles than CLAM's k, DTFD's pseudo-bags or TransMIL's landmarks."""
    for name in MODELS:
        model = _tiny(name).train()
        x, y = torch.randn(1, n_tiles, IN), torch.tensor([2])
        step = training_step(model, x)
        loss = F.cross_entropy(step.logits, y) if step.objective is None else step.objective(_ce(y))
        loss.backward()
        assert torch.isfinite(loss), name


def test_models_without_a_class_per_bag_are_refused_for_other_task_kinds() -> None:
    task = load_task("nsclc-os")  # survival
    for preset in ("clam-sb", "clam-mb", "dsmil", "dtfd"):
        with pytest.raises(ConfigError, match=rf"model {preset} .* categorical tasks only: .*survival"):
            refuse_model_for_kind(task.replace(**{"model.preset": preset}))
    refuse_model_for_kind(task.replace(**{"model.preset": "transmil"}))  # every kind, as STAMP trains it


def test_authors_state_dicts_of_another_layout_are_refused_by_key() -> None:
    state = dict(RefMILNet().state_dict())
    state["b_classifier.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConfigError, match=r"b_classifier\.extra\.weight"):
        dsmil.from_authors_state_dict(state)


def test_dtfd_clips_each_of_the_authors_modules_before_the_step() -> None:
    model = _tiny("dtfd").train()
    for p in model.parameters():
        p.grad = torch.full_like(p, 100.0)
    model.before_optimizer_step()
    tier2 = (model.tier2_attention, model.tier2_head)
    for modules in [(model.reduce,), (model.tier1_attention,), (model.tier1_head,), tier2]:
        grads = [p.grad for m in modules for p in m.parameters()]
        assert torch.nn.utils.get_total_norm(grads) == pytest.approx(5.0, rel=1e-4)


@pytest.mark.parametrize("name", ["clam-sb", "dsmil", "dtfd"])
def test_long_bags_run_in_chunks_without_gradients(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above CHUNK_ABOVE_TILES (16,384; 10 here) a no-grad forward takes the exact chunked path."""
    from wsi.models.baselines import layers

    monkeypatch.setattr(layers, "CHUNK_ABOVE_TILES", 10)
    monkeypatch.setattr(layers, "AUTO_CHUNK", 3)
    model = _tiny(name)
    seen: list[int] = []
    real = layers.chunks_of

    def spy(x: torch.Tensor, mask: torch.Tensor | None, size: int) -> Any:
        seen.append(size)
        return real(x, mask, size)

    monkeypatch.setattr(sys.modules[type(model).__module__], "chunks_of", spy, raising=False)
    x = torch.randn(1, 25, IN)
    plain = model(x).detach()  # gradients on: one pass
    with torch.no_grad():
        chunked = model(x)
    assert (chunked - plain).abs().max() <= ATOL
    assert name == "dtfd" or set(seen) == {3}  # dsmil reads its chunks twice; dtfd splits the bag itself
