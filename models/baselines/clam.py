"""CLAM (presets `clam-sb`, `clam-mb`): Lu et al., "Data-efficient and weakly supervised computational
pathology on whole-slide images", Nature Biomedical Engineering 2021. Our own code, read from the
authors' mahmoodlab/CLAM models/model_clam.py @ 53e2409d4a81 (CLAM_SB, CLAM_MB, Attn_Net(_Gated)) and
utils/core_utils.py (train_loop_clam: total = bag_weight * bag loss + (1 - bag_weight) * instance loss),
main.py for the defaults (dropout 0.25, k_sample B = 8, bag_weight 0.7, size "small", `--subtyping` off,
`--inst_loss` None: cross-entropy); mahmoodlab/MIL-Lab src/models/clam.py @ dfc3c17ca687 re-uses it the
same way.

Per bag: h = ReLU(W x) (in_dim -> 512, dropout), K gated-attention scores per tile (K = 1 for SB, one
per class for MB), a = softmax over the bag. SB: logits = W_cls (sum_k a_k h_k) + b. MB: class c's
logit = w_c . (sum_k a_ck h_k) + b_c from its own branch. 790,791 (SB) and 791,048 (MB) parameters at the
authors' configuration (1024-d input, two classes), as theirs.

The instance loss (the model's objective, models.objectives), per bag of class y: instance classifier y
learns the k most attended tiles as positive and the k least as negative (for MB, by branch y's
attention); with `subtyping` each other class's classifier also learns its branch's k most attended
tiles as negative and the classifiers' losses are averaged. k = min(k_sample, tiles) (the authors'
topk fails below k tiles). `subtyping` is the authors' `--subtyping` flag, set by hand: "a subtyping
problem", every class a tumour type (LUAD vs LUSC), so a bag's attended tiles are evidence against the
other classes; off (the flag's default) for a detection task whose negative class has no tiles of its
own (tumour vs normal). The packaged subtyping task `nsclc-subtype` sets it (its model.overrides).
`inst_loss`: `ce` (main.py's default) or `svm`, the smooth top-1 SVM the authors' README trains with
(models.baselines.smooth_svm). The bag loss is the task's (cross-entropy, with its class weights when
asked).

Explanations are exact: the classifier is linear after a convex pooling, so tile k's contribution to
class c is a_ck (w_c . h_k) and logits = bias + the contributions. Long bags: without gradients, a
bag above 16,384 tiles (or any with `max_tokens_per_chunk`) gets its scores and each tile's class
scores chunk by chunk (exact), as `logits_from_chunks` does for a bag streamed from disk; only (N, K)
and (N, C) values are kept for the whole bag.
Categorical tasks only: the instance loss needs each bag's class.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from wsi.core.config import config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.base.objectives import LossInputs, TrainingStep
from wsi.models.baselines.layers import (
    AttentionScores,
    Rate,
    Width,
    check_bags,
    chunk_for,
    chunks_of,
    masked_softmax,
    renamed,
)
from wsi.models.baselines.smooth_svm import smooth_top1_svm
from wsi.models.layers.standardize import standardize_input

_Width = Width
_Rate = Rate


@config_model
@dataclass(frozen=True)
class CLAMConfig:
    """Architecture and instance loss of CLAM; defaults are the authors' (main.py, model_clam.py)."""

    kind: Literal["clam_sb", "clam_mb"] = "clam_sb"
    in_dim: _Width = 1024  # feature width (authors' embed_dim: 1024)
    hidden_dim: _Width = 512  # size "small": [in, 512, 256]; "big": [in, 512, 384]
    attn_dim: _Width = 256
    gated: bool = True  # Attn_Net_Gated (tanh * sigmoid) | Attn_Net (tanh)
    dropout: _Rate = 0.25  # after the embedding ReLU and in the attention branches (authors' drop_out)
    num_classes: _Width = 2
    k_sample: _Width = 8  # tiles per side for the instance loss (authors' B)
    bag_weight: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7  # total = w * bag + (1 - w) * instance
    subtyping: bool = False  # the authors' --subtyping: out-of-class instance loss (every class a subtype)
    inst_loss: Literal["ce", "svm"] = "ce"  # instance classifiers' loss: cross-entropy | smooth top-1 SVM
    max_tokens_per_chunk: _Width | None = None  # no-grad passes over chunks of this many tiles (exact)

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)

    @property
    def branches(self) -> int:
        return self.num_classes if self.kind == "clam_mb" else 1

    @property
    def is_subtyping(self) -> bool:
        return self.subtyping


#: `subtyping` as wsi wrote it before it was the authors' plain flag (run records keep the old value)
LEGACY_SUBTYPING = {"on": True, "off": False}


def legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A saved CLAM config with `subtyping: auto | on | off` as the flag those runs trained with (auto:
    on for more than two classes)."""
    value = config.get("subtyping")
    if not isinstance(value, str):
        return config
    flag = LEGACY_SUBTYPING.get(value, int(config.get("num_classes", 2)) > 2)
    return {**config, "subtyping": flag}


class CLAM(KindModel):
    """CLAM-SB (kind clam_sb) and CLAM-MB (clam_mb): the same code with 1 or C attention branches."""
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)

    config_class = CLAMConfig
    config: CLAMConfig
    task_kinds: ClassVar[tuple[str, ...] | None] = ("categorical",)
    task_kinds_reason: ClassVar[str] = (
        "its instance loss clusters each bag's top and bottom tiles by the bag's class"
    )

    def __init__(self, config: CLAMConfig) -> None:
        super().__init__()
        if config.kind != self.kind_name:
            raise ConfigError(f"{type(self).__name__} builds kind {self.kind_name!r}, not {config.kind!r}")
        self.config = config
        c = config
        self.embed = nn.Sequential(nn.Linear(c.in_dim, c.hidden_dim), nn.ReLU(), nn.Dropout(c.dropout))
        self.attention = AttentionScores(
            c.hidden_dim, c.attn_dim, c.branches, gated=c.gated, dropout=0.25 if c.dropout else 0.0
        )  # the authors' Attn_Net(_Gated) drops at 0.25 whenever dropout is on
        self.head = nn.Linear(c.hidden_dim, c.num_classes) if c.branches == 1 else None
        # MB: one Linear(hidden, 1) per class, held as a (C, hidden) weight and (C,) bias
        self.branch_weight = (
            nn.Parameter(torch.empty(c.num_classes, c.hidden_dim)) if c.branches > 1 else None
        )
        self.branch_bias = nn.Parameter(torch.empty(c.num_classes)) if c.branches > 1 else None
        if self.branch_weight is not None and self.branch_bias is not None:
            for i in range(c.num_classes):  # nn.Linear's own initialisation, class by class
                layer = nn.Linear(c.hidden_dim, 1)
                self.branch_weight.data[i] = layer.weight.data[0]
                self.branch_bias.data[i] = layer.bias.data[0]
        self.instance_heads = nn.ModuleList([nn.Linear(c.hidden_dim, 2) for _ in range(c.num_classes)])

    kind_name: ClassVar[str] = "clam_sb"

    # --- pieces --------------------------------------------------------------------------------------
    def _dtype(self) -> torch.dtype:
        """The parameters' dtype (the embedding's first layer)."""
        return self.attention.score.weight.dtype

    def _class_weights(self) -> tuple[Tensor, Tensor]:
        """(W (C, hidden), b (C,)) of the bag classifier(s)."""
        if self.head is not None:
            return self.head.weight, self.head.bias
        assert self.branch_weight is not None and self.branch_bias is not None
        return self.branch_weight, self.branch_bias

    def _embed(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = standardize_input(self, x).to(self._dtype())
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        return self.embed(x)

    def _pieces(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """(h (B, N, hidden), a (B, N, K) softmax over each bag's real tiles)."""
        check_bags(self.kind_name, self.config.in_dim, x, mask)
        h = self._embed(x, mask)
        return h, masked_softmax(self.attention(h), mask)

    def _decompose(self, scores: Tensor, tile_logits: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Raw scores (B, N, K) and class scores W h_k (B, N, C) -> (contrib (B, N, C), base (B, C))."""
        a = masked_softmax(scores, mask)  # (B, N, K): K = 1 broadcasts over the classes
        _, bias = self._class_weights()
        return a.to(tile_logits.dtype) * tile_logits, bias.expand(scores.shape[0], -1)

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) True = real -> logits (B, C); coords_um is ignored."""
        chunk = chunk_for(x.shape[1], max_tokens_per_chunk, self.config.max_tokens_per_chunk)
        if chunk and not torch.is_grad_enabled():
            check_bags(self.kind_name, self.config.in_dim, x, mask)
            contrib, base = self._chunked(chunks_of(x, mask, chunk), x.shape[:2], mask)
            return base + contrib.sum(1)
        return self._logits(*self._pieces(x, mask))

    def _logits(self, h: Tensor, a: Tensor) -> Tensor:
        w, b = self._class_weights()
        pooled = torch.einsum("bnk,bnd->bkd", a.to(h.dtype), h)  # (B, K, hidden)
        if self.head is not None:
            return self.head(pooled[:, 0])
        return (pooled * w).sum(-1) + b  # class c from its own branch

    def _chunked(
        self, parts: Iterable[tuple[Tensor, Tensor | None]], shape: tuple[int, ...], mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Contributions and base from chunks of (x (B, n, in_dim), mask): only (B, N, K) scores and
        (B, N, C) class scores are kept for the whole bag."""
        w, _ = self._class_weights()
        b, n = shape
        scores = torch.empty(b, n, self.config.branches, device=w.device, dtype=torch.float32)
        tile_logits = torch.empty(b, n, self.config.num_classes, device=w.device, dtype=w.dtype)
        done = 0
        for xs, ms in parts:
            h = self._embed(torch.as_tensor(xs, device=w.device), ms)
            sl = slice(done, done + h.shape[1])
            scores[:, sl] = self.attention(h).float()
            tile_logits[:, sl] = h @ w.T
            done = sl.stop
        if done != n:
            raise ConfigError(f"the chunks held {done} tiles, not n_tiles={n}")
        return self._decompose(scores, tile_logits, mask)

    @torch.no_grad()
    def logits_from_chunks(
        self,
        chunks: Iterable[tuple[Tensor, Tensor | None]],
        *,
        n_tiles: int,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """Logits (1, C) of ONE bag read chunk by chunk (feats (n, in_dim), coords or None), as forward."""
        if n_tiles < 1:
            raise ConfigError(f"n_tiles must be at least 1, got {n_tiles}")
        parts = ((torch.as_tensor(f)[None], None) for f, _ in chunks)
        contrib, base = self._chunked(parts, (1, n_tiles), None)
        return base + contrib.sum(1)

    def training_step(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> TrainingStep:
        """Bag logits and the authors' objective: w * task loss + (1 - w) * instance loss, w = bag_weight."""
        h, a = self._pieces(x, mask)
        logits = self._logits(h, a)

        def objective(inputs: LossInputs) -> Tensor:
            inst = torch.stack([self.instance_loss(h[i], a[i], int(y), None if mask is None else mask[i])
                                for i, y in enumerate(inputs.labels.tolist())]).mean()  # fmt: skip
            w = self.config.bag_weight
            return w * inputs.task_loss(logits) + (1 - w) * inst

        return TrainingStep(logits, objective)

    def instance_loss(self, h: Tensor, a: Tensor, label: int, mask: Tensor | None = None) -> Tensor:
        """One bag's instance-clustering loss: h (N, hidden), a (N, K) attention, its class `label`."""
        if mask is not None:
            h, a = h[mask], a[mask]
        k = min(self.config.k_sample, h.shape[0])
        total = h.new_zeros(())
        for c, classifier in enumerate(self.instance_heads):
            branch = a[:, c if self.config.branches > 1 else 0]
            top = torch.topk(branch, k).indices
            if c == label:  # in the class: top k positive, bottom k negative
                bottom = torch.topk(-branch, k).indices
                tiles = torch.cat([h[top], h[bottom]])
                targets = torch.cat([torch.ones(k), torch.zeros(k)]).long().to(h.device)
            elif self.config.is_subtyping:  # out of the class: its top k negative
                tiles, targets = h[top], torch.zeros(k, dtype=torch.long, device=h.device)
            else:
                continue
            tiles = tiles.to(self._dtype())  # the objective runs outside autocast: h may be bf16
            scores = classifier(tiles).float()
            if self.config.inst_loss == "svm":
                total = total + smooth_top1_svm(scores, targets)
            else:
                total = total + F.cross_entropy(scores, targets)
        return total / len(self.instance_heads) if self.config.is_subtyping else total

    # --- explanations --------------------------------------------------------------------------------
    def attention_weights(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """a (B, N): the attention (SB), or the predicted class's branch (MB, as the authors' heatmaps)."""
        h, a = self._pieces(x, mask)
        if self.config.branches == 1:
            return a[..., 0]
        pred = self._logits(h, a).argmax(-1)  # (B,)
        return a.gather(2, pred[:, None, None].expand(-1, a.shape[1], 1))[..., 0]

    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)) with logits == base + contrib.sum(1). Call in eval mode."""
        check_bags(self.kind_name, self.config.in_dim, x, mask)
        return self._chunked([(x, mask)], x.shape[:2], mask)

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's exact additive share of each logit (B, N, C): a_ck (w_c . h_k); 0 at padding."""
        return self.logit_decomposition(x, mask, coords_um)[0]


@MODEL_KINDS.register("clam_sb")
class CLAMSB(CLAM):
    kind_name: ClassVar[str] = "clam_sb"


@MODEL_KINDS.register("clam_mb")
class CLAMMB(CLAM):
    kind_name: ClassVar[str] = "clam_mb"


def from_authors_state_dict(
    state: dict[str, Tensor], *, gated: bool = True, dropout: bool = True
) -> dict[str, Tensor]:
    """A state dict of the authors' CLAM_SB or CLAM_MB in our layout (MB's per-class bag classifiers
    `classifiers.<c>.weight (1, hidden)` become rows of `branch_weight`)."""
    score = "attention_net.3.attention_c" if gated else f"attention_net.3.module.{3 if dropout else 2}"
    net = "attention_net.3"
    table = {
        "attention_net.0": "embed.0", f"{net}.attention_a.0": "attention.tanh_branch",
        f"{net}.attention_b.0": "attention.gate", f"{net}.module.0": "attention.tanh_branch",
        score: "attention.score", "instance_classifiers": "instance_heads",
    }  # fmt: skip
    branch = sorted(k for k in state if k.startswith("classifiers.") and k.count(".") == 2)
    out = renamed({k: v for k, v in state.items() if not k.startswith("classifiers")}, table)
    if branch:  # MB
        n = len(branch) // 2
        out["branch_weight"] = torch.cat([state[f"classifiers.{c}.weight"] for c in range(n)])
        out["branch_bias"] = torch.cat([state[f"classifiers.{c}.bias"] for c in range(n)])
    else:
        out["head.weight"], out["head.bias"] = state["classifiers.weight"], state["classifiers.bias"]
    return out


__all__ = ["CLAM", "CLAMMB", "CLAMSB", "CLAMConfig", "from_authors_state_dict", "legacy_config"]
