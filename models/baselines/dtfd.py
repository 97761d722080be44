"""DTFD-MIL (preset `dtfd`): Zhang et al., "DTFD-MIL: Double-Tier Feature Distillation Multiple Instance
Learning for Histopathology Whole Slide Image Classification", CVPR 2022. Our own code, read from the
authors' hrzhang1123/DTFD-MIL Main_DTFD_MIL.py @ 10964f4dcc27 (train_attention_preFeature_DTFD,
test_attention_DTFD_preFeat_MultipleMean and their argparse defaults), Model/Attention.py
(Attention_Gated, Attention_with_Classifier), Model/network.py (DimReduction, Classifier_1fc) and
utils.py (get_cam_1d); mahmoodlab/MIL-Lab src/models/dftd.py @ dfc3c17ca687 re-uses it with one
optimizer and bag_weight * tier-2 + (1 - bag_weight) * tier-1.

Per bag: h = ReLU(W x) (in_dim -> 512, no bias; `residual_blocks` more), a gated attention score per
tile; the tiles are shuffled into G = 4 pseudo-bags (the authors' numGroup; np.array_split sizes). Tier
1, per pseudo-bag: a = softmax of its tiles' scores, f = sum a h, a sub-logit W1 f (each pseudo-bag
labelled with its bag's class). Distillation (`distill`): AFS passes f on; MaxS / MaxMinS pass the
h of the k = total_instance // G tiles with the highest (and lowest) last-class probability
softmax(a_k W1 h_k). Tier 2: gated attention over the distilled features and a linear classifier give
the bag logits. 789,254 parameters at the authors' configuration (1024-d input, two classes).

Training (the model's objective, models.objectives): the authors step two Adam optimizers, tier 1 on
the mean cross-entropy of the sub-logits and tier 2 on the bag's, each after clipping its modules'
gradients to norm 5. Their second backward runs after the first optimizer step: on PyTorch 1.x (whose
optimizers wrote `p.data`) the tier-2 gradients that reached tier 1 were zeroed before the next use;
on current PyTorch that order raises an in-place error. What trained is therefore tier 1 on its loss
and tier 2 on features it does not back-propagate into: here one loss, tier-1 loss + tier-2 loss with
the distilled features detached (the same gradients, one optimizer: the task's), and
`before_optimizer_step` clips the authors' four modules to `grad_clip` each. Pseudo-bags are drawn
anew every step from torch's generator (the run's seed).

Inference: the authors shuffle at random at test time too; ours is deterministic: the split comes from
a generator seeded with `split_seed` (the same for every bag), averaged over `mean_inference` splits
(the authors' num_MeanInference, 1; we average logits, they probabilities). Bags of fewer than G tiles
use one pseudo-bag per tile (the authors' split would leave some empty). Categorical tasks only.

Explanations are exact: each distilled feature is a fixed combination of tiles (AFS: the weights a;
MaxS/MaxMinS: the chosen tiles), so logits = b2 + sum_k w_k (W2 h_k) with w = tier-2 weights times
that combination, and `attention_weights` is w. Long bags: without gradients, a bag above 16,384
tiles (or any with `max_tokens_per_chunk`) runs two passes over chunks (scores and class scores, then
the distilled features), keeping (N, 1 + C) scores and the pseudo-bags' (G + P, N) weights;
`logits_from_chunks` reads a streamed bag twice the same way (re-iterable source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from wsi.core.config import MAX_SEED, config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.base.objectives import LossInputs, TrainingStep
from wsi.models.baselines.layers import AttentionScores, Rate, Width, bags, check_bags, chunk_for, renamed
from wsi.models.layers.standardize import standardize_input

_Width = Width
_Rate = Rate
Parts = Callable[[], Iterator[Tensor]]  # a fresh iterator over one bag's feature chunks (n, in_dim)


@config_model
@dataclass(frozen=True)
class DTFDConfig:
    """Architecture and training of DTFD-MIL; defaults are the authors' (Main_DTFD_MIL.py argparse)."""

    kind: Literal["dtfd"] = "dtfd"
    in_dim: _Width = 1024  # feature width (authors' in_chn)
    hidden_dim: _Width = 512  # mDim
    attn_dim: _Width = 128  # Attention_Gated D
    residual_blocks: Annotated[int, Field(ge=0, le=1000, strict=True)] = 0  # numLayer_Res
    num_classes: _Width = 2
    pseudo_bags: _Width = 4  # numGroup (and numGroup_test)
    distill: Literal["AFS", "MaxS", "MaxMinS"] = "AFS"  # distill_type
    total_instance: _Width = 4  # MaxS / MaxMinS keep total_instance // pseudo_bags tiles per side
    dropout: _Rate = 0.0  # before the tier-1 classifier (droprate)
    tier2_dropout: _Rate = 0.0  # before the tier-2 classifier (droprate_2)
    grad_clip: Annotated[float, Field(gt=0, le=1e6)] | None = 5.0  # per module, each step (grad_clipping)
    mean_inference: _Width = 1  # splits averaged at inference (num_MeanInference)
    split_seed: Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)] = 0  # seeds the inference splits
    # (ours: the authors' are unseeded)
    max_tokens_per_chunk: _Width | None = None  # no-grad passes over chunks of this many tiles (exact)

    def __post_init__(self) -> None:
        if self.distill != "AFS" and self.total_instance // self.pseudo_bags < 1:
            raise ConfigError(
                f"distill {self.distill} keeps total_instance // pseudo_bags = "
                f"{self.total_instance} // {self.pseudo_bags} = 0 tiles per pseudo-bag; raise total_instance"
            )

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


class _Reduce(nn.Module):
    """DimReduction: ReLU(W x) (no bias), then `blocks` residual blocks x + ReLU(W2 ReLU(W1 x))."""

    def __init__(self, in_dim: int, dim: int, blocks: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, dim, bias=False)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(dim, dim, bias=False), nn.ReLU(), nn.Linear(dim, dim, bias=False), nn.ReLU()
            )
            for _ in range(blocks)
        )

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc(x))
        for block in self.blocks:
            h = h + block(h)
        return h


@dataclass
class _Mix:
    """One split of one bag: tier-1 features = afs @ h (G, n), distilled features = chosen @ h (P, n)."""

    afs: Tensor
    chosen: Tensor


@MODEL_KINDS.register("dtfd")
class DTFD(KindModel):
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)
    config_class = DTFDConfig
    config: DTFDConfig
    task_kinds: ClassVar[tuple[str, ...] | None] = ("categorical",)
    task_kinds_reason: ClassVar[str] = "its pseudo-bags each carry their bag's class"

    def __init__(self, config: DTFDConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.reduce = _Reduce(c.in_dim, c.hidden_dim, c.residual_blocks)
        self.tier1_attention = AttentionScores(c.hidden_dim, c.attn_dim, 1)
        self.tier1_drop = nn.Dropout(c.dropout)
        self.tier1_head = nn.Linear(c.hidden_dim, c.num_classes)
        self.tier2_attention = AttentionScores(c.hidden_dim, c.attn_dim, 1)
        self.tier2_drop = nn.Dropout(c.tier2_dropout)
        self.tier2_head = nn.Linear(c.hidden_dim, c.num_classes)

    # --- pieces --------------------------------------------------------------------------------------
    def _h(self, x: Tensor) -> Tensor:
        return self.reduce(standardize_input(self, x).to(self.reduce.fc.weight.dtype))

    def splits(self, n: int, generator: torch.Generator | None = None) -> list[Tensor]:
        """Tile indices of each pseudo-bag: a random permutation cut as np.array_split cuts it."""
        perm = torch.randperm(n, generator=generator)
        return list(torch.tensor_split(perm, min(self.config.pseudo_bags, max(n, 1))))

    def eval_splits(self, n: int) -> list[list[Tensor]]:
        """The `mean_inference` deterministic splits used without training."""
        g = torch.Generator().manual_seed(self.config.split_seed)
        return [self.splits(n, g) for _ in range(self.config.mean_inference)]

    def mix(self, scores: Tensor, tile_logits: Tensor, groups: list[Tensor]) -> _Mix:
        """From each tile's score (n,) and class scores W1 h_k (n, C): the tier-1 attention (G, n) and
        the distilled rows (P, n) of one split."""
        n = scores.shape[0]
        afs = scores.new_zeros(len(groups), n, dtype=torch.float32)
        chosen: list[Tensor] = []
        k = self.config.total_instance // self.config.pseudo_bags
        for j, idx in enumerate(groups):
            idx = idx.to(scores.device)
            a = torch.softmax(scores[idx].float(), 0)
            afs[j, idx] = a
            if self.config.distill != "AFS":
                probs = torch.softmax(a[:, None] * tile_logits[idx].float(), -1)[:, -1]
                order = idx[torch.sort(probs, descending=True).indices]
                chosen.append(
                    order[:k] if self.config.distill == "MaxS" else torch.cat([order[:k], order[-k:]])
                )
        if self.config.distill == "AFS":
            return _Mix(afs, afs)
        rows = torch.cat(chosen)
        return _Mix(afs, F.one_hot(rows, n).to(afs.dtype))

    def _tier2(self, pseudo: Tensor) -> tuple[Tensor, Tensor]:
        """Distilled features (P, hidden) -> (logits (C,), tier-2 weights (P,))."""
        b = torch.softmax(self.tier2_attention(pseudo)[:, 0].float(), 0)
        return self.tier2_head(self.tier2_drop(b.to(pseudo.dtype) @ pseudo)), b

    def _scores(self, h: Tensor) -> tuple[Tensor, Tensor]:
        return self.tier1_attention(h)[:, 0], h @ self.tier1_head.weight.T

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) True = real -> tier-2 logits (B, C); coords ignored. Training:
        a random split per bag; otherwise the mean over the deterministic splits."""
        check_bags("dtfd", self.config.in_dim, x, mask)
        chunk = chunk_for(x.shape[1], max_tokens_per_chunk, self.config.max_tokens_per_chunk)
        out = []
        for _, feats in bags(x, mask):
            if chunk and not torch.is_grad_enabled():
                out.append(self._two_pass(_splitter(feats, chunk), feats.shape[0]))
            elif self.training:
                out.append(self._tier2(self._split_pieces(feats, self.splits(feats.shape[0]))[1])[0][None])
            else:
                splits = self.eval_splits(feats.shape[0])
                logits = [self._tier2(self._split_pieces(feats, groups)[1])[0] for groups in splits]
                out.append(torch.stack(logits).mean(0, keepdim=True))
        return torch.cat(out)

    def _split_pieces(self, feats: Tensor, groups: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, _Mix]:
        """(sub-logits (G, C), distilled features (P, hidden), h (n, hidden), the split's mix)."""
        h = self._h(feats)
        mix = self.mix(*self._scores(h), groups)
        sub = self.tier1_head(self.tier1_drop(mix.afs.to(h.dtype) @ h))
        return sub, mix.chosen.to(h.dtype) @ h, h, mix

    def _decompose(self, feats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One bag without training: (contrib (n, C), base (1, C), tile weights (n,)), mean over splits."""
        contrib = feats.new_zeros(feats.shape[0], self.config.num_classes, dtype=torch.float32)
        weights = feats.new_zeros(feats.shape[0], dtype=torch.float32)
        splits = self.eval_splits(feats.shape[0])
        for groups in splits:
            _, pseudo, h, mix = self._split_pieces(feats, groups)
            _, b = self._tier2(pseudo)
            w = b @ mix.chosen  # (n,) each tile's weight in the pooled tier-2 feature
            contrib += w[:, None] * (h @ self.tier2_head.weight.T).float()
            weights += w
        return contrib / len(splits), self.tier2_head.bias[None].float(), weights / len(splits)

    @torch.no_grad()
    def _two_pass(self, parts: Parts, n: int) -> Tensor:
        """Logits (1, C) of one bag from `parts()` (fresh iterators of (n_chunk, in_dim) features)."""
        dev = self.tier1_head.weight.device
        scores = torch.empty(n, device=dev)
        tile_logits = torch.empty(n, self.config.num_classes, device=dev)
        done = 0
        for xs in parts():  # pass 1: scores and class scores
            s, t = self._scores(self._h(torch.as_tensor(xs, device=dev)))
            scores[done : done + len(s)], tile_logits[done : done + len(s)] = s.float(), t.float()
            done += len(s)
        if done != n:
            raise ConfigError(f"the chunks held {done} tiles, not n_tiles={n}")
        mixes = [self.mix(scores, tile_logits, groups) for groups in self.eval_splits(n)]
        pseudo = [torch.zeros(m.chosen.shape[0], self.config.hidden_dim, device=dev) for m in mixes]
        done = 0
        for xs in parts():  # pass 2: the distilled features
            h = self._h(torch.as_tensor(xs, device=dev)).float()
            for p, m in zip(pseudo, mixes, strict=True):
                p += m.chosen[:, done : done + len(h)] @ h
            done += len(h)
        dtype = self.tier2_head.weight.dtype
        return torch.stack([self._tier2(p.to(dtype))[0] for p in pseudo]).mean(0, keepdim=True)

    @torch.no_grad()
    def logits_from_chunks(
        self,
        chunks: Iterable[tuple[Tensor, Tensor | None]],
        *,
        n_tiles: int,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """Logits (1, C) of ONE bag read chunk by chunk, twice: `chunks` must be re-iterable."""
        if iter(chunks) is chunks:
            raise ConfigError(
                "dtfd reads a streamed bag twice: give a re-iterable chunk source, not an iterator"
            )
        return self._two_pass(lambda: (torch.as_tensor(f) for f, _ in chunks), n_tiles)

    def training_step(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> TrainingStep:
        """Tier-2 logits on a random split, and the objective: tier-1 cross-entropy over the pseudo-bags
        plus the task's loss of the tier-2 logits on the detached distilled features."""
        check_bags("dtfd", self.config.in_dim, x, mask)
        subs, logits, counts = [], [], []
        for _, feats in bags(x, mask):
            sub, pseudo, _, _ = self._split_pieces(feats, self.splits(feats.shape[0]))
            subs.append(sub)
            counts.append(sub.shape[0])
            logits.append(self._tier2(pseudo.detach())[0])
        bag_logits = torch.stack(logits)

        def objective(inputs: LossInputs) -> Tensor:
            labels = inputs.labels.repeat_interleave(torch.tensor(counts, device=inputs.labels.device))
            tier1 = F.cross_entropy(torch.cat(subs).float(), labels, weight=inputs.class_weights)
            return tier1 + inputs.task_loss(bag_logits)

        return TrainingStep(bag_logits, objective)

    def before_optimizer_step(self) -> None:
        """The authors' per-module gradient clipping (dimReduction, attention, classifier, UClassifier)."""
        if self.config.grad_clip is None:
            return
        tier2 = [*self.tier2_attention.parameters(), *self.tier2_head.parameters()]
        tier1 = (self.reduce, self.tier1_attention, self.tier1_head)
        for params in [*(list(m.parameters()) for m in tier1), tier2]:
            nn.utils.clip_grad_norm_(params, self.config.grad_clip)

    # --- explanations --------------------------------------------------------------------------------
    def attention_weights(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """(B, N): each tile's weight in the pooled tier-2 feature (mean over the inference splits)."""
        return self._per_bag(x, mask, 2)[..., 0]

    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)) with logits == base + contrib.sum(1). Call in eval mode."""
        return self._per_bag(x, mask, 0), self.tier2_head.bias.expand(x.shape[0], -1)

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's exact additive share of each logit (B, N, C); 0 at padding and unchosen tiles."""
        return self.logit_decomposition(x, mask, coords_um)[0]

    def _per_bag(self, x: Tensor, mask: Tensor | None, which: int) -> Tensor:
        check_bags("dtfd", self.config.in_dim, x, mask)
        width = self.config.num_classes if which == 0 else 1
        out = torch.zeros(*x.shape[:2], width, device=x.device)
        for b, feats in bags(x, mask):
            values = self._decompose(feats)[which]
            rows = values if which == 0 else values[:, None]
            if mask is None:
                out[b] = rows
            else:
                out[b, mask[b]] = rows
        return out.to(self.tier2_head.weight.dtype)


def _splitter(feats: Tensor, chunk: int) -> Parts:
    """A fresh iterator over `feats` in chunks of `chunk` rows, each time it is called."""
    return lambda: iter(feats.split(chunk))


def from_authors_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The authors' checkpoint ({'classifier', 'dim_reduction', 'attention', 'att_classifier'} state
    dicts, flattened as `<name>.<key>`) in our layout."""
    table = {
        "dim_reduction.fc1": "reduce.fc",
        "attention.attention_V.0": "tier1_attention.tanh_branch",
        "attention.attention_U.0": "tier1_attention.gate",
        "attention.attention_weights": "tier1_attention.score", "classifier.fc": "tier1_head",
        "att_classifier.attention.attention_V.0": "tier2_attention.tanh_branch",
        "att_classifier.attention.attention_U.0": "tier2_attention.gate",
        "att_classifier.attention.attention_weights": "tier2_attention.score",
        "att_classifier.classifier.fc": "tier2_head",
    }  # fmt: skip
    blocks = {k: v for k, v in state.items() if k.startswith("dim_reduction.resBlocks.")}
    out = renamed({k: v for k, v in state.items() if k not in blocks}, table)
    for key, value in blocks.items():  # dim_reduction.resBlocks.<i>.block.<j>.weight
        _, _, i, _, j, name = key.split(".")
        out[f"reduce.blocks.{i}.{j}.{name}"] = value
    return out


__all__ = ["DTFD", "DTFDConfig", "from_authors_state_dict"]
