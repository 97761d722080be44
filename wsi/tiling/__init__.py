"""Finding tissue and judging tiles: the tissue mask, the physical tile grid, the background, blur and
artifact filters, their settings (TileParams) and the QC picture."""
