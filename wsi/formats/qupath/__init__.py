"""QuPath objects in and out: GeoJSON in level-0 pixels, as QuPath's File > Import objects reads it.

Public API:
  write (wsi.formats.qupath.write): QuPathClass.of(name, color), feature(geometry, object_type=,
  classification=,
      name=, measurements=, metadata=), tile_features(coords_px, size_px, ...), polygon_geometry(polys),
      feature_collection(features, properties), write_geojson(path, collection) (atomic), class_name,
      measurement_value, box_ring, palette_color, OBJECT_TYPES
  read (wsi.formats.qupath.read): read_roi(path) -> Roi (include / exclude polygons, sha256,
  contains(points)),
      roi_file_for(roi FILE|DIR, slide_id), is_excluded(classification)
  review (wsi.formats.qupath.review): read_review(path) -> ReviewFile (tile boxes with the reviewer's classes,
      Exclude regions), class_of(classification); read.load_geojson also reads QuPath's .zip / .gz exports
  outline (wsi.formats.qupath.outline): mask_polygons(mask, scale=) -> polygons with holes in level-0 px

Each module's docstring cites the QuPath source it follows (qupath/qupath at e7662d89ec70).
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
    "read_review",
    "read_roi",
    "roi_file_for",
    "tile_features",
    "write_geojson",
]
