"""The installed package's version, for provenance in every file wsi writes (`wsi.__version__` too)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wsi")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
