"""Device decode: raw JPEG tile bytes from the TIFF, decoded, assembled and resized on the device.

Why: on a GPU host the CPU path (openslide decodes JPEG tiles, PIL resizes, ~16 ms per tile per process)
caps embedding far below what the encoder does. Here reader workers only slice the compressed JPEG
tiles out of the file (a few kB each); the main process decodes a whole batch of them in one call
(`torchvision.io.decode_jpeg(list, device=...)`: nvjpeg on CUDA, libjpeg-turbo on the CPU - the same
code, so it is tested here), assembles each tile's level region with one gather and resizes it with the
same filters PIL uses in `Slide.read_region_um` (as batched weight matrices), without leaving the device.

Level choice and region arithmetic mirror `Slide.read_region_um` (same level, same box, same filter
choice), so tiles equal the CPU path within JPEG/resampling rounding. Parts outside the level are white.
A slide that is not a tiled 8-bit JPEG TIFF is read by the CPU path (the reader returns pixels), and a
JPEG tile that does not decode sends only the tiles that need it to `read_region_um` (and failing there,
they are counted as bad like on the CPU path). The first batch of every slide is checked against the
slide backend's pixels (channel means), so a decoder that gets the colour space wrong is caught: that
slide is then decoded by libjpeg-turbo (resized on the device), or failing that read by the CPU path.
Aperio's RGB (not YCbCr) JPEG tiles get an Adobe APP14 marker (transform 0) so decoders keep RGB.

Public API:
  RawSlideReader.open(st: SlideTiles) -> RawSlideReader | None   None: not a tiled JPEG TIFF (use the CPU)
  RawSlideReader.read(start, stop) -> RawBatch                    (runs in reader workers; picklable out)
  RawBatch                                                        compressed streams + per-tile plans
  DeviceDecoder(device).decode(raw) -> (tiles (b,P,P,3) uint8 on device, ok (b,) bool on the CPU)
  decode_ahead(batches, decoder, depth=2) -> Iterator[TileBatch]  raw batches decoded (CUDA: in a thread,
                                                                  on a side stream, depth batches ahead)
  complete_jpeg(tile, tables, rgb) -> bytes                       abbreviated TIFF JPEG -> full stream
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from wsi.slide import SNAP_TOLERANCE, _filter_for

if TYPE_CHECKING:
    from pipelines.embed.feed import SlideTiles, TileBatch
    from wsi.slide import Slide

log = logging.getLogger(__name__)

_JPEG = 7  # TIFF Compression tag value of "new-style" JPEG (Aperio, tifffile, libtiff)
_PHOTOMETRIC_RGB = 2
#: APP14 "Adobe" segment with transform 0: the three components are R, G, B (no YCbCr conversion).
#: Aperio writes RGB JPEG tiles with component ids 0, 1, 2 and no JFIF/Adobe marker, which decoders
#: otherwise take for YCbCr.
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
_SOI = b"\xff\xd8"
_WHITE = 255
#: per-channel mean difference (0-255) above which the device decode of a slide is judged wrong
_COLOUR_CHECK_MAX = 6.0
# kinds of region plans
_COPY, _REDUCE, _RESAMPLE = 0, 1, 2
#: PIL resampling filters by name: (support, function of distance in input px / filterscale)
_FILTERS = {"BOX": 0.5, "BILINEAR": 1.0, "BICUBIC": 2.0}


def complete_jpeg(tile: bytes, tables: bytes | None, rgb: bool) -> bytes:
    """A TIFF JPEG tile as a stand-alone JPEG stream.

    tables: the JPEGTables tag (SOI, DQT/DHT segments, EOI) of an abbreviated stream, spliced in after the
    tile's SOI. rgb: photometric RGB (not YCbCr): an Adobe APP14 marker with transform 0 is put first.
    """
    body = tile[2:]
    head = _SOI
    if rgb:
        head += _ADOBE_RGB
        if body[:2] == b"\xff\xe0" and body[4:9] == b"JFIF\x00":  # JFIF would mean YCbCr to decoders
            body = body[2 + int.from_bytes(body[2:4], "big") :]
    if tables and len(tables) > 4:
        head += tables[2:-2]  # strip the tables' own SOI and EOI
    return head + body


@dataclass(frozen=True)
class _Level:
    """The TIFF page holding one pyramid level, as raw tiles."""

    level: int
    width: int
    height: int
    tile_w: int
    tile_h: int
    offsets: np.ndarray  # (n_rows * n_cols,) int64 byte offsets, row-major
    counts: np.ndarray  # (n_rows * n_cols,) int64 byte counts
    tables: bytes | None
    rgb: bool

    @property
    def n_cols(self) -> int:
        return math.ceil(self.width / self.tile_w)


@dataclass
class RawBatch:
    """One batch of one slide as compressed JPEG streams plus the plan to turn them into tiles.

    Regions are read_region_um's windows in level px: window b starts at (ix, iy), is (n_w, n_h) px, and
    the output tile comes from it by `kind` (copy P x P, reduce k x k blocks, or resample box
    (bx, by, side) with `filt`). `table[b]` maps the JPEG grid cells the window touches (from its first
    cell (gx0, gy0)) to indices of the streams in `data`; -1 is white.
    """

    slide_path: str
    backend: str
    mpp: float
    size_um: float
    target_mpp: float
    tile_px: int
    coords_px: np.ndarray  # (B, 2) level-0 top-left (for the CPU fallback)
    level: int
    level_wh: tuple[int, int]
    tile_wh: tuple[int, int]
    data: torch.Tensor  # (total,) uint8: the complete JPEG streams back to back
    lengths: list[int]  # (J,) bytes of each stream; 0: unusable (missing or not a JPEG)
    cells: np.ndarray  # (J, 2) int64 (col, row) of each stream in the level's tile grid
    win: np.ndarray  # (B, 4) int64 ix, iy, n_w, n_h
    box: np.ndarray  # (B, 3) float64 bx, by, side
    kind: np.ndarray  # (B,) int64 _COPY | _REDUCE | _RESAMPLE
    factor: np.ndarray  # (B,) int64 k of _REDUCE
    filt: list[str] = field(default_factory=list)  # (B,) PIL filter name of _RESAMPLE
    grid0: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # (B, 2) gx0, gy0
    table: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 1), np.int64))  # (B, GH, GW)

    def pin_memory(self) -> RawBatch:  # called by DataLoader(pin_memory=True)
        return replace(self, data=self.data.pin_memory())

    def __len__(self) -> int:
        return len(self.coords_px)


class RawSlideReader:
    """Slices the compressed JPEG tiles of the level `read_region_um` would use out of a TIFF slide."""

    def __init__(self, st: SlideTiles, level: _Level, downsample: float, level_mpp: float) -> None:
        self.st = st
        self.lv = level
        self.ds = downsample
        self.level_mpp = level_mpp
        self._fd = os.open(st.slide_path, os.O_RDONLY)

    @classmethod
    def open(cls, st: SlideTiles) -> RawSlideReader | None:
        """A reader, or None when the level to read is not an 8-bit RGB tiled JPEG page (CPU path)."""
        from wsi.slide import _is_tiff, open_slide

        if not _is_tiff(Path(st.slide_path)):
            return None
        with open_slide(st.slide_path, backend=st.backend, mpp=st.mpp) as slide:
            level = slide.best_level_for_mpp(st.target_mpp)
            dims = slide.level_dimensions[level]
            ds, lmpp = slide.level_downsamples[level], slide.level_mpp(level)
        found = _find_jpeg_level(st.slide_path, level, dims)
        if found is None:
            log.info("%s: level %d is not a tiled JPEG page; reading it on the CPU", st.slide_path, level)
            return None
        return cls(st, found, ds, lmpp)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ plan
    def read(self, start: int, stop: int) -> RawBatch:
        st, lv = self.st, self.lv
        coords = st.coords_px[start:stop]
        b = len(coords)
        p = round(st.tile_size_um / st.target_mpp)
        side = st.tile_size_um / self.level_mpp
        win = np.zeros((b, 4), np.int64)
        box = np.zeros((b, 3), np.float64)
        kind = np.zeros(b, np.int64)
        factor = np.ones(b, np.int64)
        filt = [""] * b
        for j, (x0, y0) in enumerate(coords):
            lx, ly = int(x0) / self.ds, int(y0) / self.ds
            ix, iy = math.floor(lx + 1e-6), math.floor(ly + 1e-6)
            k = max(1, round(side / p))
            if abs(side - k * p) <= SNAP_TOLERANCE * side and lx - ix < 1e-3 and ly - iy < 1e-3:
                win[j] = (ix, iy, k * p, k * p)
                kind[j], factor[j] = (_COPY if k == 1 else _REDUCE), k
                continue
            n_w = math.ceil(lx - ix + side - 1e-6)
            n_h = math.ceil(ly - iy + side - 1e-6)
            bx, by = max(0.0, lx - ix), max(0.0, ly - iy)
            off_grid = max(abs(bx - round(bx)), abs(by - round(by)))
            win[j] = (ix, iy, n_w, n_h)
            box[j] = (bx, by, side)
            kind[j] = _RESAMPLE
            filt[j] = _filter_for(side / p, off_grid).name
        # the JPEG grid cells each window touches (clipped to the level), deduplicated over the batch
        tw, th = lv.tile_w, lv.tile_h
        x0c, y0c = np.maximum(win[:, 0], 0), np.maximum(win[:, 1], 0)
        x1c = np.minimum(win[:, 0] + win[:, 2], lv.width)
        y1c = np.minimum(win[:, 1] + win[:, 3], lv.height)
        inside = (x1c > x0c) & (y1c > y0c)
        gx0, gy0 = x0c // tw, y0c // th
        gw = np.where(inside, (x1c - 1) // tw - gx0 + 1, 0)
        gh = np.where(inside, (y1c - 1) // th - gy0 + 1, 0)
        table = np.full((b, max(1, int(gh.max(initial=0))), max(1, int(gw.max(initial=0)))), -1, np.int64)
        slots: dict[tuple[int, int], int] = {}
        for j in range(b):
            for r in range(int(gh[j])):
                for c in range(int(gw[j])):
                    cell = (int(gx0[j]) + c, int(gy0[j]) + r)
                    table[j, r, c] = slots.setdefault(cell, len(slots))
        cells = np.array(list(slots) or np.zeros((0, 2)), np.int64).reshape(-1, 2)
        streams, lengths = [], []
        for slot, (col, row) in enumerate(cells):
            stream = self._stream(int(col), int(row))
            if stream is None:  # a tile the file does not hold (sparse TIFF): background, like openslide
                table[table == slot] = -1
                stream = b""
            streams.append(stream)
            lengths.append(len(stream))
        data = np.frombuffer(b"".join(streams), np.uint8) if streams else np.zeros(0, np.uint8)
        return RawBatch(
            slide_path=st.slide_path, backend=st.backend, mpp=st.mpp, size_um=st.tile_size_um,
            target_mpp=st.target_mpp, tile_px=p, coords_px=np.asarray(coords, np.int64), level=lv.level,
            level_wh=(lv.width, lv.height), tile_wh=(tw, th), data=torch.from_numpy(data.copy()),
            lengths=lengths, cells=cells, win=win, box=box, kind=kind, factor=factor, filt=filt,
            grid0=np.stack([gx0, gy0], axis=1).astype(np.int64), table=table,
        )  # fmt: skip

    def _stream(self, col: int, row: int) -> bytes | None:
        """The complete JPEG stream of one tile; None: not in the file (white); b"": not a JPEG (bad)."""
        i = row * self.lv.n_cols + col
        offset, count = int(self.lv.offsets[i]), int(self.lv.counts[i])
        if count == 0 or offset == 0:
            return None
        if count <= 2:
            return b""
        tile = os.pread(self._fd, count, offset)
        if len(tile) != count or tile[:2] != _SOI:
            return b""
        return complete_jpeg(tile, self.lv.tables, self.lv.rgb)


def _find_jpeg_level(path: str, level: int, dims: tuple[int, int]) -> _Level | None:
    """The tiled TIFF page of the given (width, height); None unless it is 8-bit 3-sample JPEG."""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            for page in tif.pages:
                if not page.is_tiled or (page.imagewidth, page.imagelength) != tuple(dims):  # type: ignore[union-attr]
                    continue
                ok = (
                    int(page.compression) == _JPEG  # type: ignore[union-attr]
                    and page.samplesperpixel == 3  # type: ignore[union-attr]
                    and page.bitspersample == 8  # type: ignore[union-attr]
                    and page.imagedepth == 1  # type: ignore[union-attr]
                    and int(page.planarconfig) == 1  # type: ignore[union-attr]
                )
                if not ok:
                    return None
                return _Level(
                    level=level, width=int(page.imagewidth), height=int(page.imagelength),  # type: ignore[union-attr]
                    tile_w=int(page.tilewidth), tile_h=int(page.tilelength),  # type: ignore[union-attr]
                    offsets=np.asarray(page.dataoffsets, np.int64),  # type: ignore[union-attr]
                    counts=np.asarray(page.databytecounts, np.int64),  # type: ignore[union-attr]
                    tables=page.jpegtables,  # type: ignore[union-attr]
                    rgb=int(page.photometric) == _PHOTOMETRIC_RGB,  # type: ignore[union-attr]
                )  # fmt: skip
    except Exception:  # not a TIFF tifffile parses: the CPU path decides
        log.debug("%s: tifffile could not map level %d", path, level, exc_info=True)
    return None


# ------------------------------------------------------------------------------------------- device
class DeviceDecoder:
    """Turns RawBatch into (b, P, P, 3) uint8 tiles on `device`. One per stream; not thread-safe."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._slides: dict[str, Slide] = {}
        # per slide, after its first batch was checked: "device" decode, "cpu" decode (then resized on the
        # device), or "slide" (the decoders' colours were wrong: read_region_um reads it)
        self._mode: dict[str, str] = {}

    def close(self) -> None:
        for slide in self._slides.values():
            slide.close()
        self._slides.clear()

    def __enter__(self) -> DeviceDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def decode(self, raw: RawBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, P, P, 3) uint8 tiles on the device and (b,) bool ok on the CPU (False: unreadable)."""
        b, p = len(raw), raw.tile_px
        ok = torch.ones(b, dtype=torch.bool)
        mode = self._mode.get(raw.slide_path)
        if mode == "slide":
            return self._cpu_tiles(raw, np.arange(b), ok), ok
        cpu = torch.device("cpu")
        stack, bad = self._decode_streams(raw, cpu if mode == "cpu" else self.device)  # (J + 1, th, tw, 3)
        if mode is None and len(bad):
            mode = "device" if self._check_colour(raw, stack[:-1], bad) else "slide"
            if mode == "slide" and self.device.type != "cpu":  # the device's decoder: try libjpeg-turbo
                stack, bad = self._decode_streams(raw, cpu)
                mode = "cpu" if self._check_colour(raw, stack[:-1], bad) else "slide"
            if mode != "device":
                log.warning(
                    "%s: %s JPEG decode gives other colours than %s; decoding %s", raw.slide_path,
                    self.device.type, raw.backend,
                    "on the CPU, resizing on the device" if mode == "cpu" else "the slide with the CPU path",
                )  # fmt: skip
            self._mode[raw.slide_path] = mode
            if mode == "slide":
                return self._cpu_tiles(raw, np.arange(b), ok), ok
        if stack.device != self.device:
            stack = stack.to(self.device)
        j = len(raw.lengths)
        table = raw.table.copy()
        needs_cpu = np.zeros(b, bool)
        if bad.any():
            hit = np.isin(table, np.flatnonzero(bad))  # (B, GH, GW)
            needs_cpu = hit.reshape(b, -1).any(axis=1)
        table[table < 0] = j
        out = torch.empty((b, p, p, 3), dtype=torch.uint8, device=self.device)
        groups: dict[tuple[int, int, str], list[int]] = {}
        for i in range(b):
            groups.setdefault((int(raw.kind[i]), int(raw.factor[i]), raw.filt[i]), []).append(i)
        for (kind, k, filt), members in groups.items():
            idx = np.asarray(members)
            canvas = self._gather(raw, stack, table[idx], idx, k * p if kind != _RESAMPLE else None)
            tiles = _finish(raw, canvas, idx, kind, k, filt, p, self.device)
            if len(groups) == 1:
                out = tiles
            else:
                out[_to(idx, self.device)] = tiles
        if needs_cpu.any():
            which = np.flatnonzero(needs_cpu)
            out[_to(which, self.device)] = self._cpu_tiles(raw, which, ok)
        return out, ok

    # -------------------------------------------------------------------------------------- pieces
    def _decode_streams(self, raw: RawBatch, on: torch.device) -> tuple[torch.Tensor, np.ndarray]:
        """(J + 1, th, tw, 3) uint8 on `on`: the decoded streams (bad ones white), then a white tile; and
        the (J,) bool of bad streams."""
        from torchvision.io import ImageReadMode, decode_jpeg

        lengths = np.asarray(raw.lengths, np.int64)
        bad = lengths == 0
        tw, th = raw.tile_wh
        white = torch.full((3, th, tw), _WHITE, dtype=torch.uint8, device=on)
        parts = list(torch.split(raw.data, raw.lengths))  # views, (len_i,) uint8 each
        good = np.flatnonzero(~bad)
        decoded: list[torch.Tensor | None] = [None] * len(parts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision's "decoding is deprecated" notice
            try:
                streams = [parts[i] for i in good]
                batch = decode_jpeg(streams, mode=ImageReadMode.RGB, device=on) if streams else []
                for i, img in zip(good, batch, strict=True):
                    decoded[i] = img
            except Exception:  # one broken stream fails the batch call: find it stream by stream
                log.debug(
                    "%s: batched JPEG decode failed; decoding one by one", raw.slide_path, exc_info=True
                )
                for i in good:
                    try:
                        decoded[i] = decode_jpeg(parts[i], mode=ImageReadMode.RGB, device=on)
                    except Exception as exc:
                        col, row = raw.cells[i]
                        log.warning(
                            "%s: JPEG tile (%d, %d) of level %d does not decode (%s); its tiles are read "
                            "on the CPU", raw.slide_path, col, row, raw.level, exc,
                        )  # fmt: skip
        for i, img in enumerate(decoded):
            if img is None or tuple(img.shape) != (3, th, tw):
                if img is not None:
                    log.warning(
                        "%s: JPEG tile of %s px, expected %dx%d", raw.slide_path, tuple(img.shape), th, tw
                    )
                bad[i] = True
                decoded[i] = white
        images = torch.stack([*decoded, white])  # type: ignore[list-item]  # (J + 1, 3, th, tw)
        return images.permute(0, 2, 3, 1).contiguous(), bad  # (J + 1, th, tw, 3)

    def _gather(
        self, raw: RawBatch, stack: torch.Tensor, table: np.ndarray, idx: np.ndarray, side: int | None
    ) -> torch.Tensor:
        """(G, R, S, 3) uint8 windows of the regions `idx` from the decoded tiles (white outside)."""
        dev = self.device
        tw, th = raw.tile_wh
        lw, lh = raw.level_wh
        win = raw.win[idx]
        r_max = side if side is not None else int(win[:, 3].max())
        s_max = side if side is not None else int(win[:, 2].max())
        g, gh, gw = table.shape
        # one more cell row and column, white: pixels outside the level or the window point there
        ext = np.full((g, gh + 1, gw + 1), stack.shape[0] - 1, np.int64)
        ext[:, :gh, :gw] = table
        w = _to(win, dev)  # (G, 4)
        g0 = _to(raw.grid0[idx], dev)  # (G, 2)
        t = _to(ext, dev).reshape(-1)  # (G * (GH + 1) * (GW + 1),)

        def axis(n: int, start: torch.Tensor, size: torch.Tensor, limit: int, tile: int, first: torch.Tensor,
                 cells: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
            pos = start[:, None] + torch.arange(n, device=dev)[None]  # (G, n) level px
            valid = (pos >= 0) & (pos < limit) & (torch.arange(n, device=dev)[None] < size[:, None])
            cell = (torch.div(pos, tile, rounding_mode="floor") - first[:, None]).clamp(0, cells - 1)
            return torch.where(valid, cell, cells), torch.remainder(pos, tile)

        cy, yy = axis(r_max, w[:, 1], w[:, 3], lh, th, g0[:, 1], gh)  # (G, R)
        cx, xx = axis(s_max, w[:, 0], w[:, 2], lw, tw, g0[:, 0], gw)  # (G, S)
        row0 = (torch.arange(g, device=dev)[:, None] * (gh + 1) + cy) * (gw + 1)  # (G, R)
        flat = t[row0[:, :, None] + cx[:, None, :]]  # (G, R, S) slot of every window pixel
        flat.mul_(th * tw).add_((yy * tw)[:, :, None]).add_(xx[:, None, :])  # pixel index into the stack
        return stack.reshape(-1, 3)[flat]  # (G, R, S, 3)

    def _check_colour(self, raw: RawBatch, images: torch.Tensor, bad: np.ndarray) -> bool:
        """Channel means of the most coloured decoded JPEG tile against the slide backend's pixels."""
        tw, th = raw.tile_wh
        lw, lh = raw.level_wh
        spread = images.amax(dim=3).float() - images.amin(dim=3).float()  # (J, th, tw)
        score = spread.mean(dim=(1, 2))
        score[_to(bad, score.device)] = -1
        i = int(score.argmax())  # one synchronisation per slide
        if bad[i]:
            return True  # nothing decoded to compare; the per-tile fallback handles this batch
        col, row = (int(v) for v in raw.cells[i])
        w, h = min(tw, lw - col * tw), min(th, lh - row * th)
        try:
            ref = self._slide(raw).read_level(raw.level, col * tw, row * th, w, h)  # (h, w, 3)
        except Exception as exc:
            log.warning("%s: colour check skipped, the slide did not read: %s", raw.slide_path, exc)
            return True
        got = images[i, :h, :w].float().mean(dim=(0, 1)).cpu().numpy()
        diff = np.abs(got - ref.reshape(-1, 3).mean(axis=0))
        if diff.max() > _COLOUR_CHECK_MAX:
            log.info(
                "%s: JPEG decode on %s: channel means differ from %s by %s", raw.slide_path, images.device,
                raw.backend, np.round(diff, 1).tolist(),
            )  # fmt: skip
            return False
        return True

    def _slide(self, raw: RawBatch) -> Slide:
        from wsi.slide import open_slide

        if raw.slide_path not in self._slides:
            if len(self._slides) >= 4:  # keep few handles open: slides come one after another
                self.close()
            self._slides[raw.slide_path] = open_slide(raw.slide_path, backend=raw.backend, mpp=raw.mpp)
        return self._slides[raw.slide_path]

    def _cpu_tiles(self, raw: RawBatch, which: np.ndarray, ok: torch.Tensor) -> torch.Tensor:
        """(len(which), P, P, 3) uint8 on the device by `read_region_um` (the CPU path); a tile that does
        not read there either gets ok=False and zeros."""
        from pipelines.jobs import describe_error

        p = raw.tile_px
        tiles = np.zeros((len(which), p, p, 3), np.uint8)
        for n, i in enumerate(which):
            x, y = (int(v) for v in raw.coords_px[i])
            try:
                tile = self._slide(raw).read_region_um(x, y, raw.size_um, raw.target_mpp)
                if tile.shape != (p, p, 3):
                    raise ValueError(f"tile of shape {tile.shape}, expected {(p, p, 3)}")
                tiles[n] = tile
            except Exception as exc:
                ok[int(i)] = False
                log.warning(
                    "%s: tile at level-0 (%d, %d) unreadable, skipped: %s", raw.slide_path, x, y,
                    describe_error(exc),
                )  # fmt: skip
        return _to(tiles, self.device)


def decode_ahead(
    batches: Iterable[TileBatch], decoder: DeviceDecoder, depth: int = 2, threaded: bool | None = None
) -> Iterator[TileBatch]:
    """The batches with raw JPEG tiles decoded, `depth` batches ahead of the consumer.

    On CUDA (threaded=None) decoding runs in one background thread on its own CUDA stream, so the
    decoder's host-side work overlaps the encoder's forward pass of the previous batch. On the CPU it
    runs inline: two threads issuing parallel torch ops oversubscribe the cores (measured 2x slower).
    A batch whose decoding raises (e.g. out of device memory) comes back with `error` set, which fails
    that slide only.
    """
    device = decoder.device
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    if threaded is None:
        threaded = stream is not None

    def work(batch: TileBatch) -> tuple[TileBatch, torch.cuda.Event | None]:
        if batch.raw is None:
            return batch, None
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                tiles, ok = decoder.decode(batch.raw)
                event = None
                if stream is not None:
                    event = torch.cuda.Event()
                    event.record(stream)
        except Exception as exc:
            log.debug("%s: device decode failed", batch.raw.slide_path, exc_info=True)
            return batch._replace(raw=None, error=f"device decode failed: {type(exc).__name__}: {exc}"), None
        return batch._replace(tiles=tiles, ok=ok, raw=None), event

    def ready(item: tuple[TileBatch, torch.cuda.Event | None]) -> TileBatch:
        batch, event = item
        if event is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(event)  # the consumer's kernels start after decoding, the host does not wait
            batch.tiles.record_stream(current)  # its memory is not reused while the consumer reads it
        return batch

    if not threaded:
        for batch in batches:
            yield ready(work(batch))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsi-embed-decode") as pool:
        pending: deque[Future[tuple[TileBatch, torch.cuda.Event | None]]] = deque()
        for batch in batches:
            pending.append(pool.submit(work, batch))
            if len(pending) > depth:
                yield ready(pending.popleft().result())
        while pending:
            yield ready(pending.popleft().result())


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on the device without a host synchronisation (pinned, non-blocking on CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _finish(
    raw: RawBatch, canvas: torch.Tensor, idx: np.ndarray, kind: int, k: int, filt: str, p: int,
    device: torch.device,
) -> torch.Tensor:  # fmt: skip
    """(G, R, S, 3) uint8 windows -> (G, P, P, 3) uint8 tiles: copy, k x k means, or PIL-style resample."""
    if kind == _COPY:
        return canvas
    g = canvas.shape[0]
    if kind == _REDUCE:
        blocks = canvas.reshape(g, p, k, p, k, 3).float().mean(dim=(2, 4))  # (G, P, P, 3)
        return blocks.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)

    def weights(axis: int, n: int) -> torch.Tensor:  # (G, P, n); regions share few distinct boxes
        keys = np.stack([raw.box[idx, axis], raw.box[idx, 2], raw.win[idx, 2 + axis]], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        u = _to(uniq.astype(np.float32), device)  # (U, 3) start, side, input size
        return _pil_weights(u[:, 0], u[:, 1], u[:, 2], p, n, filt)[_to(inv.reshape(-1), device)]

    wy = weights(1, canvas.shape[1])  # (G, P, R)
    wx = weights(0, canvas.shape[2])  # (G, P, S)
    x = canvas.permute(0, 3, 1, 2).float()  # (G, 3, R, S)
    x = x @ wx.transpose(1, 2)[:, None]  # horizontal first, like PIL: (G, 3, R, P)
    x = wy[:, None] @ x  # (G, 3, P, P)
    x = x.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous()  # (G, P, P, 3) like the CPU path (channels_last downstream)


def _pil_weights(
    start: torch.Tensor, side: torch.Tensor, in_size: torch.Tensor, out: int, n: int, filt: str
) -> torch.Tensor:
    """(G, out, n) float32 rows of PIL's resampling coefficients (precompute_coeffs in Resample.c) for
    boxes [start, start + side) of inputs `in_size` px long (columns beyond it weigh 0)."""
    dev = start.device
    scale = side / out  # (G,)
    filterscale = torch.clamp(scale, min=1.0)[:, None, None]  # (G, 1, 1)
    support = _FILTERS[filt] * filterscale
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
