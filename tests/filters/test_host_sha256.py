"""The host_sha256 capability (docs/FILTER_ABI.md): the host hashes the SHA-256 requests a
guest lists after a ``sluice_filter_records`` call, in one native call per batch.

The native pass (filters/host_sha256.c) against hashlib on generated salts and fields (the
four-lane SHA-NI path and its AVX-512 build, each forced in turn, the OpenSSL path for longer
ones, salts of whole blocks, fields at the ends of memory on each path), every limit it
enforces on a hostile table, and random tables that must never write outside the records
section nor anything at all when refused; then through the host with hand-written modules: a
hostile slot refuses the load, a hostile table sends the batch down the decoding path, and a
module without the capability is left alone.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filters import host_sha256
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.abi_sluice import SluiceAbi
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.guest import GuestFailure
from sluice.filters.module_cache import ModuleCache
from sluice.filters.runtime import LoadedFilter, load_filter

pytestmark = pytest.mark.skipif(not host_sha256.AVAILABLE,
                                reason="filters/_host_sha256 not built (scripts/dev.sh install)")

MEM = 1 << 16
SLOT = 16
TABLE = 4096
SPANS = 8192
OUT = 32768
PLACEHOLDER = b"0" * 64
CTX = RecordContext("orders", 0, "produce", "client-1", None)


def _entry(prefix: tuple[int, int], data: tuple[int, int], out: int) -> bytes:
    return struct.pack("<5I", prefix[0], prefix[1], data[0], data[1], out)


class Image:
    """A guest memory laid out as a records call leaves it: the slot, a table, the spans, and an
    output of one record whose records section holds `digests` placeholders."""

    def __init__(self, pairs: list[tuple[bytes, bytes]], records: int = 1) -> None:
        self.mem = bytearray(MEM)
        self.records = records
        self.section = OUT + 4 + records + 4
        sec_len = 2 + 66 * len(pairs)
        struct.pack_into("<I", self.mem, OUT, records)
        self.mem[OUT + 4:OUT + 4 + records] = b"\x01" * records
        struct.pack_into("<i", self.mem, OUT + 4 + records, sec_len)
        self.out_len = 4 + records + 4 + sec_len + 8
        self.sec_len = sec_len
        table = b""
        at = SPANS
        for i, (salt, data) in enumerate(pairs):
            self.mem[at:at + len(salt)] = salt
            self.mem[at + len(salt):at + len(salt) + len(data)] = data
            out = self.section + 1 + 66 * i + 1
            self.mem[out:out + 64] = PLACEHOLDER
            table += _entry((at, len(salt)), (at + len(salt), len(data)), out)
            at += len(salt) + len(data)
        self.mem[TABLE:TABLE + len(table)] = table
        struct.pack_into("<II", self.mem, SLOT, TABLE, len(pairs))

    def run(self, mem_size: int = MEM, hs_run: Any = None) -> tuple[int, bytes]:
        buf = (ctypes.c_ubyte * MEM).from_buffer(self.mem)
        hs_run = hs_run or host_sha256.hs_run
        assert hs_run is not None
        done = hs_run(ctypes.addressof(buf), mem_size, SLOT, OUT, self.out_len, self.records)
        del buf
        return done, bytes(self.mem)

    def digest_at(self, i: int) -> bytes:
        out = self.section + 1 + 66 * i + 1
        return bytes(self.mem[out:out + 64])


def _hex(salt: bytes, data: bytes) -> bytes:
    return hashlib.sha256(salt + data).hexdigest().encode()


def _hashed_as_hashlib(pairs: list[tuple[bytes, bytes]]) -> None:
    image = Image(pairs)
    done, _ = image.run()
    assert done == len(pairs)
    assert [image.digest_at(i) for i in range(len(pairs))] == [_hex(s, d) for s, d in pairs]


_PAIRS = st.lists(st.tuples(st.sampled_from([b"", b"pepper", b"p" * 55, b"q" * 64, b"r" * 130]),
                           st.binary(max_size=140)), min_size=1, max_size=11)


@pytest.fixture(params=[0, 1, 2], ids=["openssl", "sha-ni", "sha-ni-avx512"])
def code_path(request: pytest.FixtureRequest) -> Iterator[int]:
    """Each code path of the pass this CPU can run (the CPU picks the fastest by default)."""
    assert host_sha256.hs_set_level is not None
    level: int = request.param
    try:
        if host_sha256.hs_set_level(level) != level:
            pytest.skip(f"this CPU cannot run code path {level}")
        yield level
    finally:
        host_sha256.hs_reset_level()


@settings(max_examples=200, deadline=None)
@given(_PAIRS)
def test_digests_are_sha256_of_salt_and_field(pairs: list[tuple[bytes, bytes]]) -> None:
    """Any mix of one-block requests (four at a time, spare lanes redoing one) and longer ones,
    a salt's midstate reused while it repeats."""
    _hashed_as_hashlib(pairs)


def test_every_code_path_gives_the_same_digests(code_path: int) -> None:
    """The OpenSSL path, the SHA-NI lanes and their AVX-512 build, each forced in turn:
    generated requests of every shape hash as hashlib does."""
    @settings(max_examples=60, deadline=None)
    @given(_PAIRS)
    def check(pairs: list[tuple[bytes, bytes]]) -> None:
        _hashed_as_hashlib(pairs)
    check()


def test_a_cap_below_the_openssl_path_is_the_openssl_path() -> None:
    """No cap picks SHA-NI code the caller ruled out (or a CPU lacks: a fault)."""
    assert host_sha256.hs_set_level is not None
    try:
        assert host_sha256.hs_set_level(-1) == 0
        _hashed_as_hashlib([(b"pepper", b"ann@example.com")] * 5)
    finally:
        host_sha256.hs_reset_level()


def test_the_default_path_is_the_512_bit_one_on_amd_only() -> None:
    """Uncapped, the pass takes its AVX-512 build only on an AMD CPU (slower on the Intel
    Xeon it was measured on); elsewhere at most the SHA-NI lanes. A cap and a reset move it."""
    assert host_sha256.hs_set_level is not None and host_sha256.hs_reset_level is not None
    vendor = next((line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("vendor_id")), "")
    try:
        best = host_sha256.hs_set_level(2)  # what this CPU can run at most
        assert host_sha256.hs_set_level(0) == 0
        default = host_sha256.hs_reset_level()
        assert default == (best if vendor == "AuthenticAMD" else min(best, 1))
    finally:
        host_sha256.hs_reset_level()


def test_a_build_without_the_sha_ni_lanes_has_every_function(tmp_path: Path) -> None:
    """What a CPU other than x86-64 compiles (HS_PORTABLE leaves the SHA-NI code out, as
    there): every function the module declares links, and it hashes on the OpenSSL path."""
    import importlib.util

    from cffi import FFI

    from sluice.filters import host_sha256_build

    ffi = FFI()
    ffi.cdef(host_sha256_build.CDEF)
    ffi.set_source("_hs_portable", (host_sha256_build.HERE / "host_sha256.c").read_text(),
                   libraries=["crypto"],
                   extra_compile_args=["-O1", "-Wno-deprecated-declarations", "-DHS_PORTABLE"])
    built = ffi.compile(tmpdir=str(tmp_path))
    spec = importlib.util.spec_from_file_location("_hs_portable", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lib = module.lib
    assert lib.hs_set_level(2) == 0
    pairs = [(b"pepper", b"ann@example.com"), (b"", b"x" * 70), (b"q" * 64, b"")] * 3
    image = Image(pairs)
    done, _ = image.run(hs_run=lib.hs_run)
    assert done == len(pairs)
    assert [image.digest_at(i) for i in range(len(pairs))] == [_hex(s, d) for s, d in pairs]


_AROUND = (st.lists(st.tuples(st.sampled_from([b"", b"pepper", b"s" * 40, b"q" * 64 + b"tail"]),
                             st.binary(min_size=1, max_size=14)), min_size=1, max_size=9),
           st.sampled_from([0x00, 0x80, 0xFF]))


def test_fields_among_other_bytes_and_at_the_ends_of_memory(code_path: int) -> None:
    """The one-block message takes only the field's bytes from memory, whatever lies around
    them (the SHA-NI path reads the 64 bytes from field - salt tail at once and masks the rest,
    the AVX-512 path loads the field's bytes alone with a masked load), and a field too close
    to either end of memory for a whole read is still hashed (the SHA-NI path's copies; the
    masked load reads nothing outside the field): on each code path in turn."""
    @settings(max_examples=60, deadline=None)
    @given(*_AROUND)
    def check(pairs: list[tuple[bytes, bytes]], fill: int) -> None:
        _hashed_among(pairs, fill)
    check()


def _hashed_among(pairs: list[tuple[bytes, bytes]], fill: int) -> None:
    image = Image(pairs)
    spans = SPANS + 2048
    image.mem[spans:OUT] = bytes([fill]) * (OUT - spans)
    image.mem[MEM - 64:] = bytes([fill]) * 64
    at = spans + 1
    for i, (_, data) in enumerate(pairs):
        if i == 0:
            where = MEM - len(data)  # the last bytes of memory
        elif i == 1:
            where = 1  # fewer bytes before it than a salt tail (ends before the slot)
        else:
            where = at
            at += len(data) + 7
        image.mem[where:where + len(data)] = data
        _set_entry(image, i, 2, where)
    done, _ = image.run()
    assert done == len(pairs)
    assert [image.digest_at(i) for i in range(len(pairs))] == [_hex(s, d) for s, d in pairs]


def test_fields_at_the_ends_of_memory_between_unreadable_pages(code_path: int) -> None:
    """Guest memory between two pages the process may not read (as wasmtime's guard
    regions): fields at its first and last bytes hash without a fault on every code path
    (the AVX-512 path's masked load touches no byte of the 64 it spans but the field's)."""
    pairs = [(b"pepper", b"first@ex.com"), (b"pepper", b"last@example.com"),
             (b"", b"example.com"), (b"s" * 40, b"m")]  # the last three end memory
    image = Image(pairs)
    _set_entry(image, 0, 2, 0)  # ends before the slot at 16
    image.mem[0:len(pairs[0][1])] = pairs[0][1]
    for i in (1, 2, 3):
        _set_entry(image, i, 2, MEM - len(pairs[i][1]))
    image.mem[MEM - len(pairs[1][1]):] = pairs[1][1]
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, MEM + 2 * page)
    cell = ctypes.c_char.from_buffer(area)
    base = ctypes.addressof(cell)
    mprotect = ctypes.CDLL(None, use_errno=True).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        area[page:page + MEM] = bytes(image.mem)
        assert mprotect(base, page, 0) == 0  # PROT_NONE
        assert mprotect(base + page + MEM, page, 0) == 0
        assert host_sha256.hs_run is not None
        done = host_sha256.hs_run(base + page, MEM, SLOT, OUT, image.out_len, image.records)
        image.mem[:] = area[page:page + MEM]
    finally:
        mprotect(base, MEM + 2 * page, mmap.PROT_READ | mmap.PROT_WRITE)
        del cell
        area.close()
    assert done == len(pairs)
    assert [image.digest_at(i) for i in range(len(pairs))] == [_hex(s, d) for s, d in pairs]


def test_an_empty_slot_writes_nothing() -> None:
    image = Image([(b"s", b"v")])
    struct.pack_into("<I", image.mem, SLOT + 4, 0)
    before = bytes(image.mem)
    assert image.run() == (0, before)


def _refused(image: Image, code: int, mem_size: int = MEM) -> None:
    before = bytes(image.mem)
    done, after = image.run(mem_size)
    assert done == code, host_sha256.error_text(done)
    assert after == before, "a refused table wrote into guest memory"


def _set_entry(image: Image, i: int, field: int, value: int) -> None:
    struct.pack_into("<I", image.mem, TABLE + 20 * i + 4 * field, value)


def test_a_slot_outside_memory_is_refused() -> None:
    image = Image([(b"s", b"v")])
    before = bytes(image.mem)
    buf = (ctypes.c_ubyte * MEM).from_buffer(image.mem)
    assert host_sha256.hs_run is not None
    assert host_sha256.hs_run(ctypes.addressof(buf), MEM, MEM - 4, OUT, image.out_len, 1) == -1
    del buf
    assert bytes(image.mem) == before


@pytest.mark.parametrize("table, count, code", [
    (MEM - 20, 2, -2),                           # runs past the end of memory
    (0xFFFFFFF0, 1, -2),                         # wraps around
    (TABLE, host_sha256.MAX_ENTRIES + 1, -3),    # too many entries
    (OUT + 12, 1, -5),                           # inside the records section
])
def test_a_hostile_table_is_refused(table: int, count: int, code: int) -> None:
    image = Image([(b"s", b"v")])
    struct.pack_into("<II", image.mem, SLOT, table, count)
    _refused(image, code)


def test_requests_for_an_output_without_a_records_section_are_refused() -> None:
    image = Image([(b"s", b"v")])
    struct.pack_into("<i", image.mem, OUT + 5, -1)  # records_len -1: nothing changed
    _refused(image, -4)
    image = Image([(b"s", b"v")])
    struct.pack_into("<I", image.mem, OUT, 2)  # fates for another number of records
    _refused(image, -4)
    image = Image([(b"s", b"v")])
    struct.pack_into("<i", image.mem, OUT + 5, image.sec_len + 100)  # past the output
    _refused(image, -4)


@pytest.mark.parametrize("field, value, code", [
    (0, MEM - 2, -6),               # the salt runs past the end of memory
    (1, 0xFFFFFFFF, -6),            # a salt length that wraps
    (2, MEM, -6),                   # the field starts past the end
    (2, OUT + 10, -6),              # the field lies inside the records section
    (4, OUT, -7),                   # the digest before the records section
    (4, MEM - 32, -7),              # the digest past the section (and the memory)
])
def test_a_hostile_entry_is_refused(field: int, value: int, code: int) -> None:
    image = Image([(b"salt", b"field"), (b"salt", b"other")])
    _set_entry(image, 1, field, value)
    _refused(image, code)


def test_digests_out_of_order_or_overlapping_are_refused() -> None:
    image = Image([(b"s", b"a"), (b"s", b"b")])
    first = struct.unpack_from("<I", image.mem, TABLE + 16)[0]
    _set_entry(image, 1, 4, first + 32)  # overlaps the first digest
    _refused(image, -7)
    image = Image([(b"s", b"a"), (b"s", b"b")])
    second = struct.unpack_from("<I", image.mem, TABLE + 20 + 16)[0]
    _set_entry(image, 0, 4, second)
    _set_entry(image, 1, 4, first)
    _refused(image, -7)


def test_a_digest_that_does_not_replace_a_placeholder_is_refused() -> None:
    image = Image([(b"s", b"a"), (b"s", b"b")])
    image.mem[image.section + 1 + 66 + 1 + 63] = ord("x")
    _refused(image, -8)


def test_more_requests_than_the_records_allow_are_refused() -> None:
    """Found in review: the pass runs outside the guest's deadline, which grows per record, and
    each request costs a compression however short its spans; a one-record batch could ask for
    1M of them (~60 ms). At most `MAX_PER_RECORD` per record of the batch."""
    per = host_sha256.MAX_PER_RECORD
    image = Image([(b"s", b"v")] * (per + 1))
    _refused(image, -3)
    image = Image([(b"s", b"v")] * (2 * per + 1), records=2)
    _refused(image, -3)
    image = Image([(b"s", bytes([i])) for i in range(2 * per)], records=2)
    done, _ = image.run()
    assert done == 2 * per
    assert image.digest_at(2 * per - 1) == _hex(b"s", bytes([2 * per - 1]))


def test_requests_over_the_byte_budget_are_refused() -> None:
    """130 requests each hashing 32 KiB (spans may overlap, but not the records section)."""
    image = Image([(b"", b"x")] * 130, records=3)
    for i in range(130):
        _set_entry(image, i, 0, 0)
        _set_entry(image, i, 1, 32768)
    _refused(image, -9)


@settings(max_examples=300, deadline=None)
@given(table=st.binary(min_size=8, max_size=8 + 20 * 6), at=st.integers(0, MEM - 128),
       count=st.integers(0, 8), sec_len=st.integers(-2, 600))
def test_random_tables_never_write_outside_the_records_section(
        table: bytes, at: int, count: int, sec_len: int) -> None:
    """Fuzz: random slots and tables over a memory whose records section holds placeholders;
    the pass either hashes or refuses, and only ever writes inside the section."""
    image = Image([(b"s", b"v")] * 4)
    struct.pack_into("<i", image.mem, OUT + 5, sec_len)
    image.mem[at:at + len(table)] = table
    struct.pack_into("<II", image.mem, SLOT, at, count)
    before = bytes(image.mem)
    done, after = image.run()
    lo = image.section
    hi = lo + max(struct.unpack_from("<i", before, OUT + 5)[0], 0)
    assert after[:lo] == before[:lo] and after[hi:] == before[hi:]
    if done < 0:
        assert after == before
        assert done in range(-9, 0)
    else:
        assert done <= count


# -- through the host --------------------------------------------------------------------------

def _wat(memory: bytes, slot: int | None, out_len: int, records_body: str | None = None,
         alloc_body: str = "(i32.const 61440)") -> str:
    """A Sluice module whose records call returns the output at OUT (`out_len` bytes) of the
    given memory image (or runs `records_body`), whose sluice_alloc runs `alloc_body` and whose
    sluice_filter keeps every record; `slot`: the answer of sluice_host_sha256 (None: no such
    export)."""
    used = memory.rstrip(b"\x00")
    data = "".join(f"\\{b:02x}" for b in used)
    keep = "\\01\\00\\00\\00\\00\\00\\00\\00\\00"  # 1 record: keep; no detectors
    offer = "" if slot is None else (
        f'(func (export "sluice_host_sha256") (result i32) (i32.const {slot}))')
    return f"""
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "{data}")
  (data (i32.const 60000) "{keep}")
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) {alloc_body})
  (func (export "sluice_filter") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 60000) (i64.const 32)) (i64.const 9)))
  (func (export "sluice_filter_records") (param i32 i32) (result i64)
    {records_body or f"(i64.or (i64.shl (i64.const {OUT}) (i64.const 32)) (i64.const {out_len}))"})
  {offer}
)
"""


def _load(tmp_path: Path, cache: ModuleCache, wat: str, timeout_ms: int = 100) -> LoadedFilter:
    path = tmp_path / "m.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    return load_filter(FilterSpec(name="m", module=str(path), topics=("*",),
                                  apply_to=frozenset({"produce"}), timeout_ms=timeout_ms),
                       cache=cache)


def test_the_host_fills_in_the_digests_a_module_asks_for(tmp_path: Path,
                                                         module_cache: ModuleCache) -> None:
    pairs = [(b"pepper", b"user@example.com"), (b"q" * 64, b"x" * 90)]
    image = Image(pairs)
    f = _load(tmp_path, module_cache, _wat(bytes(image.mem), SLOT, image.out_len))
    try:
        assert "host_sha256" in f.capabilities
        out = f.run_native(CTX, b"", 1)
        assert out is not None and out.records is not None
        want = b"\x00" + b"".join(b"\x00" + _hex(s, d) + b"\x00" for s, d in pairs) + b"\x00"
        assert bytes(out.records) == want
    finally:
        f.close()


def test_a_module_without_the_capability_is_left_alone(tmp_path: Path,
                                                       module_cache: ModuleCache) -> None:
    image = Image([(b"pepper", b"user@example.com")])
    f = _load(tmp_path, module_cache, _wat(bytes(image.mem), None, image.out_len))
    try:
        assert "host_sha256" not in f.capabilities
        out = f.run_native(CTX, b"", 1)
        assert out is not None and out.records is not None
        assert bytes(out.records) == b"\x00\x00" + PLACEHOLDER + b"\x00\x00"
    finally:
        f.close()


@pytest.mark.parametrize("slot", [MEM - 4, MEM + 64, 18])
def test_a_slot_outside_memory_refuses_the_load(tmp_path: Path, module_cache: ModuleCache,
                                                slot: int) -> None:
    image = Image([(b"s", b"v")])
    with pytest.raises(FilterLoadError, match=f"sluice_host_sha256 returned slot {slot}"):
        _load(tmp_path, module_cache, _wat(bytes(image.mem), slot, image.out_len))


def test_a_hostile_table_sends_the_batch_down_the_decoding_path(
        tmp_path: Path, module_cache: ModuleCache) -> None:
    image = Image([(b"s", b"v")])
    _set_entry(image, 0, 2, OUT + 10)  # a span inside the records section
    f = _load(tmp_path, module_cache, _wat(bytes(image.mem), SLOT, image.out_len))
    try:
        assert f.run_native(CTX, b"", 1) is None
        assert f.native_fallbacks == 1
        result = f.run_batch(CTX, [FilterRecord(0, 0, b"k", b"v", [])])
        assert [d.action for d in result.decisions] == [Action.KEEP]
    finally:
        f.close()


# -- the pass inside the fused records call (native_call.NativeCall; its other failures, with
# and without the pass: tests/filters/test_native_call.py) ---------------------------------

def _runner(f: LoadedFilter) -> SluiceAbi:
    runner = f._runner
    assert isinstance(runner, SluiceAbi)
    return runner


def _failure(f: LoadedFilter) -> GuestFailure:
    """How the records call of `f`'s instance fails (it must), and that the filter falls back."""
    with pytest.raises(GuestFailure) as caught:
        _runner(f).run_native(CTX, b"", 1, 0, 0)
    assert f.run_native(CTX, b"", 1) is None
    assert f.native_fallbacks == 1
    return caught.value


def test_a_refused_table_fails_as_invalid_output_and_falls_back(
        tmp_path: Path, module_cache: ModuleCache) -> None:
    image = Image([(b"s", b"v")])
    image.mem[image.section + 2] = ord("x")  # a digest's place that is not a placeholder
    f = _load(tmp_path, module_cache, _wat(bytes(image.mem), SLOT, image.out_len))
    try:
        failure = _failure(f)
        assert failure.kind == "invalid-output"
        assert failure.message == host_sha256.error_text(-8)
        result = f.run_batch(CTX, [FilterRecord(0, 0, b"k", b"v", [])])
        assert [d.action for d in result.decisions] == [Action.KEEP]
    finally:
        f.close()
