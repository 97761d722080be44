"""Feature bags: the one package that writes ours, reads and sniffs ours, STAMP's, CLAM's and TRIDENT's,
and summarises a bag. Nothing else in the project opens a bag with h5py.

Bags from different tools disagree on names (`feats` vs `features`) and units (micrometres vs level-0
pixels); everything downstream reads them through `read_bag` (or `open_bag_stream`, features chunk by
chunk), so it sees one shape: features (N, D) and top-left coordinates in micrometres. Every reader opens
a file through `safe.open_bag_file`, which refuses links, virtual or external storage, non-float features
and arrays larger than the memory there is before any array is read. Errors: `BagFormatError` naming the
file and what is missing; `NonFiniteFeaturesError` for NaN / infinite features.

  read.py     Bag, read_bag, open_bag_stream, bag_layout, read_bag_header, read_bag_attrs, bag_length,
              is_complete_bag (a readable bag of ours by that encoder and weights)
  write.py    write_bag (the `wsi-bag` layout, atomically), upgrade_bag (adds `feat_type`)
  check.py    check_finite, finite_chunks, find_bad_bags, scan_bag, scan_bag_header (bounded memory)
  format.py   BagProvenance, FORMAT, FORMAT_VERSION, LAYOUTS, FEAT_TYPE
  others      grid_step (geometry.py), available_memory and fits_in_memory (safe.py), bag_info (info.py),
              no_bags_message and bag_folders_below (folders.py)
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
    read_bag,
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
    "read_bag",
    "read_bag_attrs",
    "read_bag_header",
    "scan_bag",
    "scan_bag_header",
    "upgrade_bag",
    "write_bag",
]
