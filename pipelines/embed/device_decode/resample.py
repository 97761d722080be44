"""Windows -> tiles on the device, with the arithmetic of PIL: copy, k x k block means, or resampling.

`Slide.read_region_um` resizes with PIL (`Image.reduce`, `Image.resize(box=..., resample=filter)`); the
device decoder must give the same pixels, so PIL's resampling coefficients (precompute_coeffs in
Pillow's Resample.c) are rebuilt here as batched weight matrices and applied with two matmuls,
horizontal first like PIL. Which of the three a tile gets is its `wsi.slides.region.RegionPlan`'s kind.

Public API:
  finish_tiles(canvas (G,R,S,3) uint8, kind, k, filt, p, box (G,3), win (G,4)) -> (G,P,P,3) uint8
  pil_weights(start, side, in_size, out, n, filt) -> (G, out, n) float32
  to_device(array, device) -> Tensor   small host array to the device without a host synchronisation
"""

from __future__ import annotations

import numpy as np
import torch

from wsi.slides.region import RegionKind

#: PIL resampling filters by name: support in input px at scale 1
_SUPPORT = {"BOX": 0.5, "BILINEAR": 1.0, "BICUBIC": 2.0}


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on the device without a host synchronisation (pinned, non-blocking on CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def finish_tiles(
    canvas: torch.Tensor, kind: int, k: int, filt: str, p: int, box: np.ndarray, win: np.ndarray
) -> torch.Tensor:
    """(G, R, S, 3) uint8 windows -> (G, P, P, 3) uint8 tiles, all of one plan kind.

    box (G, 3) bx, by, side and win (G, 4) ix, iy, n_w, n_h are the plans' (used by RESAMPLE only).
    """
    if kind == RegionKind.COPY:
        return canvas
    g, device = canvas.shape[0], canvas.device
    if kind == RegionKind.REDUCE:
        blocks = canvas.reshape(g, p, k, p, k, 3).float().mean(dim=(2, 4))  # (G, P, P, 3)
        return blocks.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)

    def weights(axis: int, n: int) -> torch.Tensor:  # (G, P, n); regions share few distinct boxes
        keys = np.stack([box[:, axis], box[:, 2], win[:, 2 + axis]], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        u = to_device(uniq.astype(np.float32), device)  # (U, 3) start, side, input size
        return pil_weights(u[:, 0], u[:, 1], u[:, 2], p, n, filt)[to_device(inv.reshape(-1), device)]

    wy = weights(1, canvas.shape[1])  # (G, P, R)
    wx = weights(0, canvas.shape[2])  # (G, P, S)
    x = canvas.permute(0, 3, 1, 2).float()  # (G, 3, R, S)
    x = x @ wx.transpose(1, 2)[:, None]  # horizontal first, like PIL: (G, 3, R, P)
    x = wy[:, None] @ x  # (G, 3, P, P)
    x = x.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous()  # (G, P, P, 3) like the CPU path (channels_last downstream)


def pil_weights(
    start: torch.Tensor, side: torch.Tensor, in_size: torch.Tensor, out: int, n: int, filt: str
) -> torch.Tensor:
    """(G, out, n) float32 rows of PIL's resampling coefficients (precompute_coeffs in Resample.c) for
    boxes [start, start + side) of inputs `in_size` px long (columns beyond it weigh 0)."""
    dev = start.device
    scale = side / out  # (G,)
    filterscale = torch.clamp(scale, min=1.0)[:, None, None]  # (G, 1, 1)
    support = _SUPPORT[filt] * filterscale
    o = torch.arange(out, device=dev, dtype=torch.float32)[None, :, None]  # (1, out, 1)
    center = start[:, None, None] + (o + 0.5) * scale[:, None, None]  # (G, out, 1)
    xmin = torch.clamp(torch.trunc(center - support + 0.5), min=0)
    xmax = torch.minimum(torch.trunc(center + support + 0.5), in_size[:, None, None])
    i = torch.arange(n, device=dev, dtype=torch.float32)[None, None]  # (1, 1, n)
    d = (i + 0.5 - center) / filterscale  # (G, out, n) distance in filter units
    if filt == "BOX":
        w = ((d > -0.5) & (d <= 0.5)).float()
    elif filt == "BILINEAR":
        w = torch.clamp(1.0 - d.abs(), min=0.0)
    else:  # BICUBIC, a = -0.5
        a, x = -0.5, d.abs()
        near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
        w = torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))
    w = w * ((i >= xmin) & (i < xmax))
    total = w.sum(dim=2, keepdim=True)
    return w / torch.where(total == 0, torch.ones_like(total), total)
