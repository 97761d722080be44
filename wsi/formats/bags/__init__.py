"""Feature bags: the one module that writes ours, reads and sniffs ours, STAMP's, CLAM's and TRIDENT's,
and summarises a bag. Nothing else in the project opens a bag with h5py.

Bags from different tools disagree on names (`feats` vs `features`) and units (micrometres vs level-0
pixels). Everything downstream (training, prediction, heatmaps) reads bags only through `load_bag`, so
it sees one shape: features (N, D) and top-left coordinates in micrometres.

Public API:
  Bag                                    in-memory bag: feats (N,D), coords_um (N,2) float32 | None,
                                         tile_size_um, meta (dict of file attributes + "layout"), path,
                                         slide_id, coords_px (N,2) int64 | None, provenance (ours) | None,
                                         mpp, mpp_source, tile_size_px0; len(bag) == N, bag.dim == D
  BagProvenance                          how a bag of ours was made (encoder, weights, tiles, slide);
                                         .to_dict() -> root attributes, .from_dict(attrs, source=)
  load_bag(path, *, mpp=None, rows=None, require_um=True) -> Bag
        ours ("wsi-bag"), STAMP (`feats`, coords in um, `tile_size_um` | `tile_size`+`unit`), CLAM
        (`features` + level-0 px `coords`, no attributes needed), TRIDENT (`features`, coords with
        `patch_size_level0`, `level0_magnification`). Pixel coordinates become micrometres with the
        first of: `mpp` argument, an `mpp` attribute, TRIDENT's 10 / level0_magnification (geometry.py);
        without one: BagFormatError, or with require_um=False `coords_um` None (models without
        positions). A tile size no attribute gives is inferred from the coordinate grid (logged).
        `rows` (int indices or a slice) reads only those tiles, e.g. a random sample for training.
  open_bag_stream(path, *, mpp=None, require_um=True) -> BagStream
        the same bag without its features in memory: `.bag` (positions, attributes; feats (N, 0)),
        `.n_tiles`, `.dim`, `.chunks(size)` yields features (n, D) as stored, for bags too large to load
  grid_step(coords) -> float | None      the most common positive step of a tile grid
  check_finite(bag)                      NonFiniteFeaturesError (a BagFormatError) naming file + count
  finite_chunks(stream, size)            stream.chunks(size), NonFiniteFeaturesError at a NaN chunk
  find_bad_bags(paths) -> list[BadBag]   every non-finite, unreadable or empty bag (bounded memory)
  available_memory() -> int | None       bytes this process may still allocate (RAM, cgroup, ulimit -v)
  fits_in_memory(nbytes) -> bool         within half of that: loading whole is safe, else stream or refuse
  scan_bag(path) -> BadBag | None
  scan_bag_header(path) -> (BagHeader | None, BadBag | None)   unreadable or empty, no array read
  read_bag_header(path, *, attr_names=None) -> BagHeader   layout, n_tiles, dim, dtype, attrs (all, or
                                         those named); no arrays loaded
  bag_length(path) -> int                number of tiles, read from the dataset shape (no data loaded)
  bag_layout(path) -> str                "wsi" | "stamp" | "clam" | "trident"
  read_bag_attrs(path) -> dict           root attributes of a bag (ours: encoder, weights_sha256, ...)
  is_complete_bag(path, *, encoder, weights_sha256) -> bool
                                         True for a readable bag of ours made by that encoder + weights
  write_bag(path, *, feats, coords_um, coords_px, provenance, dtype="float16") -> Path
                                         writes the `wsi-bag` layout atomically (see docs/architecture.md)
  upgrade_bag(path) -> bool              adds `feat_type` to a bag of ours written before it existed
  bag_info(path, *, mpp=None) -> dict    the summary `wsi info` prints
  no_bags_message(folder) -> str         "no feature bags in FOLDER", naming bag folders below it
  FORMAT, FORMAT_VERSION, LAYOUTS, FEAT_TYPE
Every reader opens a bag through `safe.open_bag_file` (one place): external links, external raw storage,
virtual datasets, soft links that dangle or loop, non-float features, shapes the file does not store and
arrays larger than the memory available are refused before any array is read.
Errors: `BagFormatError` naming the file and the missing dataset or attribute; its subclass
`NonFiniteFeaturesError` for NaN / infinite features.
"""

from wsi.formats.bags.check import (
    BadBag,
    NonFiniteFeaturesError,
    check_finite,
    find_bad_bags,
    finite_chunks,
    scan_bag,
    scan_bag_header,
)
from wsi.formats.bags.folders import bag_folders_below, no_bags_message
from wsi.formats.bags.format import FEAT_TYPE, FORMAT, FORMAT_VERSION, LAYOUTS, BagProvenance
from wsi.formats.bags.geometry import grid_step
from wsi.formats.bags.info import bag_info
from wsi.formats.bags.read import (
    Bag,
    BagHeader,
    BagStream,
    Rows,
    bag_layout,
    bag_length,
    is_complete_bag,
    load_bag,
    open_bag_stream,
    read_bag_attrs,
    read_bag_header,
)
from wsi.formats.bags.safe import available_memory, fits_in_memory
from wsi.formats.bags.write import upgrade_bag, write_bag

__all__ = [
    "FEAT_TYPE",
    "FORMAT",
    "FORMAT_VERSION",
    "LAYOUTS",
    "BadBag",
    "Bag",
    "BagHeader",
    "BagProvenance",
    "BagStream",
    "NonFiniteFeaturesError",
    "Rows",
    "available_memory",
    "bag_folders_below",
    "bag_info",
    "bag_layout",
    "bag_length",
    "check_finite",
    "find_bad_bags",
    "finite_chunks",
    "fits_in_memory",
    "grid_step",
    "is_complete_bag",
    "load_bag",
    "no_bags_message",
    "open_bag_stream",
    "read_bag_attrs",
    "read_bag_header",
    "scan_bag",
    "scan_bag_header",
    "upgrade_bag",
    "write_bag",
]
