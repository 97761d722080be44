"""Reads into many pieces of memory in one `preadv`, its iovec array built by numpy: no object per piece.

Why: `os.preadv` takes a sequence of buffer objects, one memoryview per Aperio JPEG tile made and
released in Python at about 0.5 us each, more than the kernel spends on the segment
(benchmarks/embed_feed.py). libc's `preadv` takes the iovec array itself, (address, length) pairs numpy
fills for a whole batch; ctypes releases the GIL around the call as os.preadv does. Without a libc
preadv symbol the same segments go through os.preadv. The caller keeps the memory the addresses point
into alive and writable for the call.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

import numpy as np


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):  # no sysconf, or no such name here
        n = -1
    return n if n > 0 else 1024  # POSIX's minimum is 16; every Linux and macOS has 1024


IOV_MAX = _iov_max()


def _libc_preadv() -> Any:  # the 64-bit-offset symbol where libc has both (32-bit glibc)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    for name in ("preadv64", "preadv"):
        fn = getattr(libc, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
            fn.restype = ctypes.c_ssize_t
            return fn
    return None


_PREADV = _libc_preadv()


def address(buf: bytearray | memoryview | np.ndarray) -> int:
    """The address of a writable buffer's (bytearray, memoryview, ndarray) first byte."""
    return np.frombuffer(buf, np.uint8).ctypes.data if len(buf) else 0


def iovecs(n: int) -> np.ndarray:
    """An (n, 2) array in `struct iovec`'s layout: column 0 the address, column 1 the length."""
    return np.empty((n, 2), np.uintp)


def preadv(fd: int, iov: np.ndarray, offset: int) -> int:
    """As os.preadv(fd, buffers, offset) with the buffers given as an iovec array (at most IOV_MAX rows):
    bytes read, fewer than asked only at the end of the file; OSError on failure."""
    iov = np.ascontiguousarray(iov, np.uintp)
    if len(iov) > IOV_MAX:
        raise ValueError(f"{len(iov)} segments in one preadv, more than IOV_MAX {IOV_MAX}")
    if _PREADV is None:
        return _os_preadv(fd, iov, offset)
    while True:
        got = _PREADV(fd, iov.ctypes.data, len(iov), offset)
        if got >= 0:
            return int(got)
        err = ctypes.get_errno()
        if err != errno.EINTR:  # retried, as os.preadv retries it (PEP 475)
            raise OSError(err, os.strerror(err))


def _os_preadv(fd: int, iov: np.ndarray, offset: int) -> int:
    """The same read through os.preadv: a memoryview over each segment's memory."""
    views = [memoryview((ctypes.c_char * int(n)).from_address(int(a))).cast("B") for a, n in iov.tolist()]
    return os.preadv(fd, views, offset)
