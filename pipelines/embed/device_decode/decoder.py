"""The device decoder: a RawBatch's JPEG streams decoded, assembled and resized into tiles on the device.

`DeviceDecoder(device, codec).decode(raw)` -> (tiles (b, P, P, 3) uint8 on the device, ok (b,) bool):
one batched decode (codecs.py), each tile's window gathered from the decoded JPEG tiles with one index
operation and finished as its region plan says (resample.py); nothing leaves the device. Fallbacks, so
a device decode is never worse than the CPU path: a stream that does not decode sends only the tiles
that need it to `Slide.read_region_um` (failing there too, they are counted as bad), and the first batch
of every slide is checked against the slide backend's pixels (channel means): a decoder that gets the
colours wrong makes the slide decode with libjpeg-turbo (resized on the device), or else the CPU path.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import torch
from PIL import Image

from wsi.pipelines.embed.batches import RawBatch
from wsi.pipelines.embed.device_decode.codecs import CODECS, get_codec
from wsi.pipelines.embed.device_decode.codecs import torchvision_decode as decode_jpegs
from wsi.pipelines.embed.device_decode.resample import finish_tiles, to_device
from wsi.pipelines.scheduling.jobs import describe_error
from wsi.slides.region import RegionKind
from wsi.slides.slide import Slide, open_slide

log = logging.getLogger(__name__)

_WHITE = 255
#: per-channel mean difference (0-255) above which the device decode of a slide is judged wrong
_COLOUR_CHECK_MAX = 6.0
#: slide handles kept open for fallbacks (slides come one after another)
_MAX_OPEN_SLIDES = 4
#: how a slide is decoded once its first batch was checked: "device" decode, "cpu" decode (then resized
#: on the device), or "slide" (the decoders' colours were wrong: read_region_um reads it)
Mode = Literal["device", "cpu", "slide"]


class DeviceDecoder:
    """Turns RawBatch into (b, P, P, 3) uint8 tiles on `device`. One per stream; not thread-safe.

    codec: the JPEG batch decoder on `device` (codecs.py; torchvision unless a GPU run shows another
    faster with the same tiles). Decoding on the CPU after a failed colour check is always torchvision's
    libjpeg-turbo, the decoder the CPU path's openslide uses too.
    """

    def __init__(self, device: torch.device | str, codec: str = CODECS[0]) -> None:
        self.device = torch.device(device)
        self.codec = codec
        self._decode = get_codec(codec)
        self._slides: dict[str, Slide] = {}
        self._mode: dict[str, Mode] = {}  # per slide path

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
        b = len(raw)
        ok = torch.ones(b, dtype=torch.bool)
        mode = self._mode.get(raw.slide_path)
        if mode == "slide":
            return self._cpu_tiles(raw, np.arange(b), ok), ok
        cpu = torch.device("cpu")
        stack, bad = self._decode_streams(raw, cpu if mode == "cpu" else self.device)  # (J + 1, th, tw, 3)
        if mode is None and len(bad):
            mode, stack, bad = self._choose_mode(raw, stack, bad)
            if mode == "slide":
                return self._cpu_tiles(raw, np.arange(b), ok), ok
        return self._assemble(raw, stack.to(self.device), bad, ok), ok

    # -------------------------------------------------------------------------------------- pieces
    def _choose_mode(
        self, raw: RawBatch, stack: torch.Tensor, bad: np.ndarray
    ) -> tuple[Mode, torch.Tensor, np.ndarray]:
        """Check a slide's first decoded batch; on wrong colours try libjpeg-turbo, then the CPU path."""
        mode: Mode = "device" if self._check_colour(raw, stack[:-1], bad) else "slide"
        if mode == "slide" and self.device.type != "cpu":  # the device's decoder: try libjpeg-turbo
            stack, bad = self._decode_streams(raw, torch.device("cpu"))
            mode = "cpu" if self._check_colour(raw, stack[:-1], bad) else "slide"
        if mode != "device":
            log.warning(
                "%s: %s JPEG decode gives other colours than %s; decoding %s", raw.slide_path,
                self.device.type, raw.backend,
                "on the CPU, resizing on the device" if mode == "cpu" else "the slide with the CPU path",
            )  # fmt: skip
        self._mode[raw.slide_path] = mode
        return mode, stack, bad

    def _assemble(
        self, raw: RawBatch, stack: torch.Tensor, bad: np.ndarray, ok: torch.Tensor
    ) -> torch.Tensor:
        """(b, P, P, 3) tiles from the decoded streams, one gather + finish per kind of plan; tiles that
        touch a stream that did not decode are read by the CPU path instead."""
        b, p = len(raw), raw.tile_px
        table = raw.table.copy()
        needs_cpu: np.ndarray = np.zeros(b, bool)  # (B,) tiles that touch a stream that did not decode
        if bad.any():
            hit = np.isin(table, np.flatnonzero(bad))  # (B, GH, GW)
            needs_cpu = np.asarray(hit.reshape(b, -1).any(axis=1))
        table[table < 0] = len(raw.lengths)  # the white tile after the streams
        out = torch.empty((b, p, p, 3), dtype=torch.uint8, device=self.device)
        keys = np.stack([raw.kind, raw.factor, raw.filt], axis=1)  # (B, 3): one group per kind of plan
        groups, which = np.unique(keys, axis=0, return_inverse=True)
        which = which.reshape(-1)
        for g, (kind, k, filt) in enumerate(groups.tolist()):
            idx = np.flatnonzero(which == g)
            canvas = self._gather(raw, stack, table[idx], idx, k * p if kind != RegionKind.RESAMPLE else None)
            name = Image.Resampling(filt).name if kind == RegionKind.RESAMPLE else ""
            tiles = finish_tiles(canvas, kind, k, name, p, raw.box[idx], raw.win[idx])
            if len(groups) == 1:
                out = tiles
            else:
                out[to_device(idx, self.device)] = tiles
        if needs_cpu.any():
            which = np.flatnonzero(needs_cpu)
            out[to_device(which, self.device)] = self._cpu_tiles(raw, which, ok)
        return out

    def _decode_streams(self, raw: RawBatch, on: torch.device) -> tuple[torch.Tensor, np.ndarray]:
        """(J + 1, th, tw, 3) uint8 on `on`: the decoded streams (bad ones white), then a white tile; and
        the (J,) bool of bad streams."""
        lengths = np.asarray(raw.lengths, np.int64)
        bad = lengths == 0
        tw, th = raw.tile_wh
        white = torch.full((3, th, tw), _WHITE, dtype=torch.uint8, device=on)
        good = np.flatnonzero(~bad).tolist()
        parts = {i: raw.stream(i) for i in good}  # views into raw.data
        decoded: list[torch.Tensor | None] = [None] * len(lengths)
        decode = self._decode if on == self.device else decode_jpegs
        try:
            for i, image in zip(good, decode([parts[i] for i in good], on), strict=True):
                decoded[i] = image
        except Exception:  # one broken stream fails the batch call: find it stream by stream
            log.debug("%s: batched JPEG decode failed; decoding one by one", raw.slide_path, exc_info=True)
            for i in good:
                try:
                    decoded[i] = decode([parts[i]], on)[0]
                except Exception as exc:
                    col, row = raw.cells[i]
                    log.warning(
                        "%s: JPEG tile (%d, %d) of level %d does not decode (%s); its tiles are read "
                        "on the CPU", raw.slide_path, col, row, raw.level, exc,
                    )  # fmt: skip
        images: list[torch.Tensor] = []
        for slot, img in enumerate(decoded):
            if img is None or tuple(img.shape) != (3, th, tw):
                if img is not None:
                    log.warning(
                        "%s: JPEG tile of %s px, expected %dx%d", raw.slide_path, tuple(img.shape), th, tw
                    )
                bad[slot] = True
                img = white
            images.append(img)
        stack = torch.stack([*images, white])  # (J + 1, 3, th, tw)
        return stack.permute(0, 2, 3, 1).contiguous(), bad  # (J + 1, th, tw, 3)

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
        w = to_device(win, dev)  # (G, 4)
        g0 = to_device(raw.grid0[idx], dev)  # (G, 2)
        t = to_device(ext, dev).reshape(-1)  # (G * (GH + 1) * (GW + 1),)

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
        score[to_device(bad, score.device)] = -1
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
        if raw.slide_path not in self._slides:
            if len(self._slides) >= _MAX_OPEN_SLIDES:
                self.close()
            self._slides[raw.slide_path] = open_slide(raw.slide_path, backend=raw.backend, mpp=raw.mpp)
        return self._slides[raw.slide_path]

    def _cpu_tiles(self, raw: RawBatch, which: np.ndarray, ok: torch.Tensor) -> torch.Tensor:
        """(len(which), P, P, 3) uint8 on the device by `read_region_um` (the CPU path); a tile that does
        not read there either gets ok=False and zeros."""
        p = raw.tile_px
        tiles = np.zeros((len(which), p, p, 3), np.uint8)
        for n, i in enumerate(which):
            x, y = (int(v) for v in raw.coords_px[i])
            try:
                tile = self._slide(raw).read_region_um(x, y, raw.side_um, raw.target_mpp)
                if tile.shape != (p, p, 3):
                    raise ValueError(f"tile of shape {tile.shape}, expected {(p, p, 3)}")
                tiles[n] = tile
            except Exception as exc:
                ok[int(i)] = False
                log.warning(
                    "%s: tile at level-0 (%d, %d) unreadable, skipped: %s", raw.slide_path, x, y,
                    describe_error(exc),
                )  # fmt: skip
        return to_device(tiles, self.device)
