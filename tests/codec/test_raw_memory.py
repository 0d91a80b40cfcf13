"""codec/raw_memory.py: a view of bytes at an address reads and writes them in place, and
views of many sizes leave no ctypes type behind each (what `(c_ubyte * n).from_address`
did)."""

from __future__ import annotations

import ctypes
import gc

from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.raw_memory import view_at


@given(data=st.binary(min_size=1, max_size=4096), at=st.integers(0, 100))
def test_a_view_reads_and_writes_the_bytes_where_they_lie(data: bytes, at: int) -> None:
    buf = ctypes.create_string_buffer(len(data) + 200)
    ctypes.memmove(ctypes.addressof(buf) + at, data, len(data))
    view = view_at(ctypes.addressof(buf) + at, len(data))
    assert (view.format, view.nbytes, view.readonly) == ("B", len(data), False)
    assert bytes(view) == data
    view[0] = data[0] ^ 0xFF
    assert buf.raw[at] == data[0] ^ 0xFF
    assert buf.raw[at + 1:at + len(data)] == data[1:]


def test_views_of_new_sizes_make_no_types() -> None:
    buf = ctypes.create_string_buffer(1 << 16)
    address = ctypes.addressof(buf)
    gc.collect()
    before = sum(isinstance(o, type) for o in gc.get_objects())
    views = [view_at(address, 1000 + n) for n in range(300)]
    after = sum(isinstance(o, type) for o in gc.get_objects())
    assert [v.nbytes for v in views] == [1000 + n for n in range(300)]
    assert after - before < 10  # (c_ubyte * n) made 300
