"""Stain normalisation before the encoder: Macenko and Reinhard as batched torch ops on the tiles' device.

Multi-centre cohorts differ in stain; mapping every tile onto one reference appearance before the encoder
removes part of that difference (opt-in: foundation models are trained to be robust to it). Both methods
run per tile on a (B, H, W, 3) uint8 batch wherever the batch lives, so they slot between the decode and
the encoders of the embed stage.

A tile whose fit is degenerate (background only, a pen mark of one colour, too little tissue) is passed
through unchanged and counted: never a NaN, never a crash. The counts go into the bag's provenance.

Why our own code and not torchstain: torchstain (EIDOSLAB/torchstain) normalises one image at a time and
fails on tiles without tissue (EIDOSLAB/torchstain#54: "kthvalue(): Expected reduction dim 0 to have
non-zero size"); a batch of 256 tiles per call on the GPU and a per-tile fallback are what the embed stage
needs, and the methods are ~150 lines of tensor algebra.

Public API:
  StainReference (config: method, stain_matrix, max_concentrations, lab_mean, lab_std, source)
  DEFAULT_MACENKO, DEFAULT_REINHARD, default_reference(method)
  fit_reference(method, tiles) -> StainReference          tiles: (B,H,W,3) uint8 (pooled over all)
  load_reference(path) / save_reference(ref, path)         JSON, validated with wsi.core.config
  StainNormalizer(reference): __call__(tiles uint8) -> uint8, normalize(tiles) -> float RGB 0..255,
      apply(tiles) -> (uint8, fitted (B,) bool, on the device, counters untouched),
      .n_tiles, .n_fallback, provenance() -> dict
  StainReference.digest() -> sha256 of its numbers (the bag records it)
  macenko_stains(tiles) -> (stain_matrix (B,3,2), max_conc (B,2), ok (B,));  rgb_to_lab, lab_to_rgb
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, TypedDict

import torch
from pydantic import Field

from wsi.core.config import config_dict, config_model, parse_config
from wsi.core.errors import ConfigError
from wsi.core.files import write_json_atomic
from wsi.core.json_types import JsonObject
from wsi.core.user_text import load_json_file

IO = 240.0  # transmitted light of an empty glass (Macenko et al. 2009)
BETA = 0.15  # optical density below which a channel is background
ALPHA = 1.0  # percentile of the stain angles taken as the pure stains
MIN_TISSUE_PX = 64  # fewer tissue pixels than this: no stable fit
FIT_PX = 8192  # pixels per tile used to fit (strided subsample): quantiles stay cheap and exact enough


# Optical densities and concentrations are small positive numbers (0-3), CIELAB within +-128; the
# bounds only keep the arithmetic finite, `_degenerate` says what a usable reference is.
_Od = Annotated[float, Field(ge=-1e3, le=1e3)]
_Lab = Annotated[float, Field(ge=-1e3, le=1e3)]


@config_model
@dataclass(frozen=True)
class StainReference:
    """The appearance tiles are mapped onto; fields unused by a method stay None."""

    method: Literal["macenko", "reinhard"]
    stain_matrix: tuple[tuple[_Od, _Od], tuple[_Od, _Od], tuple[_Od, _Od]] | None = None  # (3, 2)
    max_concentrations: tuple[_Od, _Od] | None = None  # 99th percentile of H and E concentrations
    lab_mean: tuple[_Lab, _Lab, _Lab] | None = None  # CIELAB (D65) mean of tissue pixels
    lab_std: tuple[_Lab, _Lab, _Lab] | None = None  # CIELAB standard deviation of tissue pixels
    source: str = ""  # where the reference came from (default, or the tiles it was fitted on)

    def __post_init__(self) -> None:
        if self.method == "macenko" and (self.stain_matrix is None or self.max_concentrations is None):
            raise ConfigError("a macenko stain reference needs stain_matrix and max_concentrations")
        if self.method == "reinhard" and (self.lab_mean is None or self.lab_std is None):
            raise ConfigError("a reinhard stain reference needs lab_mean and lab_std")
        problem = self._degenerate()
        if problem:
            where = f" ({self.source})" if self.source else ""
            raise ConfigError(
                f"stain reference{where} is unusable: {problem}; every tile would be mapped onto it and "
                "look alike. Fit it again on tissue (--stain-reference image.png) or use the default"
            )

    def _degenerate(self) -> str:
        """Why the numbers cannot be a stain appearance ("" when they can): NaN, zero or negative optical
        densities, one stain twice, a zero spread. An all-zero matrix maps every tile to one colour."""
        if self.method == "macenko":
            stains = [tuple(row[j] for row in self.stain_matrix or ()) for j in (0, 1)]  # two OD vectors
            conc = self.max_concentrations or ()
            if not all(math.isfinite(v) for v in (*stains[0], *stains[1], *conc)):
                return "stain_matrix or max_concentrations holds NaN or infinite values"
            norms = [math.sqrt(sum(v * v for v in s)) for s in stains]
            if min(norms) < 1e-3 or any(v < 0 for s in stains for v in s):
                return "each stain_matrix column must be a non-negative optical-density vector of length ~1"
            cos = sum(a * b for a, b in zip(*stains, strict=True)) / (norms[0] * norms[1])
            if cos > 0.9995:  # under ~2 degrees apart: the 3x2 matrix has rank 1
                return "the two stain vectors are (nearly) the same colour: the matrix has rank 1"
            if min(conc) <= 0:
                return "max_concentrations must be positive"
        else:
            values = (*(self.lab_mean or ()), *(self.lab_std or ()))
            if not all(math.isfinite(v) for v in values):
                return "lab_mean or lab_std holds NaN or infinite values"
            if min(self.lab_std or (0.0,)) <= 1e-3:
                return "lab_std must be positive (a zero spread maps every pixel to the mean colour)"
            if not 0.0 <= (self.lab_mean or (0.0,))[0] <= 100.0:
                return "lab_mean's lightness L must lie in 0..100"
        return ""

    def digest(self) -> str:
        """sha256 of the numbers tiles are mapped onto (`source` is a note and left out)."""
        data = {k: v for k, v in config_dict(self).items() if k != "source"}
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The H&E reference of Macenko's reference implementation, used by torchstain and staintools alike.
DEFAULT_MACENKO = StainReference(
    method="macenko",
    stain_matrix=((0.5626, 0.2159), (0.7201, 0.8012), (0.4062, 0.5581)),
    max_concentrations=(1.9705, 1.0308),
    source="default: the H&E reference of Macenko et al.'s reference implementation",
)
# fit_reference("reinhard", tiles) on the 20 tiles (256 um at 1 um/px) of CMU-1-Small-Region.svs
# (OpenSlide test data, CC0; ../shared/data/slides), their non-glass pixels pooled.
DEFAULT_REINHARD = StainReference(
    method="reinhard",
    lab_mean=(46.92, 27.80, -12.90),
    lab_std=(19.03, 11.92, 8.24),
    source="default: CMU-1-Small-Region.svs tissue tiles (OpenSlide test data, CC0)",
)


def default_reference(method: str) -> StainReference:
    if method == "macenko":
        return DEFAULT_MACENKO
    if method == "reinhard":
        return DEFAULT_REINHARD
    raise ConfigError(f"--stain-norm {method!r} unknown; choose macenko or reinhard")


def load_reference(path: str | Path) -> StainReference:
    path = Path(path)
    data = load_json_file(path, what="stain reference")  # NaN is read, and refused by its field
    try:
        return parse_config(StainReference, data, source=str(path))
    except ConfigError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith(str(path)) else f"{path}: {text}") from None


def save_reference(reference: StainReference, path: str | Path) -> None:
    write_json_atomic(Path(path), config_dict(reference))


# ----------------------------------------------------------------------------------------- helpers
def _pixels(tiles: torch.Tensor) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, N, 3) float32 in 0..255."""
    if tiles.ndim != 4 or tiles.shape[-1] != 3:
        raise ValueError(f"expected (B, H, W, 3) RGB tiles, got shape {tuple(tiles.shape)}")
    return tiles.reshape(tiles.shape[0], -1, 3).float()


def _od(rgb: torch.Tensor) -> torch.Tensor:
    return -torch.log((rgb + 1.0) / IO)  # optical density, (B, N, 3)


def _tissue(od: torch.Tensor) -> torch.Tensor:
    return (od > BETA).all(dim=-1)  # (B, N): every channel absorbs: stained enough to fit stains on


def _not_glass(od: torch.Tensor) -> torch.Tensor:
    return (od > BETA).any(dim=-1)  # (B, N): some absorption: tissue, faint eosin included


def _subsample(x: torch.Tensor, n: int = FIT_PX) -> torch.Tensor:
    step = max(1, x.shape[1] // n)
    return x[:, ::step]


def _masked_quantile(x: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Quantile over dim 1 of the masked entries; NaN where a row has none."""
    return torch.nanquantile(torch.where(mask, x, torch.nan), q, dim=1)


# ---------------------------------------------------------------------------------------- macenko
def macenko_stains(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per tile: stain matrix (B, 3, 2) [H, E] unit OD vectors, max concentrations (B, 2), ok (B,) bool."""
    od = _subsample(_od(_pixels(tiles)))  # (B, n, 3)
    return _macenko_fit(od, _tissue(od))


def _macenko_fit(od: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = mask.to(od.dtype).unsqueeze(-1)  # (B, n, 1)
    count = w.sum(dim=1)  # (B, 1)
    mean = (od * w).sum(dim=1) / count.clamp(min=1)  # (B, 3)
    centred = (od - mean.unsqueeze(1)) * w
    cov = centred.transpose(1, 2) @ centred / (count.unsqueeze(-1) - 1).clamp(min=1)  # (B, 3, 3)
    cov = torch.nan_to_num(cov) + 1e-9 * torch.eye(3, device=od.device)  # eigh needs finite input
    _, vecs = torch.linalg.eigh(cov)  # ascending eigenvalues
    plane = vecs[..., 1:]  # (B, 3, 2): the two largest, spanning the stains
    plane = plane * torch.where(plane.sum(dim=1, keepdim=True) < 0, -1.0, 1.0)  # point into positive OD
    proj = od @ plane  # (B, n, 2)
    phi = torch.atan2(proj[..., 1], proj[..., 0])  # (B, n)
    lo = _masked_quantile(phi, mask, ALPHA / 100)
    hi = _masked_quantile(phi, mask, 1 - ALPHA / 100)
    v_lo = (plane @ torch.stack([lo.cos(), lo.sin()], dim=-1).unsqueeze(-1)).squeeze(-1)  # (B, 3)
    v_hi = (plane @ torch.stack([hi.cos(), hi.sin()], dim=-1).unsqueeze(-1)).squeeze(-1)
    h_first = (v_lo[:, 0] > v_hi[:, 0]).unsqueeze(-1)  # haematoxylin absorbs more red light
    stains = torch.stack([torch.where(h_first, v_lo, v_hi), torch.where(h_first, v_hi, v_lo)], dim=-1)
    conc = od @ torch.linalg.pinv(torch.nan_to_num(stains)).transpose(1, 2)  # (B, n, 2)
    max_conc = torch.quantile(conc, 0.99, dim=1)  # all pixels, as Macenko's reference code
    cos = torch.nn.functional.cosine_similarity(stains[..., 0], stains[..., 1], dim=-1)
    ok = (
        (count.squeeze(-1) >= MIN_TISSUE_PX)
        & torch.isfinite(stains).all(dim=(1, 2))
        & (stains > -0.05).all(dim=(1, 2))  # a stain absorbs: no negative optical density
        & (cos < 0.995)  # two distinct stains, not one colour (a pen line, a bubble)
        & torch.isfinite(max_conc).all(dim=-1)
        & (max_conc > 1e-3).all(dim=-1)
    )
    return stains, max_conc, ok


# --------------------------------------------------------------------------------------- reinhard
_RGB_TO_XYZ = torch.tensor(
    [[0.412453, 0.357580, 0.180423], [0.212671, 0.715160, 0.072169], [0.019334, 0.119193, 0.950227]]
)  # sRGB (D65) -> XYZ, as scikit-image's rgb2lab
_WHITE = torch.tensor([0.95047, 1.0, 1.08883])  # D65 reference white


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """(..., 3) RGB in 0..255 -> CIELAB (D65, 2 degree observer)."""
    c = rgb / 255.0
    lin = torch.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = lin @ _RGB_TO_XYZ.to(rgb.device).T / _WHITE.to(rgb.device)
    f = torch.where(xyz > 0.008856, xyz.clamp(min=1e-12) ** (1 / 3), 7.787 * xyz + 16 / 116)
    return torch.stack(
        [116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1
    )


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """CIELAB -> RGB in 0..255 (not clipped)."""
    fy = (lab[..., 0] + 16) / 116
    f = torch.stack([fy + lab[..., 1] / 500, fy, fy - lab[..., 2] / 200], dim=-1)
    xyz = torch.where(f > 0.2068966, f**3, (f - 16 / 116) / 7.787) * _WHITE.to(lab.device)
    lin = xyz @ torch.linalg.inv(_RGB_TO_XYZ).to(lab.device).T
    c = torch.where(lin > 0.0031308, 1.055 * lin.clamp(min=0) ** (1 / 2.4) - 0.055, 12.92 * lin)
    return c * 255.0


def _lab_stats(lab: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = mask.to(lab.dtype).unsqueeze(-1)  # (B, N, 1)
    n = w.sum(dim=1).clamp(min=1)
    mean = (lab * w).sum(dim=1) / n  # (B, 3)
    std = (((lab - mean.unsqueeze(1)) ** 2 * w).sum(dim=1) / n).sqrt()
    return mean, std


# ------------------------------------------------------------------------------------- normaliser
class StainProvenance(TypedDict):
    """What a normaliser says about its work (names as in BagProvenance)."""

    stain_norm: str  # the method
    stain_reference: JsonObject  # the reference, as config JSON
    stain_tiles: int  # tiles seen
    stain_fallback_tiles: int  # of those, left as they were (no stable fit)


class StainNormalizer:
    """Maps tiles onto a reference, per tile, on the tiles' device; counts the tiles it had to leave alone."""

    def __init__(self, reference: StainReference) -> None:
        self.reference = reference
        self.n_tiles = 0
        self.n_fallback = 0

    def __call__(self, tiles: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> (B, H, W, 3) uint8, normalised (degenerate tiles unchanged)."""
        return self.normalize(tiles).round_().to(torch.uint8)

    def normalize(self, tiles: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> float RGB in 0..255 (clipped), same shape."""
        out, ok = self._normalize(tiles)
        self.n_tiles += int(ok.numel())
        self.n_fallback += int((~ok).sum())
        return out

    def apply(self, tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, W, 3) uint8 -> (normalised uint8 tiles, fitted (B,) bool on the tiles' device).

        Without a host synchronisation (the counters are not touched): the embed stage keeps `fitted`
        on the device and counts a slide's fallback tiles once, among the tiles that were readable.
        """
        out, ok = self._normalize(tiles)
        return out.round_().to(torch.uint8), ok

    def _normalize(self, tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rgb = _pixels(tiles)  # (B, N, 3)
        if self.reference.method == "macenko":
            out, ok = self._macenko(rgb)
        else:
            out, ok = self._reinhard(rgb)
        out = torch.where(ok.view(-1, 1, 1), out.clamp(0.0, 255.0), rgb)  # fallback: the tile as it was
        return out.reshape(tiles.shape), ok

    def _macenko(self, rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        od = _od(rgb)
        fit = _subsample(od)
        stains, max_conc, ok = _macenko_fit(fit, _tissue(fit))
        ref = self.reference
        ref_stains = torch.tensor(ref.stain_matrix, dtype=od.dtype, device=od.device)  # (3, 2)
        ref_max = torch.tensor(ref.max_concentrations, dtype=od.dtype, device=od.device)  # (2,)
        safe = torch.where(ok.view(-1, 1, 1), stains, ref_stains)  # keep degenerate tiles finite
        conc = od @ torch.linalg.pinv(safe).transpose(1, 2)  # (B, N, 2)
        scale = torch.where(ok.unsqueeze(-1), ref_max / max_conc.clamp(min=1e-6), 1.0)
        out = IO * torch.exp(-(conc * scale.unsqueeze(1)) @ ref_stains.T) - 1.0  # inverse of _od
        return torch.nan_to_num(out), ok

    def _reinhard(self, rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lab = rgb_to_lab(rgb)
        mask = _not_glass(_od(rgb))
        mean, std = _lab_stats(lab, mask)
        ref = self.reference
        ref_mean = torch.tensor(ref.lab_mean, dtype=lab.dtype, device=lab.device)
        ref_std = torch.tensor(ref.lab_std, dtype=lab.dtype, device=lab.device)
        ok = (mask.sum(dim=1) >= MIN_TISSUE_PX) & (std > 1e-2).all(dim=-1)
        scale = torch.where(ok.unsqueeze(-1), ref_std / std.clamp(min=1e-2), 1.0)  # (B, 3)
        mapped = (lab - mean.unsqueeze(1)) * scale.unsqueeze(1) + ref_mean
        out = torch.where(mask.unsqueeze(-1), lab_to_rgb(mapped), rgb)  # glass stays glass
        return torch.nan_to_num(out), ok

    def provenance(self) -> StainProvenance:
        return {
            "stain_norm": self.reference.method,
            "stain_reference": config_dict(self.reference),
            "stain_tiles": self.n_tiles,
            "stain_fallback_tiles": self.n_fallback,
        }


def fit_reference(method: str, tiles: torch.Tensor, *, source: str = "fitted") -> StainReference:
    """One reference from a set of tiles, pooled: the tissue pixels of all tiles as one image."""
    default_reference(method)  # validates the name
    rgb = _subsample(_pixels(tiles), FIT_PX).reshape(1, -1, 3)  # (1, B*n, 3)
    od = _od(rgb)
    mask = _not_glass(od) if method == "reinhard" else _tissue(od)
    if int(mask.sum()) < MIN_TISSUE_PX:
        raise ConfigError(f"cannot fit a {method} reference: the tiles hold {int(mask.sum())} tissue pixels")
    if method == "reinhard":
        mean, std = _lab_stats(rgb_to_lab(rgb), mask)
        return StainReference(
            method="reinhard", lab_mean=_three(mean[0]), lab_std=_three(std[0]), source=source
        )
    stains, max_conc, ok = _macenko_fit(od, mask)
    if not bool(ok[0]):
        raise ConfigError("cannot fit a macenko reference: the tiles show fewer than two distinct stains")
    rows = [_two(row) for row in stains[0]]
    return StainReference(
        method="macenko",
        stain_matrix=(rows[0], rows[1], rows[2]),
        max_concentrations=_two(max_conc[0]),
        source=source,
    )


def _two(t: torch.Tensor) -> tuple[float, float]:
    a, b = (round(float(v), 5) for v in t)
    return a, b


def _three(t: torch.Tensor) -> tuple[float, float, float]:
    a, b, c = (round(float(v), 5) for v in t)
    return a, b, c


__all__ = [
    "DEFAULT_MACENKO",
    "DEFAULT_REINHARD",
    "StainNormalizer",
    "StainReference",
    "default_reference",
    "fit_reference",
    "lab_to_rgb",
    "load_reference",
    "macenko_stains",
    "rgb_to_lab",
    "save_reference",
]
