"""A memoryview of bytes at an address (guest memory, a section decompressed in place),
without a ctypes array type per length.

``(ctypes.c_ubyte * n).from_address(a)`` makes a new array type for every new length n:
ctypes caches those types only weakly, so each batch of a new size (every batch a broker
sends) built one (10-50 µs, more as the cyclic collector gathers them) and left it for the
collector. `PyMemoryView_FromMemory` makes the view directly.
"""

from __future__ import annotations

import ctypes
from typing import Final

__all__ = ["view_at"]

_PYBUF_WRITE: Final = 0x200

_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_from_memory.restype = ctypes.py_object


def view_at(address: int, size: int) -> memoryview:
    """A writable view (format "B") of the `size` bytes at `address`. It does not own them:
    the caller keeps them valid, and holds the view no longer than that."""
    view: memoryview = _from_memory(address, size, _PYBUF_WRITE)
    return view
