"""Which colour space a JPEG stream holds, and the exact YCbCr -> RGB transform of libjpeg-turbo.

Why: a slide container (DICOM's PhotometricInterpretation, TIFF's Photometric tag) says how its JPEG
tiles are to be decoded, and readers that trust the container over the stream (openslide 4.0.1 for
DICOM and tiled TIFF: `cinfo->jpeg_color_space` is set from the container, openslide commit e8dccf0d,
src/openslide-vendor-dicom.c and src/openslide-decode-tiff.c) return the raw Y'CbCr samples as RGB when
a converter wrote JFIF (YCbCr) frames under `PhotometricInterpretation = RGB`: salmon and green tissue.

What a stream says (`stream_colour`), from its own markers, in libjpeg-turbo's order of precedence
(src/jdapimin.c `default_decompress_parms`, commit 8a99315): a JFIF APP0 segment means YCbCr (JFIF 1.02
requires YCbCr for three components); else an Adobe APP14 segment's transform flag (0 RGB, 1 YCbCr);
else component ids 'R','G','B' mean RGB. Unlike libjpeg-turbo, component ids 1, 2, 3 alone are NOT
taken as YCbCr: Aperio-style RGB tiles re-wrapped into DICOM carry ids 1, 2, 3 or 0, 1, 2 and no marker
(wsidicom commit 8574273, libdicom issue 80), and only the container can tell. Chroma subsampling is: a
stream whose second and third components are sampled more coarsely than the first holds luma and
chroma (no encoder subsamples G and B; libjpeg's `jpeg_set_colorspace(JCS_RGB)` samples all 1x1).
pydicom 3 conforms the same way (src/pydicom/pixels/decoders/base.py `_conform_jpg_colorspace`, commit
fb1f24e: JFIF / Adobe APP14 / 'RGB' ids against PhotometricInterpretation).

Public API:
  Colour = Literal["rgb", "ycbcr"]
  JpegHeader(components, jfif, adobe_transform)    from `parse_header(stream)` (None: not a JPEG header)
  stream_colour(header) -> (Colour | None, why)    None: the stream does not say; the container decides
  colour_to_decode(stream, container) -> Colour    the stream's declaration, else the container's
  libjpeg_colour(header) -> Colour                 libjpeg-turbo's own default (decoders that guess)
  ycbcr_to_rgb(pixels) -> (h, w, 3) uint8          bit-exact libjpeg-turbo conversion of decoded Y'CbCr
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Colour = Literal["rgb", "ycbcr"]

_SOI, _SOS, _EOI = 0xD8, 0xDA, 0xD9
_APP0, _APP14 = 0xE0, 0xEE
#: start-of-frame markers (SOF0-SOF15 less DHT C4, JPG C8 and DAC CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7: no length field
_RGB_IDS = ((82, 71, 66), (114, 103, 98))  # 'R','G','B' and 'r','g','b' (pydicom accepts both)


@dataclass(frozen=True)
class JpegHeader:
    """What a JPEG stream's header says about its components."""

    components: tuple[tuple[int, int, int], ...]  # (id, h, v sampling factor) per component, in SOF order
    jfif: bool  # a JFIF APP0 segment
    adobe_transform: int | None  # the Adobe APP14 segment's transform flag, None without one

    @property
    def chroma_subsampled(self) -> bool:
        """Components 2 and 3 sampled alike and more coarsely than component 1 (4:2:0, 4:2:2, 4:1:1)."""
        if len(self.components) != 3:
            return False
        (_, h0, v0), (_, h1, v1), (_, h2, v2) = self.components
        return (h1, v1) == (h2, v2) and h1 <= h0 and v1 <= v0 and (h1, v1) != (h0, v0)

    def sampling(self) -> str:
        """'2x2,1x1,1x1': the sampling factors, for a message."""
        return ",".join(f"{h}x{v}" for _, h, v in self.components)


def parse_header(stream: bytes) -> JpegHeader | None:
    """The markers before the first scan of a JPEG stream; None when it is not one or has no frame header.

    Only the stream's own segments count: a TIFF's shared JPEGTables carry tables, and libjpeg resets
    its JFIF/Adobe flags at each SOI (jdmarker.c `get_soi`).
    """
    data = memoryview(stream)
    if len(data) < 4 or data[0] != 0xFF or data[1] != _SOI:
        return None
    pos, jfif, adobe = 2, False, None
    components: tuple[tuple[int, int, int], ...] = ()
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None  # garbage between segments: not a header we can read
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (_SOS, _EOI):
            break
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        body = bytes(data[pos + 4 : pos + 2 + length])
        if marker == _APP0 and length >= 16 and body[:5] == b"JFIF\x00":
            jfif = True  # libjpeg's examine_app0: 14 data bytes at least
        elif marker == _APP14 and length >= 14 and body[:5] == b"Adobe":
            adobe = body[11]  # version (2), flags0 (2), flags1 (2), transform (1) after "Adobe"
        elif marker in _SOF and len(body) >= 6 and len(body) >= 6 + 3 * body[5]:
            comps = body[6 : 6 + 3 * body[5]]  # (id, h << 4 | v, table) per component
            components = tuple((c, hv >> 4, hv & 15) for c, hv in zip(comps[::3], comps[1::3], strict=True))
        pos += 2 + length
    if not components:
        return None
    return JpegHeader(components, jfif, adobe)


def stream_colour(header: JpegHeader) -> tuple[Colour | None, str]:
    """The colour space the stream itself declares, and why; (None, reason) when it declares none."""
    if len(header.components) != 3:
        return None, f"{len(header.components)} components"
    ids = tuple(c[0] for c in header.components)
    if header.jfif:
        return "ycbcr", "a JFIF APP0 marker"
    if header.adobe_transform == 0:
        return "rgb", "an Adobe APP14 marker with transform 0 (RGB)"
    if header.adobe_transform == 1:
        return "ycbcr", "an Adobe APP14 marker with transform 1 (YCbCr)"
    if ids in _RGB_IDS:
        return "rgb", "component ids 'R','G','B'"
    if header.chroma_subsampled:
        return "ycbcr", f"subsampled chroma ({header.sampling()})"
    return None, f"no colour marker, component ids {','.join(map(str, ids))}, sampling {header.sampling()}"


def colour_to_decode(stream: bytes, container: Colour) -> Colour:
    """What to decode a tile as: what its stream declares (`stream_colour`), else what the container
    says. For decoders told the colour space (an inserted Adobe marker, a `colorspace` argument)."""
    header = parse_header(stream)
    declared = stream_colour(header)[0] if header is not None else None
    return declared or container


def libjpeg_colour(header: JpegHeader) -> Colour:
    """libjpeg-turbo's default for a 3-component stream (jdapimin.c): what a decoder that is not told
    the colour space (Pillow, torchvision, imagecodecs without `colorspace`) decodes it as."""
    if header.jfif:
        return "ycbcr"
    if header.adobe_transform is not None:
        return "rgb" if header.adobe_transform == 0 else "ycbcr"
    return "rgb" if tuple(c[0] for c in header.components) == _RGB_IDS[0] else "ycbcr"


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """libjpeg-turbo's build_ycc_rgb_table (jdcolor.c), 16-bit fixed point, as lookup tables: R and B of
    every (Y, Cr) and (Y, Cb) pair, range-limited (uint8, 256 x 256), and the G offset of every (Cb, Cr)
    pair, (Cb_g[cb] + Cr_g[cr]) >> 16 (int16, 256 x 256), to add to Y."""
    x = np.arange(256, dtype=np.int64) - 128

    def fix(v: float) -> int:
        return int(v * (1 << 16) + 0.5)

    half = 1 << 15
    cr_r = (fix(1.40200) * x + half) >> 16
    cb_b = (fix(1.77200) * x + half) >> 16
    cb_g = -fix(0.34414) * x + half
    cr_g = -fix(0.71414) * x
    y = np.arange(256, dtype=np.int64)[:, None]
    r = np.clip(y + cr_r[None, :], 0, 255).astype(np.uint8).ravel()  # (y, cr)
    b = np.clip(y + cb_b[None, :], 0, 255).astype(np.uint8).ravel()  # (y, cb)
    g = ((cb_g[:, None] + cr_g[None, :]) >> 16).astype(np.int16).ravel()  # (cb, cr)
    return r, b, g


_R_OF_Y_CR, _B_OF_Y_CB, _G_OFFSET = _tables()


def ycbcr_to_rgb(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB of decoded (upsampled) Y'CbCr samples, equal to libjpeg-turbo's own conversion.

    Exact because the readers' output is libjpeg-turbo's upsampled planes: with fancy upsampling (the
    default, which openslide keeps) colour conversion is a separate per-pixel step (jdmaster.c
    `use_merged_upsample`), and this is that step's integer arithmetic (jdcolext.c `ycc_rgb_convert`).
    """
    y, cb, cr = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    out = np.empty((*pixels.shape[:-1], 3), np.uint8)
    y_hi = y.astype(np.uint16) << 8
    out[..., 0] = _R_OF_Y_CR.take(y_hi | cr)
    out[..., 2] = _B_OF_Y_CB.take(y_hi | cb)
    cb_cr = cb.astype(np.uint16) << 8
    cb_cr |= cr
    g = _G_OFFSET.take(cb_cr)
    g += y
    np.clip(g, 0, 255, out=g)
    out[..., 1] = g
    return out


__all__ = [
    "Colour",
    "JpegHeader",
    "colour_to_decode",
    "libjpeg_colour",
    "parse_header",
    "stream_colour",
    "ycbcr_to_rgb",
]
