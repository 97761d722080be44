"""wsi's files and the ones it reads from others: tile files, feature bags, per-tile values, QuPath GeoJSON,
and folder summaries of them."""
