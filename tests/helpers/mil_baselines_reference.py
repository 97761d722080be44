"""The authors' MIL models and losses, written here from their repositories for
tests/models/baselines/test_mil_baselines.py.

Independent of wsi.models.baselines: the parameter names and shapes are the authors' (so their state
dicts are what `from_authors_state_dict` reads), and each forward follows the authors' code step by
step (front padding and landmark sums of lucidrains' Nystrom attention, CLAM's topk instance loss,
DSMIL's sort for critical instances, DTFD's np.array_split pseudo-bags and get_cam_1d).

  TransMIL  szc19990412/TransMIL models/TransMIL.py @ 9d6aee57c7c7, with NystromAttention from
            lucidrains/nystrom-attention nystrom_attention/nystrom_attention.py at tag 0.0.14 @ fbe9ebad6bae
            (`out[:, -n:]`) or tag 0.0.9 @ e3c4aa5c988f (`out[:, :n]`: `version`)
  CLAM      mahmoodlab/CLAM models/model_clam.py, utils/core_utils.py (train_loop_clam) @ 53e2409d4a81
  DSMIL     binli123/dsmil-wsi dsmil.py, train_tcga.py (train) @ 80465ed534ac
  DTFD-MIL  hrzhang1123/DTFD-MIL Model/*.py, utils.py, Main_DTFD_MIL.py @ 10964f4dcc27

Dropout sits where each authors' module has it (the training-mode tests compare under one seed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange, reduce
from torch import nn


# ------------------------------------------------------------------------------------------- TransMIL
def _pinv(x: torch.Tensor, iters: int = 6) -> torch.Tensor:
    abs_x = torch.abs(x)
    col, row = abs_x.sum(dim=-1), abs_x.sum(dim=-2)
    z = rearrange(x, "... i j -> ... j i") / (torch.max(col) * torch.max(row))
    eye = rearrange(torch.eye(x.shape[-1]), "i j -> () i j")
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * eye - (xz @ (15 * eye - (xz @ (7 * eye - xz)))))
    return z


class RefNystrom(nn.Module):
    def __init__(
        self, dim: int = 512, dim_head: int = 64, heads: int = 8, num_landmarks: int = 256,
        version: str = "0.0.14",
    ) -> None:  # fmt: skip
        super().__init__()
        self.version = version
        inner = heads * dim_head
        self.heads, self.m, self.scale = heads, num_landmarks, dim_head**-0.5
        self.keep_attn = False  # tests set it: `last_attn` then holds the authors' return_attn matrix
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.1))
        self.res_conv = nn.Conv2d(heads, heads, (33, 1), padding=(16, 0), groups=heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, m, h = x.shape[1], self.m, self.heads
        if n % m:
            x = F.pad(x, (0, 0, m - n % m, 0), value=0)
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=h) for t in (q, k, v))
        q = q * self.scale
        seg = math.ceil(n / m)
        q_l = reduce(q, "... (n l) d -> ... n d", "sum", l=seg) / seg
        k_l = reduce(k, "... (n l) d -> ... n d", "sum", l=seg) / seg
        attn1 = torch.einsum("...id,...jd->...ij", q, k_l).softmax(-1)
        attn2 = torch.einsum("...id,...jd->...ij", q_l, k_l).softmax(-1)
        attn3 = torch.einsum("...id,...jd->...ij", q_l, k).softmax(-1)
        if self.keep_attn:
            self.last_attn = attn1 @ _pinv(attn2) @ attn3  # the authors' return_attn (B, H, N, N)
        out = (attn1 @ _pinv(attn2)) @ (attn3 @ v) + self.res_conv(v)
        out = self.to_out(rearrange(out, "b h n d -> b n (h d)", h=h))
        return out[:, :n] if self.version == "0.0.9" else out[:, -n:]  # the one line 0.0.10 changed


class RefTransLayer(nn.Module):
    def __init__(self, dim: int = 512, version: str = "0.0.14") -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = RefNystrom(dim, dim // 8, 8, dim // 2, version=version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class RefPPEG(nn.Module):
    def __init__(self, dim: int = 512) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, 7, 1, 3, groups=dim)
        self.proj1 = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj2 = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, side: int) -> torch.Tensor:
        b, _, c = x.shape
        cls_token, feat = x[:, 0], x[:, 1:]
        cnn = feat.transpose(1, 2).view(b, c, side, side)
        x = self.proj(cnn) + cnn + self.proj1(cnn) + self.proj2(cnn)
        return torch.cat((cls_token.unsqueeze(1), x.flatten(2).transpose(1, 2)), dim=1)


class RefTransMIL(nn.Module):
    def __init__(self, n_classes: int = 2, in_dim: int = 1024, version: str = "0.0.14") -> None:
        super().__init__()
        self.pos_layer = RefPPEG(512)
        self._fc1 = nn.Sequential(nn.Linear(in_dim, 512), nn.ReLU())
        self.cls_token = nn.Parameter(torch.randn(1, 1, 512))
        self.layer1, self.layer2 = RefTransLayer(512, version), RefTransLayer(512, version)
        self.norm = nn.LayerNorm(512)
        self._fc2 = nn.Linear(512, n_classes)

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        h = self._fc1(data.float())
        side = int(np.ceil(np.sqrt(h.shape[1])))
        h = torch.cat([h, h[:, : side * side - h.shape[1], :]], dim=1)
        h = torch.cat((self.cls_token.expand(h.shape[0], -1, -1), h), dim=1)
        h = self.layer2(self.pos_layer(self.layer1(h), side))
        return self._fc2(self.norm(h)[:, 0])


# ----------------------------------------------------------------------------------------------- CLAM
class RefAttnNetGated(nn.Module):
    def __init__(self, L: int = 512, D: int = 256, n_classes: int = 1) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(L, D), nn.Tanh(), nn.Dropout(0.25))
        self.attention_b = nn.Sequential(nn.Linear(L, D), nn.Sigmoid(), nn.Dropout(0.25))
        self.attention_c = nn.Linear(D, n_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention_c(self.attention_a(x).mul(self.attention_b(x))), x


class RefCLAM(nn.Module):
    """CLAM_SB (multi_branch False) or CLAM_MB at size "small", gated, dropout 0.25; `instance_loss_fn`
    as core_utils.train builds it (nn.CrossEntropyLoss(), or SmoothTop1SVM(n_classes = 2))."""

    def __init__(
        self, n_classes: int = 2, embed_dim: int = 1024, *, multi_branch: bool, subtyping: bool,
        instance_loss_fn: Any = F.cross_entropy,
    ) -> None:  # fmt: skip
        super().__init__()
        branches = n_classes if multi_branch else 1
        self.attention_net = nn.Sequential(
            nn.Linear(embed_dim, 512), nn.ReLU(), nn.Dropout(0.25), RefAttnNetGated(512, 256, branches)
        )
        if multi_branch:
            self.classifiers: nn.Module = nn.ModuleList([nn.Linear(512, 1) for _ in range(n_classes)])
        else:
            self.classifiers = nn.Linear(512, n_classes)
        self.instance_classifiers = nn.ModuleList([nn.Linear(512, 2) for _ in range(n_classes)])
        self.k_sample, self.n_classes, self.subtyping, self.mb = 8, n_classes, subtyping, multi_branch
        self.instance_loss_fn = instance_loss_fn

    def forward(
        self, h: torch.Tensor, label: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (N, D), label (1,) -> (logits (1, C), A_raw (K, N), instance loss)."""
        a, h = self.attention_net(h)
        a_raw = torch.transpose(a, 1, 0)
        a = F.softmax(a_raw, dim=1)
        total = 0.0
        inst_labels = F.one_hot(label, num_classes=self.n_classes).squeeze()
        for i, classifier in enumerate(self.instance_classifiers):
            branch = a[i] if self.mb else a
            branch = branch.view(1, -1)
            top_p = torch.index_select(h, 0, torch.topk(branch, self.k_sample)[1][-1])
            if inst_labels[i].item() == 1:
                top_n = torch.index_select(h, 0, torch.topk(-branch, self.k_sample, dim=1)[1][-1])
                targets = torch.cat([torch.ones(self.k_sample), torch.zeros(self.k_sample)]).long()
                total += self.instance_loss_fn(classifier(torch.cat([top_p, top_n])), targets)
            elif self.subtyping:
                total += self.instance_loss_fn(classifier(top_p), torch.zeros(self.k_sample).long())
        if self.subtyping:
            total /= len(self.instance_classifiers)
        m = torch.mm(a, h)
        if self.mb:
            logits = torch.empty(1, self.n_classes)
            for c in range(self.n_classes):
                logits[0, c] = self.classifiers[c](m[c])
        else:
            logits = self.classifiers(m)
        return logits, a_raw, total  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- DSMIL
class RefFCLayer(nn.Module):
    def __init__(self, in_size: int, out_size: int = 1) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(in_size, out_size))

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return feats, self.fc(feats)


class RefBClassifier(nn.Module):
    def __init__(
        self, input_size: int, output_class: int, dropout_v: float = 0.0, passing_v: bool = False
    ) -> None:
        super().__init__()
        self.q = nn.Sequential(nn.Linear(input_size, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh())
        self.v: nn.Module = (
            nn.Sequential(nn.Dropout(dropout_v), nn.Linear(input_size, input_size), nn.ReLU())
            if passing_v else nn.Identity()
        )  # fmt: skip
        self.fcc = nn.Conv1d(output_class, output_class, kernel_size=input_size)

    def forward(self, feats: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v, q = self.v(feats), self.q(feats).view(feats.shape[0], -1)
        _, m_indices = torch.sort(c, 0, descending=True)
        q_max = self.q(torch.index_select(feats, dim=0, index=m_indices[0, :]))
        a = F.softmax(
            torch.mm(q, q_max.transpose(0, 1)) / torch.sqrt(torch.tensor(q.shape[1], dtype=torch.float32)), 0
        )
        b = torch.mm(a.transpose(0, 1), v).view(1, a.shape[1], -1)
        return self.fcc(b).view(1, -1), a


class RefMILNet(nn.Module):
    def __init__(
        self, feats_size: int = 512, num_classes: int = 2, dropout_v: float = 0.0, passing_v: bool = False
    ) -> None:
        super().__init__()
        self.i_classifier = RefFCLayer(feats_size, num_classes)
        self.b_classifier = RefBClassifier(feats_size, num_classes, dropout_v, passing_v)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feats, classes = self.i_classifier(x)
        prediction_bag, a = self.b_classifier(feats, classes)
        return classes, prediction_bag, a

    def loss(self, x: torch.Tensor, bag_label: torch.Tensor) -> torch.Tensor:
        """train_tcga.train: 0.5 * BCE(bag) + 0.5 * BCE(max instance), bag_label one-hot (1, C)."""
        ins, bag, _ = self(x)
        max_prediction, _ = torch.max(ins, 0)
        crit = nn.BCEWithLogitsLoss()
        return 0.5 * crit(bag.view(1, -1), bag_label.view(1, -1)) + 0.5 * crit(
            max_prediction.view(1, -1), bag_label.view(1, -1)
        )


# ------------------------------------------------------------------------------------------- DTFD-MIL
class RefClassifier1fc(nn.Module):
    def __init__(self, n_channels: int, n_classes: int, droprate: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(n_channels, n_classes)
        self.droprate = droprate
        if droprate != 0.0:
            self.dropout = nn.Dropout(p=droprate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.droprate != 0.0:
            x = self.dropout(x)
        return self.fc(x)


class RefAttentionGated(nn.Module):
    def __init__(self, L: int = 512, D: int = 128, K: int = 1) -> None:
        super().__init__()
        self.attention_V = nn.Sequential(nn.Linear(L, D), nn.Tanh())
        self.attention_U = nn.Sequential(nn.Linear(L, D), nn.Sigmoid())
        self.attention_weights = nn.Linear(D, K)

    def forward(self, x: torch.Tensor, is_norm: bool = True) -> torch.Tensor:
        a = torch.transpose(self.attention_weights(self.attention_V(x) * self.attention_U(x)), 1, 0)
        return F.softmax(a, dim=1) if is_norm else a


class RefAttentionWithClassifier(nn.Module):
    def __init__(self, L: int = 512, num_cls: int = 2, droprate: float = 0.0) -> None:
        super().__init__()
        self.attention = RefAttentionGated(L, 128, 1)
        self.classifier = RefClassifier1fc(L, num_cls, droprate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.mm(self.attention(x), x))


class RefDimReduction(nn.Module):
    def __init__(self, n_channels: int, m_dim: int = 512) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_channels, m_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x))


class RefDTFD(nn.Module):
    """The four modules of Main_DTFD_MIL.main under the names its checkpoint uses."""

    def __init__(
        self, in_chn: int = 1024, m_dim: int = 512, num_cls: int = 2, droprate: float = 0.0,
        droprate_2: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.classifier = RefClassifier1fc(m_dim, num_cls, droprate)
        self.attention = RefAttentionGated(m_dim)
        self.dim_reduction = RefDimReduction(in_chn, m_dim)
        self.att_classifier = RefAttentionWithClassifier(m_dim, num_cls, droprate_2)

    def tiers(self, tfeat: torch.Tensor, chunks: list[list[int]], distill: str, per_group: int = 1):
        """One bag's (sub-predictions (G, C), distilled features) for a given split (training path)."""
        subs, pseudo = [], []
        for tindex in chunks:
            tmid = self.dim_reduction(torch.index_select(tfeat, 0, torch.LongTensor(tindex)))
            taa = self.attention(tmid).squeeze(0)
            tatt = torch.einsum("ns,n->ns", tmid, taa)
            tatt_tensor = torch.sum(tatt, dim=0).unsqueeze(0)
            subs.append(self.classifier(tatt_tensor))
            tweight = list(self.classifier.parameters())[-2]  # get_cam_1d
            cam = torch.einsum("bgf,cf->bcg", [tatt.unsqueeze(0), tweight]).squeeze(0)
            soft = torch.softmax(torch.transpose(cam, 0, 1), dim=1)
            _, sort_idx = torch.sort(soft[:, -1], descending=True)
            top, bottom = sort_idx[:per_group].long(), sort_idx[-per_group:].long()
            if distill == "MaxMinS":
                pseudo.append(tmid.index_select(0, torch.cat([top, bottom])))
            elif distill == "MaxS":
                pseudo.append(tmid.index_select(0, top))
            else:
                pseudo.append(tatt_tensor)
        return torch.cat(subs), torch.cat(pseudo)

    def split(self, n: int, groups: int, seed: int) -> list[list[int]]:
        idx = list(range(n))
        np.random.default_rng(seed).shuffle(idx)
        return [c.tolist() for c in np.array_split(np.array(idx), groups)]

    def losses(self, tfeat: torch.Tensor, label: torch.Tensor, chunks: list[list[int]], distill: str):
        """(loss0, loss1, tier-2 logits) of train_attention_preFeature_DTFD for one bag and split."""
        subs, pseudo = self.tiers(tfeat, chunks, distill)
        loss0 = F.cross_entropy(subs, label.repeat(len(chunks)), reduction="none").mean()
        pred = self.att_classifier(pseudo)
        return loss0, F.cross_entropy(pred, label, reduction="none").mean(), pred
