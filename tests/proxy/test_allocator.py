"""proxy/ops/allocator.py: batch-sized buffers come from the heap, not fresh mappings."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A fresh interpreter each (the thresholds are process-wide and glibc's own threshold moves
# with what was freed before): how many of glibc's blocks are mappings of their own
# (mallinfo2's hblks) while a buffer of the given size is alive.
_PROBE = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "on":
    from sluice.proxy.ops.allocator import keep_batch_buffers
    assert keep_batch_buffers()
before = libc.mallinfo2().hblks
batch = b"h" + b"x" * int(sys.argv[2])
print(libc.mallinfo2().hblks - before)
"""


def mapped_blocks(mode: str, size: int = 4 << 20) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(size)], check=True,
                         capture_output=True, text=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_batch_sized_buffer_is_carved_from_the_heap() -> None:
    # By default glibc maps anything over 128 KiB afresh (and unmaps it when freed): every
    # rebuilt batch was faulted in page by page. With the proxy's setting it is heap memory,
    # reused batch after batch.
    assert mapped_blocks("off") >= 1
    assert mapped_blocks("on") == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_fetch_response_sized_buffer_is_carved_from_the_heap() -> None:
    # A filtered Fetch response is received and spliced as one buffer of its whole size, just
    # over max.partition.fetch.bytes per partition (8 MiB in bench_proxy): mapped afresh and
    # faulted in on every response under an 8 MiB threshold.
    assert mapped_blocks("off", 12 << 20) >= 1
    assert mapped_blocks("on", 12 << 20) == 0
