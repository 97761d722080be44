"""QuPath objects in and out: GeoJSON in level-0 pixels, as QuPath's File > Import objects reads it.

  write.py    QuPathClass, feature, tile_features, ranked_tiles (top tiles), polygon_geometry,
              feature_collection, write_geojson (atomic), class_name, measurement_value, box_ring,
              palette_color, OBJECT_TYPES
  read.py     read_roi -> Roi (include / exclude polygons, contains(points)), roi_file_for, is_excluded,
              load_geojson (also QuPath's .zip / .gz exports)
  review.py   read_review -> ReviewFile (tile boxes with the reviewer's classes, Exclude regions), class_of
  outline.py  mask_polygons(mask, scale=) -> polygons with holes in level-0 px
Each module cites the QuPath source it follows (qupath/qupath at e7662d89ec70); the rules are tested in
tests/helpers/qupath_rules.py.
"""

from wsi.formats.qupath.outline import mask_polygons
from wsi.formats.qupath.read import Polygon, Roi, is_excluded, read_roi, roi_file_for
from wsi.formats.qupath.review import ReviewFile, class_of, read_review
from wsi.formats.qupath.write import (
    OBJECT_TYPES,
    RGB,
    QuPathClass,
    box_ring,
    class_name,
    feature,
    feature_collection,
    measurement_value,
    palette_color,
    polygon_geometry,
    ranked_tiles,
    tile_features,
    write_geojson,
)

__all__ = [
    "OBJECT_TYPES",
    "RGB",
    "Polygon",
    "QuPathClass",
    "ReviewFile",
    "Roi",
    "box_ring",
    "class_name",
    "class_of",
    "feature",
    "feature_collection",
    "is_excluded",
    "mask_polygons",
    "measurement_value",
    "palette_color",
    "polygon_geometry",
    "ranked_tiles",
    "read_review",
    "read_roi",
    "roi_file_for",
    "tile_features",
    "write_geojson",
]
