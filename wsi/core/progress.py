"""Progress bars that suit where stderr goes.

On a terminal: tqdm's live bar (in a Jupyter kernel, its notebook widget). Anywhere else (a log file, a
pipe, a batch scheduler's output), tqdm's redraws become noise: carriage returns, and for nested bars
(an epoch's steps inside the epochs) the ESC[A cursor-up codes that fill logs with hundreds of
half-lines. There a bar writes plain log lines instead: one at most every `PLAIN_EVERY_S` seconds
while it runs, and a closing one if it wrote any, so a short step stays silent and a long one says
how far it is, at what rate and how long is left.

    progress(iterable=None, *, total=None, desc="", unit="it", disable=False, initial=0) -> Bar
    Bar: iterate it, or .update(n), .set_postfix(mapping), .close(), `with`
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

log = logging.getLogger("wsi.progress")

#: a plain bar's lines come at most this often, seconds (the first after this long)
PLAIN_EVERY_S = 30.0

T = TypeVar("T")


class Bar(Protocol):
    def update(self, n: float = 1) -> Any: ...
    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True) -> Any: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...


def is_terminal() -> bool:
    """Whether stderr is a terminal that redraws a bar in place."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def _in_notebook() -> bool:
    """A Jupyter kernel (tqdm's widget draws there), told apart as tqdm.autonotebook tells it."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    disable: bool = False,
    initial: float = 0,
    leave: bool = True,
) -> Any:
    """A bar over `iterable` (or counted by `.update`): tqdm on a terminal or in a notebook, plain log
    lines elsewhere (see the module docstring); nothing at all with `disable`."""
    if disable or is_terminal():
        from tqdm.std import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, initial=initial,
                    leave=leave, dynamic_ncols=True, file=sys.stderr)  # fmt: skip
    if _in_notebook():
        from tqdm.notebook import tqdm as notebook_tqdm

        return notebook_tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave)
    return PlainBar(iterable, total=total, desc=desc, unit=unit, initial=initial)


class PlainBar:
    """A progress bar for output that is not a terminal: whole log lines, never a control code."""

    def __init__(
        self, iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str = "",
        unit: str = "it", initial: float = 0,
    ) -> None:  # fmt: skip
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = initial
        self._start_n = initial
        self._start = self._last = time.monotonic()
        self._postfix = ""
        self._said = False
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this bar counts by update(); it was given nothing to iterate")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> PlainBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        done = bool(self.total) and self.n >= (self.total or 0)  # the closing line says it once
        if now - self._last >= PLAIN_EVERY_S and not done:
            self._last = now
            self._said = True
            log.info("%s", self.line(now))

    def set_postfix(
        self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kw: Any
    ) -> None:
        items = {**(ordered_dict or {}), **kw}
        self._postfix = ", ".join(f"{k} {v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._said:  # a long step ends with its total; a short one said nothing and stays silent
            log.info("%s", self.line(time.monotonic(), done=True))

    def line(self, now: float, *, done: bool = False) -> str:
        """`desc: n of total units (p%), r units/s, about s s left; postfix` (or `... done in s s`)."""
        seconds = max(now - self._start, 1e-9)
        rate = (self.n - self._start_n) / seconds
        units = self.unit if self.unit.endswith("s") else f"{self.unit}s"  # "tile" counts tiles
        count = f"{self.n:g} of {self.total:g} {units}" if self.total else f"{self.n:g} {units}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        per_s = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"
        parts = [count, f"{per_s} {units}/s"]
        if done:
            parts.append(f"done in {seconds:.0f} s")
        elif self.total and rate > 0:
            parts.append(f"about {max(self.total - self.n, 0) / rate:.0f} s left")
        text = f"{self.desc}: " + ", ".join(parts) if self.desc else ", ".join(parts)
        return f"{text}; {self._postfix}" if self._postfix else text


__all__ = ["PLAIN_EVERY_S", "Bar", "PlainBar", "is_terminal", "progress"]
