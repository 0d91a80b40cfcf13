"""atheris target: the framer, request headers and kio message decoding (sluice.codec).

    python fuzz/fuzz_frames.py -max_total_time=600 fuzz/corpus/frames

Properties: FrameBuffer hands back exactly the framed bodies whatever the chunking;
parse_request_header, decode_request and decode_response raise nothing but CodecError, for
every API key and version the codec covers (a kio abort would kill the fuzzer: that is the
finding the guard exists to prevent).
"""

from __future__ import annotations

import _common
import atheris

with atheris.instrument_imports(include=["sluice"]):
    from sluice.codec.errors import CodecError
    from sluice.codec.frames import FrameBuffer, frame
    from sluice.codec.guard import fields_end
    from sluice.codec.headers import parse_request_header
    from sluice.codec.messages import ApiKey, codec_version_range, decode_request, decode_response
    from sluice.codec.schemas import response_schema

_TARGETS = [
    (int(key), version)
    for key in ApiKey
    if (span := codec_version_range(int(key))) is not None
    for version in range(span[0], span[1] + 1)
]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    api_key, version = _TARGETS[fdp.ConsumeIntInRange(0, len(_TARGETS) - 1)]
    request = fdp.ConsumeBool()
    chunk = fdp.ConsumeIntInRange(1, 64)
    body = fdp.ConsumeBytes(fdp.remaining_bytes())

    buffer = FrameBuffer(max_frame_size=1 << 20)
    stream = frame(body) + frame(body[: len(body) // 2])
    out: list[bytes] = []
    for i in range(0, len(stream), chunk):
        out.extend(bytes(b) for b in buffer.feed(stream[i : i + chunk]))
    assert out == [body, body[: len(body) // 2]], "framer lost or altered a frame"
    assert buffer.pending == 0

    try:
        parse_request_header(body)
    except CodecError:
        pass
    try:
        if request:
            decode_request(api_key, version, body)
        else:
            decode_response(api_key, version, body)
    except CodecError:
        pass
    if not request:
        try:
            end = fields_end(response_schema(api_key, version), body)
        except CodecError:
            return
        assert 0 <= end <= len(body)


if __name__ == "__main__":
    _common.run(test_one_input)
