"""The MIL baselines in TRAINING mode against their authors' modules (tests/helpers/
mil_baselines_reference.py, mil_training_reference.py), and the choices their authors made that
eval-mode forwards cannot see.

- Dropout: the authors' module and ours, on shared weights, in train mode under one seed, give the same
  logits (and losses): every dropout at the authors' place, rate and draw. Each test also sets our
  dropout rates to 0 and checks the result moves off the authors', so a dropout taken out is seen (one
  moved changes which tensor its mask multiplies, and so the logits, the same way).
- DSMIL with 1, 2 and 3 outputs: the authors' losses (one output = their binary convention) and their
  sigmoid scoring, through our task kind.
- CLAM's smooth top-1 SVM instance loss (Berrada et al. 2018) against the topk package's code.
- TransMIL's Nystrom attention as nystrom-attention 0.0.9 (the authors' pin) and 0.0.14 compute it; with
  WSI_NYSTROM_PACKAGES naming folders that hold the real packages (`pip install --no-deps --target DIR
  nystrom-attention==0.0.9`, and 0.0.14), against those files too.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mil_baselines_reference import (
    RefCLAM,
    RefDTFD,
    RefMILNet,
    RefNystrom,
    RefTransMIL,
)
from mil_training_reference import ref_smooth_top1_svm

from wsi.models import build_model
from wsi.models.base.objectives import LossInputs, training_step
from wsi.models.baselines import clam, dsmil, dtfd, transmil
from wsi.models.baselines.smooth_svm import smooth_top1_svm
from wsi.pipelines.study.kinds import build_kind
from wsi.pipelines.study.tasks import TaskConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ATOL = 1e-5
IN = 32


def _ce(labels: torch.Tensor) -> LossInputs:
    return LossInputs(task_loss=lambda lg: F.cross_entropy(lg.float(), labels), labels=labels)


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _seeded(fn: Any, seed: int = 5) -> Any:
    torch.manual_seed(seed)
    return fn()


# ------------------------------------------------------------------------------------ dropout, trained
@pytest.mark.parametrize("version", ["0.0.14", "0.0.9"])
@pytest.mark.parametrize("n", [7, 40])
def test_transmil_dropout_in_training_matches_the_authors(version: str, n: int) -> None:
    """Dropout 0.1 after each Nystrom attention's output projection, its mask drawn over the padded
    sequence as the authors' to_out (Linear, Dropout) draws it before the rows are selected."""
    torch.manual_seed(0)
    ref = RefTransMIL(in_dim=IN, version=version).train()
    ours = build_model("transmil", in_dim=IN, nystrom_version=version).train()
    ours.load_state_dict(transmil.from_authors_state_dict(ref.state_dict()))
    x = torch.randn(1, n, IN)
    want = _seeded(lambda: ref(x))
    torch.testing.assert_close(_seeded(lambda: ours(x)), want, atol=ATOL, rtol=0)
    assert (_seeded(lambda: _without_dropout(ours)(x)) - want).abs().max() > 1e-3


@pytest.mark.parametrize("preset", ["clam-sb", "clam-mb"])
@pytest.mark.parametrize("inst_loss", ["ce", "svm"])
def test_clam_dropout_and_loss_in_training_match_the_authors(preset: str, inst_loss: str) -> None:
    """Dropout 0.25 after the embedding ReLU and after each gated-attention branch (Attn_Net_Gated),
    and the total loss (bag + instance, with either instance loss) in train mode."""
    torch.manual_seed(0)
    fn = ref_smooth_top1_svm if inst_loss == "svm" else F.cross_entropy
    ref = RefCLAM(3, IN, multi_branch=preset == "clam-mb", subtyping=True, instance_loss_fn=fn).train()
    ours = build_model(preset, in_dim=IN, num_classes=3, subtyping=True, inst_loss=inst_loss).train()
    ours.load_state_dict(clam.from_authors_state_dict(ref.state_dict()))
    x, y = torch.randn(1, 30, IN), torch.tensor([2])
    logits, _, inst = _seeded(lambda: ref(x[0], y))
    step = _seeded(lambda: training_step(ours, x))
    torch.testing.assert_close(step.logits, logits, atol=ATOL, rtol=0)
    want = 0.7 * F.cross_entropy(logits, y) + 0.3 * inst
    assert abs(float(step.objective(_ce(y))) - float(want)) <= ATOL  # type: ignore[misc]
    assert (_seeded(lambda: _without_dropout(ours)(x)) - logits).abs().max() > 1e-3


def test_dsmil_value_dropout_in_training_matches_the_authors() -> None:
    """DSMIL's only dropout, before the value projection when passing_v (BClassifier.v)."""
    torch.manual_seed(0)
    ref = RefMILNet(IN, 2, dropout_v=0.3, passing_v=True).train()
    ours = build_model("dsmil", in_dim=IN, num_classes=2, passing_v=True, dropout_v=0.3).train()
    ours.load_state_dict(dsmil.from_authors_state_dict(ref.state_dict()))
    x = torch.randn(1, 25, IN)
    _, bag, _ = _seeded(lambda: ref(x[0]))
    torch.testing.assert_close(_seeded(lambda: ours(x)), bag, atol=ATOL, rtol=0)
    assert (_seeded(lambda: _without_dropout(ours)(x)) - bag).abs().max() > 1e-4


def test_dtfd_dropouts_in_training_match_the_authors() -> None:
    """droprate before the tier-1 classifier (drawn once per pseudo-bag, as the authors call it) and
    droprate_2 before the tier-2 one; logits and both tiers' losses in train mode."""
    torch.manual_seed(0)
    ref = RefDTFD(in_chn=IN, droprate=0.3, droprate_2=0.2).train()
    ours = build_model("dtfd", in_dim=IN, dropout=0.3, tier2_dropout=0.2).train()
    ours.load_state_dict(dtfd.from_authors_state_dict(ref.state_dict()))
    x, y = torch.randn(1, 45, IN), torch.tensor([1])
    chunks = ref.split(45, 4, seed=7)
    split = [torch.tensor(c) for c in chunks]
    ours.splits = lambda n, generator=None: split  # type: ignore[method-assign]
    loss0, loss1, pred = _seeded(lambda: ref.losses(x[0], y, chunks, "AFS"))
    step = _seeded(lambda: training_step(ours, x))
    torch.testing.assert_close(step.logits, pred, atol=ATOL, rtol=0)
    assert abs(float(step.objective(_ce(y))) - float(loss0 + loss1)) <= ATOL  # type: ignore[misc]
    assert (_seeded(lambda: training_step(_without_dropout(ours), x).logits) - pred).abs().max() > 1e-4


# ------------------------------------------------------------------------------ DSMIL, 1/2/3 outputs
def _categorical(classes: tuple[str, ...], scoring: str) -> Any:
    task = TaskConfig(name="t", classes=classes).replace(**{"model.scoring": scoring})
    return build_kind(task)


@pytest.mark.parametrize("outputs", [1, 2, 3])
def test_dsmil_outputs_losses_and_scores_are_the_authors(outputs: int) -> None:
    """num_classes 1 (two classes: the authors' binary convention, the first class an all-zero target),
    2 (two positive classes, their TCGA-lung runs) and 3: streams, the 0.5 + 0.5 BCE of train_tcga.train
    on the authors' label vector, and sigmoid(bag) as the probability their test() ranks by."""
    torch.manual_seed(outputs)
    ref = RefMILNet(IN, outputs).eval()
    ours = build_model("dsmil", in_dim=IN, num_classes=outputs).eval()
    ours.load_state_dict(dsmil.from_authors_state_dict(ref.state_dict()))
    n_classes = 2 if outputs == 1 else outputs
    g = torch.Generator().manual_seed(9)
    for label in range(n_classes):
        x = torch.randn(1, 33, IN, generator=g)
        classes, bag, _ = ref(x[0])
        y = torch.tensor([label])
        vector = torch.tensor([[float(label)]]) if outputs == 1 else F.one_hot(y, outputs).float()
        with torch.no_grad():
            inst, _, ours_bag, _ = ours.streams(x)
            torch.testing.assert_close(ours_bag, bag, atol=ATOL, rtol=0)
            torch.testing.assert_close(inst[0], classes, atol=ATOL, rtol=0)
            loss = training_step(ours, x).objective(_ce(y))  # type: ignore[misc]
        assert abs(float(loss) - float(ref.loss(x[0], vector))) <= ATOL
        if outputs == 2:
            continue  # two positive classes: a softmax-free two-output run, not a categorical task's
        kind = _categorical(tuple("abc"[:n_classes]), "sigmoid")
        assert kind.num_outputs == outputs
        probs = kind.outputs(bag)[0]
        want = torch.sigmoid(bag)[0]
        torch.testing.assert_close(probs[1:] if outputs == 1 else probs, want)
        task_bce = F.binary_cross_entropy_with_logits(bag, vector)
        assert abs(float(kind.loss(bag, torch.zeros(1, 1), y)) - float(task_bce)) <= ATOL


def test_sigmoid_and_softmax_scoring_rank_bags_differently() -> None:
    """Three classes: each class's own sigmoid (the authors') is not the softmax across classes; with one
    output for two classes, p(second) = sigmoid(z) and its contributions are the log-odds share."""
    logits = torch.tensor([[2.0, 1.9, -3.0], [0.5, -2.0, -2.5]])
    sig, soft = _categorical(("a", "b", "c"), "sigmoid"), _categorical(("a", "b", "c"), "softmax")
    assert sig.outputs(logits)[:, 0].argmax() == 0 and soft.outputs(logits)[:, 0].argmax() == 1
    binary = _categorical(("neg", "pos"), "sigmoid")
    assert binary.num_outputs == 1 and _categorical(("neg", "pos"), "softmax").num_outputs == 2
    contrib = np.array([[0.5], [-0.2]])
    maps = binary.contribution_maps(contrib)
    np.testing.assert_allclose(maps["pos"], [0.5, -0.2])
    np.testing.assert_allclose(maps["neg"], [-0.5, 0.2])


# ------------------------------------------------------------------------------- CLAM's SVM instances
def test_smooth_top1_svm_equals_the_topk_package() -> None:
    """Value and gradient against smooth-topk's SmoothTop1SVM: smooth samples (tau log-sum-exp) and
    samples whose top score leads by more than log(1000) (the hard top-1 SVM)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 2, generator=g) * 3
    x[:4, 0] += 12.0  # far ahead: the hard branch
    y = torch.randint(0, 2, (16,), generator=g)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, want = smooth_top1_svm(a, y), ref_smooth_top1_svm(b, y)
    ours.backward()
    want.backward()
    assert abs(float(ours) - float(want)) <= 1e-6
    torch.testing.assert_close(a.grad, b.grad)
    assert abs(float(ours) - float(F.cross_entropy(x, y))) > 1e-3  # not the cross-entropy


# ------------------------------------------------------------------------- TransMIL's Nystrom versions
@pytest.mark.parametrize("n", [1, 7, 60, 300])
def test_transmil_nystrom_0_0_9_equals_the_authors_pinned_attention(n: int) -> None:
    """nystrom_version 0.0.9: every token gets padded row i's output (`out[:, :n]`), in the one-pass
    forward, the lean inference path and the class-token attention; it differs from 0.0.14."""
    torch.manual_seed(0)
    ref = RefTransMIL(in_dim=IN, version="0.0.9").eval()
    ref.layer2.attn.keep_attn = True
    ours = build_model("transmil", in_dim=IN, nystrom_version="0.0.9").eval()
    state = transmil.from_authors_state_dict(ref.state_dict())
    ours.load_state_dict(state)
    new = build_model("transmil", in_dim=IN).eval()
    new.load_state_dict(state)
    x = torch.randn(1, n, IN, generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        want = ref(x)
        torch.testing.assert_close(ours(x), want, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x, max_tokens_per_chunk=16), want, atol=ATOL, rtol=0)
        assert (new(x) - want).abs().max() > 1e-3
        weights = ours.attention_weights(x)[0]
    side = int(np.ceil(np.sqrt(n)))
    attn = ref.layer2.attn.last_attn.mean(1)[0]
    tokens = 1 + side * side
    pad = attn.shape[0] - tokens
    row = attn[0, pad + 1 :]  # 0.0.9: the class token reads padded row 0's output
    expected = row[:n].clone()
    expected[: side * side - n] += row[n:]
    torch.testing.assert_close(weights, expected, atol=ATOL, rtol=0)


def _packages() -> list[Path]:
    found = [Path(p) for p in os.environ.get("WSI_NYSTROM_PACKAGES", "").split(os.pathsep) if p]
    return [p for p in found if (p / "nystrom_attention" / "nystrom_attention.py").is_file()]


@pytest.mark.skipif(not _packages(), reason="WSI_NYSTROM_PACKAGES names no folder with nystrom-attention")
def test_nystrom_rows_equal_the_installed_library_versions() -> None:
    """Each folder's nystrom_attention.py (0.0.9 or 0.0.14, by its dist-info) against ours and the
    tests' reference: the same weights, the same output rows."""
    from wsi.models.baselines.nystrom import NystromAttention

    for folder in _packages():
        version = next(folder.glob("nystrom_attention-*.dist-info")).name.split("-")[1].removesuffix(".dist")
        spec = importlib.util.spec_from_file_location(
            f"nystrom_{version.replace('.', '_')}", folder / "nystrom_attention" / "nystrom_attention.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        torch.manual_seed(1)
        lib = module.NystromAttention(dim=16, dim_head=8, heads=2, num_landmarks=8, pinv_iterations=6,
                                      residual=True, dropout=0.1).eval()  # fmt: skip
        ours = NystromAttention(16, heads=2, dim_head=8, landmarks=8, dropout=0.1,
                                rows="first" if version == "0.0.9" else "last").eval()  # fmt: skip
        ours.load_state_dict({k.replace("to_out.0", "to_out"): v for k, v in lib.state_dict().items()})
        ref = RefNystrom(16, 8, 2, 8, version=version).eval()
        ref.load_state_dict(lib.state_dict())
        for n in (5, 8, 13):
            x = torch.randn(1, n, 16)
            with torch.no_grad():
                want = lib(x)
                torch.testing.assert_close(ours(x), want, atol=ATOL, rtol=0, msg=f"{version} n={n}")
                torch.testing.assert_close(ref(x), want, atol=ATOL, rtol=0, msg=f"{version} n={n}")
