"""wsi: whole-slide images to tiles, feature bags and slide-level predictions."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wsi")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
