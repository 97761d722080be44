"""`wsi view`: a local, read-only browser viewer of a prediction, training or tiling folder.

  catalog.py    which slides the folder has and the files about them (manifests, bags, tile files)
  dzi.py        DeepZoom descriptors and tiles (openslide's DeepZoomGenerator over openslide | tiffslide)
  overlays.py   per-slide overlay JSON in level-0 px: heatmap values, kept tiles, top tiles, prediction
  server.py     the HTTP server: fixed routes, strict paths, a bounded thread pool
  static/       the page (index.html, viewer.js, viewer.css) and OpenSeadragon from npm with its licence

It reads files only: nothing here imports `pipelines` or `models`.
"""

from wsi.view.catalog import Catalog, SlideEntry
from wsi.view.server import PooledHTTPServer, make_server

__all__ = ["Catalog", "PooledHTTPServer", "SlideEntry", "make_server"]
