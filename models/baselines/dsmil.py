"""DSMIL (preset `dsmil`): Li, Li & Eliceiri, "Dual-stream Multiple Instance Learning Network for Whole
Slide Image Classification with Self-supervised Contrastive Learning", CVPR 2021. Our own code, read
from the authors' binli123/dsmil-wsi dsmil.py @ 80465ed534ac (FCLayer, BClassifier, MILNet) and
train_tcga.py (defaults: nonlinear q, passing_v off, orthogonal initialisation with zero biases, the
loss 0.5 * BCE(bag) + 0.5 * BCE(max instance) on one-hot labels, prediction = sigmoid of the bag stream
unless --average). mahmoodlab/MIL-Lab src/models/dsmil.py @ dfc3c17ca687 re-uses it with a patch
embedding, a LayerNorm on B and logits averaged over the two streams under cross-entropy.

Per bag of n tiles x (no embedding: the instance classifier reads the features):
  instance stream  c = W_i x + b_i (n, C); the critical tile of class j is argmax_k c_kj
  bag stream       Q = tanh(W2 ReLU(W1 x)) (n, 128), q_j = Q of class j's critical tile,
                   A_kj = softmax_k(Q_k . q_j / sqrt(128)), B_j = sum_k A_kj v_k (v = x, or
                   ReLU(W_v x) with `passing_v`), bag logit_i = sum_{j,d} W_b[i, j, d] B_jd + b_i
(the authors' fcc is Conv1d(C, C, kernel = feature width), held here as a Linear on the flattened B).
85,252 parameters at the authors' configuration (512-d input, two outputs; 83,202 with the one output
of their binary convention).

Outputs and scoring. `scoring: sigmoid` is the authors' convention (train_tcga.py get_bag_feats and
test; README "Labels"): each output is its own class's sigmoid, trained by BCE, and a two-class task
has ONE output (`--num_classes=1`): the task's first class is the negative one, whose bags have no
critical instance and an all-zero target, and p(second class) = sigmoid(z). More classes have one
output each (one-hot targets) and p_c = sigmoid(z_c), not normalised across classes. The task kind
scores the outputs so (pipelines.study.kinds.categorical, from the task's resolved `model.scoring`)
and the training loop builds the model with `num_classes` = its outputs (1 for two classes).
`scoring: softmax` is one output per class scored by a softmax across them (what wsi did before).

`readout` picks the logits the task scores: `bag` (the authors' default prediction) or `mean`
(0.5 (bag + max-instance), MIL-Lab's). `stream_loss`: `bce` (the authors': BCE with logits of each
stream against the bag's target, 0.5 each; the task's class weights weigh the bags) or `task` (the
task's loss on each stream, 0.5 each). Categorical tasks only: both need each bag's class.

Explanations are exact: the bag stream is linear in B, so tile k's contribution to class i is
sum_j A_kj (W_b[i, j] . v_k), and with `readout: mean` half of it plus half of class i's instance logit
at its critical tile. Long bags: without gradients, a bag above 16,384 tiles (or any with
`max_tokens_per_chunk`) runs two passes over chunks (the critical tiles, then an online softmax
accumulating B), keeping only (C, D) sums; `logits_from_chunks` reads a streamed bag twice the same way
(it needs a re-iterable source).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsi.core.config import config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.base.objectives import LossInputs, TrainingStep, sigmoid_targets, weighted_mean
from wsi.models.baselines.layers import Rate, Width, check_bags, chunk_for, chunks_of, masked_softmax
from wsi.models.layers.standardize import standardize_input

_Width = Width
_Rate = Rate


@config_model
@dataclass(frozen=True)
class DSMILConfig:
    """Architecture, readout and loss of DSMIL; defaults are the authors' (train_tcga.py, dsmil.py)."""

    kind: Literal["dsmil"] = "dsmil"
    in_dim: _Width = 512  # feature width (authors' feats_size: 512, SimCLR ResNet-18)
    query_dim: _Width = 128  # width of Q
    nonlinear_q: bool = True  # Q = tanh(W2 ReLU(W1 x)) | W x (authors' non_linearity: 1)
    passing_v: bool = False  # v = ReLU(W_v dropout(x)) | x (authors' BClassifier default: off)
    dropout_v: _Rate = 0.0  # before W_v when passing_v (authors' dropout_node: 0)
    num_classes: _Width = 2
    readout: Literal["bag", "mean"] = "bag"
    stream_loss: Literal["bce", "task"] = "bce"
    scoring: Literal["sigmoid", "softmax"] = "sigmoid"  # the authors': per-class sigmoid, one output
    # for two classes (num_classes then 1: set by the task); softmax: one output per class, softmax
    max_tokens_per_chunk: _Width | None = None  # no-grad passes over chunks of this many tiles (exact)

    def __post_init__(self) -> None:
        if self.scoring == "softmax" and self.num_classes < 2:
            raise ConfigError("dsmil: scoring softmax needs an output per class (num_classes >= 2)")

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


def orthogonal_init(module: nn.Module) -> None:
    """The authors' initialisation (train_tcga.py): orthogonal weights, zero biases."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


@MODEL_KINDS.register("dsmil")
class DSMIL(KindModel):
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)
    config_class = DSMILConfig
    config: DSMILConfig
    task_kinds: ClassVar[tuple[str, ...] | None] = ("categorical",)
    task_kinds_reason: ClassVar[str] = "its critical-instance stream and loss are per class"

    def __init__(self, config: DSMILConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.instance_head = nn.Linear(c.in_dim, c.num_classes)
        self.query: nn.Module = (
            nn.Sequential(nn.Linear(c.in_dim, c.query_dim), nn.ReLU(), nn.Linear(c.query_dim, c.query_dim),
                          nn.Tanh())
            if c.nonlinear_q else nn.Linear(c.in_dim, c.query_dim)
        )  # fmt: skip
        self.value: nn.Module = (
            nn.Sequential(nn.Dropout(c.dropout_v), nn.Linear(c.in_dim, c.in_dim), nn.ReLU())
            if c.passing_v else nn.Identity()
        )  # fmt: skip
        self.bag_head = nn.Linear(c.num_classes * c.in_dim, c.num_classes)  # the authors' Conv1d fcc
        orthogonal_init(self)  # the authors' Conv1d weight (C, C, D) is orthogonalised as (C, C D): as ours

    # --- pieces --------------------------------------------------------------------------------------
    def _x(self, x: Tensor) -> Tensor:
        return standardize_input(self, x).to(self.instance_head.weight.dtype)

    def _scale(self) -> float:
        return float(self.config.query_dim) ** 0.5

    def streams(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(instance logits (B, N, C), max-instance logits (B, C), bag logits (B, C), A (B, N, C))."""
        check_bags("dsmil", self.config.in_dim, x, mask)
        x = self._x(x)
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        inst = self.instance_head(x)  # (B, N, C)
        critical = self._critical(inst, mask)  # (B, C)
        q = self.query(x)  # (B, N, Q)
        q_crit = self.query(x.gather(1, critical[..., None].expand(-1, -1, x.shape[-1])))  # (B, C, Q)
        a = masked_softmax(q @ q_crit.transpose(1, 2) / self._scale(), mask)  # (B, N, C)
        bag_feats = torch.einsum("bnc,bnd->bcd", a.to(x.dtype), self.value(x))  # (B, C, D)
        bag = self.bag_head(bag_feats.flatten(1))
        top = inst.gather(1, critical[:, None]).squeeze(1)  # (B, C): each class's highest instance logit
        return inst, top, bag, a

    @staticmethod
    def _critical(inst: Tensor, mask: Tensor | None) -> Tensor:
        """(B, C) index of each class's highest-scoring real tile."""
        if mask is not None:
            inst = inst.masked_fill(~mask[..., None], float("-inf"))
        return inst.argmax(1)

    def _readout(self, top: Tensor, bag: Tensor) -> Tensor:
        return bag if self.config.readout == "bag" else 0.5 * (bag + top)

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) True = real -> logits (B, C) of the readout; coords ignored."""
        chunk = chunk_for(x.shape[1], max_tokens_per_chunk, self.config.max_tokens_per_chunk)
        if chunk and not torch.is_grad_enabled():
            check_bags("dsmil", self.config.in_dim, x, mask)
            out = []
            for b in range(x.shape[0]):
                xb, mb = x[b], None if mask is None else mask[b]
                out.append(self._two_pass(lambda xb=xb, mb=mb: chunks_of(xb, mb, chunk), x.shape[1]))
            return torch.cat(out)
        _, top, bag, _ = self.streams(x, mask)
        return self._readout(top, bag)

    @torch.no_grad()
    def _two_pass(self, parts: Any, n: int) -> Tensor:
        """Logits (1, C) of one bag from `parts()`: a fresh iterator of (x (n, D), mask (n,) or None)."""
        c = self.config.num_classes
        device = self.instance_head.weight.device
        best = torch.full((c,), float("-inf"), device=device)
        crit = torch.zeros(c, self.config.in_dim, device=device, dtype=self.instance_head.weight.dtype)
        seen = 0
        for xs, ms in parts():  # pass 1: each class's critical tile
            xs = self._x(torch.as_tensor(xs, device=device))
            inst = self.instance_head(xs).float()
            if ms is not None:
                inst = inst.masked_fill(~ms[:, None], float("-inf"))
            val, idx = inst.max(0)
            better = val > best
            best = torch.where(better, val, best)
            crit[better] = xs[idx[better]]
            seen += len(xs)
        if seen != n:
            raise ConfigError(f"the chunks held {seen} tiles, not n_tiles={n}")
        q_crit = self.query(crit).float()  # (C, Q)
        top_, total = torch.full((c,), float("-inf"), device=device), torch.zeros(c, device=device)
        acc = torch.zeros(c, self.config.in_dim, device=device)
        for xs, ms in parts():  # pass 2: online softmax over the tiles, accumulating B
            xs = self._x(torch.as_tensor(xs, device=device))
            s = (self.query(xs).float() @ q_crit.T) / self._scale()  # (n, C)
            if ms is not None:
                s = s.masked_fill(~ms[:, None], float("-inf"))
            new_top = torch.maximum(top_, s.amax(0))
            keep = torch.exp(top_ - new_top).nan_to_num(0.0)
            e = torch.exp(s - new_top).nan_to_num(0.0)  # (n, C)
            total = total * keep + e.sum(0)
            acc = acc * keep[:, None] + e.T @ self.value(xs).float()
            top_ = new_top
        bag_feats = (acc / total.clamp_min(torch.finfo(acc.dtype).tiny)[:, None]).to(crit.dtype)
        bag = self.bag_head(bag_feats.flatten()[None])
        return self._readout(best.to(bag.dtype)[None], bag)

    @torch.no_grad()
    def logits_from_chunks(
        self,
        chunks: Iterable[tuple[Tensor, Tensor | None]],
        *,
        n_tiles: int,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """Logits (1, C) of ONE bag read chunk by chunk, twice: `chunks` must be re-iterable (each
        `iter(chunks)` starts over), as `pipelines.predict.stream` gives it."""
        if iter(chunks) is chunks:
            raise ConfigError(
                "dsmil reads a streamed bag twice: give a re-iterable chunk source, not an iterator"
            )
        return self._two_pass(lambda: ((f, None) for f, _ in chunks), n_tiles)

    def training_step(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> TrainingStep:
        """Readout logits and the authors' objective: 0.5 * loss(bag stream) + 0.5 * loss(max instance)."""
        _, top, bag, _ = self.streams(x, mask)

        def objective(inputs: LossInputs) -> Tensor:
            return 0.5 * self.stream_loss(bag, inputs) + 0.5 * self.stream_loss(top, inputs)

        return TrainingStep(self._readout(top, bag), objective)

    def stream_loss(self, logits: Tensor, inputs: LossInputs) -> Tensor:
        """One stream's loss: BCE with logits against the bag's target (one output: the class index,
        the first class all-zero; else one-hot), mean over outputs, the bags weighted by their class
        weight when the task balances classes; or the task's own loss."""
        if self.config.stream_loss == "task":
            return inputs.task_loss(logits)
        target = sigmoid_targets(inputs.labels, self.config.num_classes)
        per_bag = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none").mean(1)
        return weighted_mean(per_bag, inputs.labels, inputs.class_weights)

    # --- explanations --------------------------------------------------------------------------------
    def attention_weights(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """(B, N): the bag stream's attention column of the predicted class (as the authors' maps)."""
        _, top, bag, a = self.streams(x, mask)
        pred = self._readout(top, bag).argmax(-1)
        return a.gather(2, pred[:, None, None].expand(-1, a.shape[1], 1))[..., 0]

    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)) with readout logits == base + contrib.sum(1) exactly."""
        inst, _, _, a = self.streams(x, mask)
        xx = self._x(x)
        if mask is not None:
            xx = xx.masked_fill(~mask[..., None], 0.0)
        v = self.value(xx)  # (B, N, D)
        c, d = self.config.num_classes, v.shape[-1]
        w = self.bag_head.weight.reshape(c, c, d)  # [out class i, stream class j, D]
        per_tile = torch.einsum("bnd,ijd->bnij", v, w)  # (B, N, C_out, C_stream)
        contrib = torch.einsum("bnij,bnj->bni", per_tile, a.to(v.dtype))
        base = self.bag_head.bias.expand(x.shape[0], -1)
        if self.config.readout == "bag":
            return contrib, base
        critical = self._critical(inst, mask)  # (B, C)
        at_crit = torch.zeros_like(contrib).scatter_add_(
            1, critical[:, None], inst.gather(1, critical[:, None])
        )  # each class's instance logit at its critical tile
        return 0.5 * (contrib + at_crit), 0.5 * base

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's exact additive share of each readout logit (B, N, C); 0 at padding."""
        return self.logit_decomposition(x, mask, coords_um)[0]


def from_authors_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict of the authors' MILNet (FCLayer + BClassifier) in our layout."""
    table = {
        "i_classifier.fc.0": "instance_head", "b_classifier.q.0": "query.0", "b_classifier.q.2": "query.2",
        "b_classifier.v.1": "value.1", "b_classifier.fcc.bias": "bag_head.bias",
    }  # fmt: skip
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key == "b_classifier.fcc.weight":
            out["bag_head.weight"] = value.reshape(value.shape[0], -1)
            continue
        if key.startswith("b_classifier.q.") and key.count(".") == 2:  # nonlinear_q off: q is a Linear
            out[key.replace("b_classifier.q", "query")] = value
            continue
        prefix = next((p for p in table if key == p or key.startswith(f"{p}.")), None)
        if prefix is None:
            raise ConfigError(f"unexpected key {key!r} for DSMIL's authors' layout")
        out[table[prefix] + key[len(prefix) :]] = value
    return out


__all__ = ["DSMIL", "DSMILConfig", "from_authors_state_dict", "orthogonal_init"]
