"""The tables `artifact_accuracy.py` prints from its `Score` rows: per image and split, the worst image of
each measure, and the inked tiles kept per marker colour."""

from __future__ import annotations

from typing import Any


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}%" if n else "-"


def table(scores: list[Any]) -> str:
    head = (
        "| image | split | tiles >20% ink | rejected as ink | as any artifact | ink-free tissue tiles "
        "| rejected (any) | by filter | tissue cells inside candidates |"
    )
    rows = [head, "|" + "---|" * 9]
    for s in scores:
        n_false = sum(s.false.values())
        by = ", ".join(f"{v} {k}" for k, v in sorted(s.false.items())) or "-"
        inked = f"{s.inked}{' (approx.)' if s.approx and s.inked else ''}"
        rows.append(
            f"| {s.name} | {s.split} | {inked} | {_pct(s.as_ink, s.inked)} | {_pct(s.as_any, s.inked)} "
            f"| {s.clean} | {n_false} ({_pct(n_false, s.clean)}) | {by} | {_cells(s)} |"
        )
    for split in ("tune", "report", "other"):
        for approx in (False, True):
            group = [s for s in scores if s.split == split and s.approx == approx]
            if not group:
                continue
            inked, ink, anyr = (sum(getattr(s, k) for s in group) for k in ("inked", "as_ink", "as_any"))
            clean, false = sum(s.clean for s in group), sum(sum(s.false.values()) for s in group)
            cells, inside = sum(s.cells for s in group), sum(s.cells_inside for s in group)
            label = f"**all {split}{', approx. truth' if approx else ''}** ({len(group)} images)"
            rows.append(
                f"| {label} | {split} | {inked} | {_pct(ink, inked)} | {_pct(anyr, inked)} | {clean} "
                f"| {false} ({_pct(false, clean)}) | | {_pct(inside, cells)} of {cells} |"
            )
    return "\n".join(rows) + "\n\n" + worst_table(scores) + "\n\n" + colour_table(scores)


def _cells(s: Any) -> str:
    return f"{_pct(s.cells_inside, s.cells)} of {s.cells}" if s.cells else "-"


def worst_table(scores: list[Any]) -> str:
    """The worst image of each measure, per split (ink-free tissue rejected: images with >= 50 such
    tiles; inked tiles kept: >= 20; tissue cells outside the candidates: >= 50)."""
    rows = ["| split | worst ink-free tissue rejected | worst inked tiles kept | worst tissue cells inside |",
            "|---|---|---|---|"]  # fmt: skip
    for split in ("tune", "report", "other"):
        group = [s for s in scores if s.split == split]
        if not group:
            continue
        rej = [s for s in group if s.clean >= 50]
        kept = [s for s in group if s.inked >= 20]
        cov = [s for s in group if s.cells >= 50]
        a = max(rej, key=lambda s: sum(s.false.values()) / s.clean, default=None)
        b = max(kept, key=lambda s: 1 - s.as_ink / s.inked, default=None)
        c = min(cov, key=lambda s: s.cells_inside / s.cells, default=None)
        rows.append(
            f"| {split} | {_pct(sum(a.false.values()), a.clean) + ' ' + a.name if a else '-'} "
            f"| {_pct(b.inked - b.as_ink, b.inked) + ' ' + b.name if b else '-'} "
            f"| {_pct(c.cells_inside, c.cells) + ' ' + c.name if c else '-'} |"
        )
    return "\n".join(rows)


def colour_table(scores: list[Any]) -> str:
    """Inked tiles per marker colour and split: each inked tile has the colour of its truth (an image's
    one marker colour, else the colour covering most of the tile); rejected as something other than
    ink (a fold, a bubble rim, background) is not kept, but not named ink either."""
    rows = [
        "| split | marker colour | images | tiles >20% ink | not rejected as ink "
        "| kept (not rejected at all) |",
        "|---|---|---|---|---|---|",
    ]
    for split in ("tune", "report", "other"):
        totals: dict[str, list[int]] = {}
        images: dict[str, int] = {}
        for s in scores:
            if s.split != split:
                continue
            for colour, (n, ink, kept) in s.by_colour.items():
                t = totals.setdefault(colour, [0, 0, 0])
                t[0], t[1], t[2] = t[0] + n, t[1] + ink, t[2] + kept
                images[colour] = images.get(colour, 0) + 1
        for colour, (n, ink, kept) in sorted(totals.items()):
            rows.append(
                f"| {split} | {colour} | {images[colour]} | {n} | {n - ink} ({_pct(n - ink, n)}) "
                f"| {kept} ({_pct(kept, n)}) |"
            )
    return "\n".join(rows)
