"""What a stage returns: one row per item (slide, bag, case), the tally of a batch, and the stage's result.

Every stage (`tile_slides`, `embed_tiles`, `tile_and_embed`, `embed_slides`, `train`, `predict`) returns a
`StageResult`: where its outputs went, one typed row per item (`results`), and the tally its command's
summary line and exit code come from. Stages add their own fields (the tile stage's per-slide findings,
the predict stage's table), never text a caller must parse.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Literal, TypeVar, overload

from wsi.storage.masking import shown

# ok: done now; skipped: already done by an earlier run; empty: ran, but produced nothing usable (a slide
# that kept no tile); failed: an error. `empty` and `failed` both make a command exit non-zero.
Status = Literal["ok", "skipped", "empty", "failed"]
STATUSES: tuple[Status, ...] = ("ok", "skipped", "empty", "failed")


@dataclass
class JobResult:
    """The outcome of one item: `n` is what it produced (tiles kept, tiles embedded, ...)."""

    slide_id: str
    path: str
    status: Status
    n: int = 0
    seconds: float = 0.0
    error: str = ""
    note: str = ""  # a case that succeeded without everything asked for: what is missing and why

    def __post_init__(self) -> None:
        # what a row says reaches the manifest, the log and the terminal: no secret, and a remote output
        # named by its URL rather than by this machine's mirror of it
        for name in ("error", "note"):
            text = getattr(self, name)
            if text and isinstance(text, str):
                object.__setattr__(self, name, shown(text))


@dataclass(frozen=True)
class RunSummary:
    """The one tally of a batch: every stage's log line and exit decision come from here."""

    counts: dict[str, int]  # status -> number of items
    produced: int  # sum of `n` over items that did not fail (tiles kept, tiles embedded, ...)
    seconds: float
    failed: tuple[JobResult, ...]
    empty: tuple[JobResult, ...] = ()

    @classmethod
    def of(cls, results: Sequence[JobResult], seconds: float = 0.0) -> RunSummary:
        counts: dict[str, int] = {status: 0 for status in STATUSES}
        for r in results:
            counts[r.status] = counts.get(r.status, 0) + 1
        produced = sum(r.n for r in results if r.status != "failed")
        failed = tuple(r for r in results if r.status == "failed")
        return cls(counts, produced, seconds, failed, tuple(r for r in results if r.status == "empty"))

    @property
    def problems(self) -> tuple[JobResult, ...]:
        """Items that make the command exit non-zero: failed, and empty (no silent success)."""
        return self.failed + self.empty

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def line(
        self, stage: str, *, noun: str = "slides", unit: str = "items", labels: dict[str, str] | None = None
    ) -> str:
        """`stage: N slides: a ok, b skipped, c failed; P <unit>[ in S s (R <unit>/s)]`.

        `labels` renames statuses for the reader (e.g. ok -> "tiled", skipped -> "already done").
        """
        names = labels or {}
        shown = [(status, n) for status, n in self.counts.items() if n or status != "empty"]
        parts = ", ".join(f"{n} {names.get(status, status)}" for status, n in shown)
        timing = ""
        if self.seconds > 0:
            rate = self.produced / self.seconds  # slow items (images on a CPU) show 0.24/s, not 0/s
            per_s = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"
            timing = f" in {self.seconds:.1f} s ({per_s} {unit}/s)"
        noun = noun.removesuffix("s") if self.total == 1 else noun  # "1 slide", not "1 slides"
        return f"{stage}: {self.total} {noun}: {parts}; {self.produced} {unit}{timing}"


R = TypeVar("R", bound=JobResult)


@dataclass(frozen=True)
class StageResult(Sequence[R], Generic[R]):
    """A stage's result: `results` (one row per item, in input order; the result is a Sequence of them, so
    `len`, indexing and iteration read the rows), `out_dir` (where the outputs are: a folder or a URL)
    and the time taken."""

    stage: str
    out_dir: Path | str
    results: tuple[R, ...] = ()
    seconds: float = 0.0
    manifest: Path | str | None = field(default=None, kw_only=True)  # the manifest.csv written, if any

    @overload
    def __getitem__(self, index: int) -> R: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[R]: ...
    def __getitem__(self, index: int | slice) -> R | Sequence[R]:
        return self.results[index]

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[R]:
        return iter(self.results)

    @property
    def summary(self) -> RunSummary:
        return RunSummary.of(self.results, self.seconds)

    @property
    def problems(self) -> tuple[R, ...]:
        """Items that make the command exit non-zero: failed ones and empty ones."""
        return tuple(r for r in self.results if r.status in ("failed", "empty"))

    @property
    def failed(self) -> tuple[R, ...]:
        return tuple(r for r in self.results if r.status == "failed")


__all__ = ["STATUSES", "JobResult", "R", "RunSummary", "StageResult", "Status"]
