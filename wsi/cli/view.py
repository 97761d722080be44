"""`wsi view DIR`: look at a prediction, training or tiling folder's slides and overlays in the browser."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from wsi.cli._common import user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options
from wsi.pipelines.tile.config import TileOptions
from wsi.storage import Url
from wsi.view.server import ViewOptions

# option -> ViewOptions field: defaults, ranges and help come from the fields (wsi/view/server.py)
VIEW_FLAGS = {"--host": "host", "--port": "port", "--server-threads": "server_threads"}

log = logging.getLogger(__name__)


@click.command(
    "view",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi view preds/                     # a `wsi predict` folder: heatmaps, top tiles, predictions
  wsi view run/                       # a `wsi tile` folder: kept tiles, QC
  wsi view model/ --port 8800         # a training folder: the slides of its bags
  wsi view preds/ --host 0.0.0.0      # visible to other machines: anyone who can reach it sees the slides
Then open the printed address (http://127.0.0.1:PORT/) in a browser; report.html links each slide there.
""",
)
@click.argument("folder", type=PathOrUrl(file_okay=False))
@config_options(ViewOptions, VIEW_FLAGS, into="serving")
@config_options(TileOptions, {"--backend": "backend"}, into="reading")
@user_errors
def command(folder: Path | Url, serving: dict[str, Any], reading: dict[str, str]) -> None:
    """Serve FOLDER's slides as DeepZoom with their overlays, read-only, until Ctrl-C."""
    from wsi.core.config import parse_config
    from wsi.core.errors import ConfigError
    from wsi.storage import local_folder
    from wsi.view import make_server

    folder = local_folder(folder)  # a URL: the folder pulled here; its slides are read from their URLs
    options = parse_config(ViewOptions, serving, source="wsi view options")
    host, port = options.host, options.port

    if not folder.is_dir():
        raise ConfigError(
            f"{folder}: no such folder; give a `wsi predict`, `wsi train` or `wsi tile` output folder"
        )
    try:
        server = make_server(folder, host=host, port=port, backend=reading["backend"],
                             workers=options.server_threads)  # fmt: skip
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port"
        ) from exc
    catalog = server.state.catalog
    viewable = [e for e in catalog.slides.values() if e.path is not None]
    if not viewable:
        server.server_close()
        reasons = [e.why_missing for e in catalog.slides.values() if e.why_missing]
        raise ConfigError(
            f"{folder}: no slide to show"
            + (f" ({len(catalog.slides)} listed, none reachable; e.g. {reasons[0]})" if reasons else "")
            + "; give a `wsi predict`, `wsi train` or `wsi tile` output folder whose slides are here"
        )
    if len(viewable) < len(catalog.slides):
        log.warning("%d of %d slides are not reachable from here; the list says why",
                    len(catalog.slides) - len(viewable), len(catalog.slides))  # fmt: skip
    if not server.loopback_only:
        log.warning("listening on %s: anyone who can reach this machine can see these slides", host)
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}/"
    click.echo(f"wsi view: {len(viewable)} slide(s) of {folder} at {url} (Ctrl-C stops)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
