"""Error types for user mistakes and bad inputs.

Every subclass of `WsiError` carries a message meant for the user: it names the file or value at fault
and says what to do. The CLI prints these without a traceback; batch stages record them per slide.
"""

from __future__ import annotations


class WsiError(Exception):
    """Base for every error a user can cause or fix."""


class SlideError(WsiError):
    """A slide cannot be opened or read (missing, not a slide, truncated, unsupported)."""


class MissingMppError(SlideError):
    """A slide has no resolution in its metadata and none was given."""


class TileFileError(WsiError):
    """A tile (coordinates) file is missing, incomplete or of an unknown layout."""


class BagFormatError(WsiError):
    """A feature bag is missing a dataset or attribute that is needed to use it."""


class WeightsError(WsiError):
    """Encoder or model weights are missing, unsafe, or do not fit the architecture."""


class ConfigError(WsiError):
    """A task, preset or option is unknown or invalid."""


class LabelError(WsiError):
    """A label table is malformed or inconsistent with the task."""


class ImageReadError(WsiError):
    """A radiology/dermoscopy image cannot be read."""


class StorageError(WsiError):
    """A remote location (s3://, gs://, https://) cannot be read or written: missing bucket or object,
    credentials refused or absent, no storage library for the scheme. The message never holds a secret."""


class OutputLockedError(WsiError):
    """Another running command writes into the same output folder (on this machine or, for a remote
    folder, on any)."""


class InputFileError(WsiError):
    """A user's file that cannot be read as one: a pipe, a device or a socket where a file is read whole."""


class SlideIdError(WsiError, ValueError):
    """A slide id cannot be made into a usable file name, or collides with another slide's."""


class DiskFullError(WsiError, OSError):
    """An output could not be written: no space (or quota) left on its file system."""


class RoiError(WsiError):
    """A region-of-interest file (QuPath GeoJSON) is missing, not GeoJSON, or holds no usable region."""


class ReviewError(WsiError):
    """A review file (`wsi tile --review`, a QuPath GeoJSON export) cannot be read or does not fit the
    slide it was given for (another slide's, or other tile settings)."""
