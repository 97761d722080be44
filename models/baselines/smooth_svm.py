"""The smooth top-1 SVM loss CLAM's authors train their instance classifiers with (`inst_loss: svm`).

Berrada, Zisserman & Kumar, ICLR 2018 (arXiv:1802.07595), L_{k,tau} for k = 1 and scores s of class y:

    L(s, y) = tau * log sum_j exp((alpha [j != y] + s_j - s_y) / tau),

the log-sum-exp smoothing of the hard top-1 SVM; where the top score leads the second by at least
k tau log(thresh) the hard loss is used (equal there to float32 precision, and finite). Batch loss: the
mean over samples. Our own code, read from oval-group/smooth-topk @ 12c1645f187e (topk/svm.py
SmoothTop1SVM: alpha 1, tau 1, thresh 1e3; topk/functional.py; topk/utils.py), which CLAM installs
(mahmoodlab/CLAM env.yml @ 53e2409d4a81) and builds as `SmoothTop1SVM(n_classes = 2)`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: the authors' defaults: SmoothTop1SVM(n_classes, alpha=None -> 1, tau=1.), self.thresh = 1e3
ALPHA, TAU, THRESH = 1.0, 1.0, 1e3


def smooth_top1_svm(
    scores: Tensor, labels: Tensor, *, alpha: float = ALPHA, tau: float = TAU, thresh: float = THRESH
) -> Tensor:
    """Mean smooth top-1 SVM loss of scores (n, C), C >= 2, for classes `labels` (n,) int64."""
    scores = scores.float()
    classes = torch.arange(scores.shape[1], device=scores.device)
    margin = alpha * (classes[None, :] != labels[:, None]).to(scores.dtype)  # delta(y, labels, alpha)
    shifted = scores + margin - scores.gather(1, labels[:, None])
    top2 = scores.topk(2, dim=1).values
    hard = (top2[:, 0] - top2[:, 1]).detach() >= tau * math.log(thresh)  # detect_large, k = 1
    smooth = tau * torch.logsumexp(shifted / tau, dim=1)
    loss = torch.where(hard, shifted.max(1).values, smooth)
    return loss.sum() / scores.shape[0]


__all__ = ["ALPHA", "TAU", "THRESH", "smooth_top1_svm"]
