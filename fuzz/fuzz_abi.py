"""atheris target: the filter ABI output decoder (sluice.filters.records_io), the boundary
where bytes written by an untrusted Wasm guest enter the proxy.

    python fuzz/fuzz_abi.py -max_total_time=600 fuzz/corpus/abi

Properties: decode_filter_output raises nothing but AbiError, whatever the bytes and the
expected record count; a decoded output re-encodes to bytes that decode to the same decisions.
"""

from __future__ import annotations

import _common
import atheris

with atheris.instrument_imports(include=["sluice"]):
    from sluice.filters.records_io import AbiError, decode_filter_output, encode_filter_output


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    expected = fdp.ConsumeIntInRange(0, 64)
    raw = fdp.ConsumeBytes(fdp.remaining_bytes())
    try:
        decisions, detectors = decode_filter_output(raw, expected)
    except AbiError:
        return
    assert len(decisions) == expected
    if any(n > 0xFFFFFFFF for n in detectors.values()):
        # Repeated detector names are summed, so the total may exceed the u32 that one
        # entry can carry: harmless for the proxy (a Python int), not re-encodable.
        return
    again, detectors_again = decode_filter_output(
        encode_filter_output(decisions, detectors), expected
    )
    assert [(d.action, d.key, d.value, d.headers, d.reason) for d in again] == [
        (d.action, d.key, d.value, d.headers, d.reason) for d in decisions
    ]
    assert detectors_again == detectors


if __name__ == "__main__":
    _common.run(test_one_input)
