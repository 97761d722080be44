"""JSON as a type, for the few values that are free-form by nature.

`JsonValue` is what a JSON document (or an HDF5 attribute read as plain Python, `wsi.formats.hdf5.plain`) can
hold; `JsonObject` one JSON object. They type data whose keys this project does not decide: attributes
of a foreign bag (CLAM, TRIDENT, STAMP), a stored settings record compared as a whole (a tile file's
`params`, written by whichever version made it), a user's GeoJSON properties, a YAML file before it is
validated. Data whose keys the code reads has a TypedDict or a dataclass of its own instead.

For mypy the aliases are the recursive JSON type, so a reader must narrow a value before using it. At
run time they are `Any`: pydantic records that hold such a mapping validate it exactly as before (a
mapping, contents unchecked), so no stored file changes meaning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    JsonValue: TypeAlias = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
else:
    JsonValue = Any
JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
