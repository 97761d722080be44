"""`wsi encoders --slide`: the slide encoders, the tile features each reads, and where weights come from."""

from __future__ import annotations

import json

import click


def show_slide_encoders(name: str | None, *, as_json: bool = False) -> None:
    from wsi.cli._weights import weights_lines, weights_state
    from wsi.models.slide_encoders import SLIDE_ENCODERS, get_spec
    from wsi.storage.hf import repo_of

    names = [name] if name else SLIDE_ENCODERS.names()
    specs = {n: get_spec(n) for n in names}  # unknown NAME: a ConfigError listing the choices
    if as_json:
        click.echo(json.dumps({n: s.as_dict() for n, s in specs.items()}, indent=2))
        return
    if name:
        s = specs[name]
        px = round(s.tile_um / s.tile_mpp)
        lines = [
            f"{name}: {s.params / 1e6:.2f}M parameters, {s.in_dim}-d tiles -> {s.dim}-d slide embedding",
            f"  tiles:     {' or '.join(s.tile_encoders)} features of {s.tile_um:g} um tiles "
            f"({px} px at {s.tile_mpp:g} um/px)",
            f"  positions: {'used' if s.uses_positions else 'not used (order-invariant)'}; patients: "
            f"{'tiles of all slides pooled' if s.patient_fusion == 'early' else 'mean of slide embeddings'}",
            f"  weights:   {s.weights_page} ({', '.join(s.weights_files)})",
            f"  licence:   {s.licence}",
            f"  checked:   {s.reference}",
            f"  commands:  wsi tile SLIDES --out run/ --tile-um {s.tile_um:g} --tile-px {px}",
            f"             wsi embed --tiles run/ --out run/ --encoder {s.tile_encoders[0]} --weights ...",
            *weights_lines(
                f"wsi embed-slides --features run/features/{s.tile_encoders[0]} --encoder {name} --out run/",
                repo_of(s.weights_page), s.weights_files,
            ),
        ]
        click.echo("\n".join(lines))
        return
    rows = [("name", "tile encoder", "tiles", "width", "params", "weights", "licence")]
    for n, s in specs.items():
        rows.append((n, "/".join(s.tile_encoders), f"{s.tile_um:g} um @ {s.tile_mpp:g}", str(s.dim),
                     f"{s.params / 1e6:.2f}M", weights_state(repo_of(s.weights_page), s.weights_files),
                     s.licence.split(" (")[0]))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    click.echo("\n`wsi encoders --slide NAME` shows the weights page and the commands.")
