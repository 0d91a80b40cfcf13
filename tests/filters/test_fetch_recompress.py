"""A masked lz4 fetch recompressed at a higher acceleration (codec/lz4_frame.py FAST_LEVEL)
against the level-0 recompression it replaced: the same batches, the same header fields, the
same records byte for byte once decompressed; uncompressed responses byte-identical."""

from __future__ import annotations

from collections.abc import Iterator

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import lz4_frame
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch,
    records_section,
    split_batches,
    verify_crc,
)
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch

pytestmark = pytest.mark.skipif(not lz4_frame.AVAILABLE, reason="no liblz4.so.1 on this host")

FETCH = RecordContext("orders", 0, "fetch", "app", None)

values_st = st.lists(
    st.one_of(
        st.builds(lambda i, n: (b'{"email": "user%d@example.com", "card": "4111 1111 1111 1111",'
                                b' "note": "%s"}' % (i, b"x" * n)),
                  st.integers(0, 10**6), st.integers(0, 300)),
        st.binary(max_size=200),
    ),
    min_size=1, max_size=60)


@pytest.fixture(scope="module")
def chain() -> Iterator[FilterChain]:
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                      apply_to=frozenset({"fetch"}))
    made = FilterChain.from_specs([spec])
    yield made
    made.close()


def _batches(values: list[bytes], codec: int, size: int) -> bytes:
    out = []
    for start in range(0, len(values), size):
        chunk = values[start:start + size]
        recs = [Record(j, j, None, v, []) for j, v in enumerate(chunk)]
        n = len(recs)
        out.append(build_batch(BatchHeader(100 + start, 0, 0, 2, 0, codec, n - 1, 1_700_000_000,
                                           1_700_000_000 + n - 1, -1, -1, -1, n), recs))
    return b"".join(out)


def _old_and_new(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[bytes, bytes]:
    new = bytes(filter_fetch(chain, FETCH, data).records)
    with monkeypatch.context() as m:
        m.setattr(lz4_frame, "_FAST_PREFS", lz4_frame._PREFS)  # level 0, as before
        old = bytes(filter_fetch(chain, FETCH, data).records)
    return old, new


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=values_st, codec=st.sampled_from([CODEC_NONE, CODEC_LZ4]),
       size=st.integers(1, 25))
def test_fast_recompression_gives_the_same_response(chain: FilterChain, values: list[bytes],
                                                    codec: int, size: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = _old_and_new(chain, _batches(values, codec, size), monkeypatch)
    if codec == CODEC_NONE:
        assert new == old
        return
    (olds, old_tail), (news, new_tail) = split_batches(old), split_batches(new)
    assert len(olds) == len(news) and not len(old_tail) and not len(new_tail)
    for was, now in zip(olds, news, strict=True):
        assert verify_crc(now.data)
        # Every field but the length and the CRC (which cover the new lz4 bytes).
        assert bytes(now.data[:8]) == bytes(was.data[:8])
        assert bytes(now.data[12:17]) == bytes(was.data[12:17])
        assert bytes(now.data[21:HEADER_SIZE]) == bytes(was.data[21:HEADER_SIZE])
        assert bytes(records_section(now)) == bytes(records_section(was))
        if now.header.compression == CODEC_LZ4 and now.header.record_count:
            # A second, independent reader of the new frame.
            assert bytes(cramjam.lz4.decompress(bytes(now.data[HEADER_SIZE:]))) == bytes(
                records_section(was))
