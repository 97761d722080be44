"""The smooth top-1 SVM loss CLAM's authors train their instance classifiers with (`inst_loss: svm`).

Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification", ICLR 2018
(arXiv:1802.07595): the smooth top-k SVM loss L_{k,tau}; for k = 1 and scores s of a sample of class y,

    L(s, y) = tau * log sum_j exp((alpha [j != y] + s_j - s_y) / tau),

the log-sum-exp smoothing of the hard top-1 SVM max_j (alpha [j != y] + s_j) - s_y. Where a sample's
top score leads its second by at least k tau log(thresh) the hard loss is used instead (the smooth one
equals it there to float32 precision, and its exponentials stay finite). The batch loss is the sum over
samples divided by their number.

Our own code, read from oval-group/smooth-topk @ 12c1645f187e (topk/svm.py SmoothTop1SVM: alpha None
-> 1, tau 1, thresh 1e3; topk/functional.py Top1_Smooth_SVM, Top1_Hard_SVM; topk/utils.py delta,
detect_large), the package CLAM's environment installs (mahmoodlab/CLAM env.yml @ 53e2409d4a81) and
CLAM builds as `SmoothTop1SVM(n_classes = 2)` in utils/core_utils.py (train, `inst_loss == 'svm'`).
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
