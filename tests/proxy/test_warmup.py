"""The codec's hot schemas are prepared after start-up, one version per loop iteration, so the
first message of each version does not pay for kio's imports and the generated scanners."""

from __future__ import annotations

import asyncio

from sluice.codec import guard, messages
from sluice.codec.messages import ApiKey, codec_version_range
from sluice.codec.schemas import request_schema, response_schema
from sluice.proxy.ops import warmup


def test_every_version_of_the_hot_messages_is_prepared() -> None:
    reported: list[int] = []
    count = asyncio.run(warmup.warm(reported.append))
    assert reported == [count]
    expected = 0
    for key, request, encode in warmup.HOT:
        versions = codec_version_range(key)
        assert versions is not None
        schema_of = request_schema if request else response_schema
        for version in range(versions[0], versions[1] + 1):
            schema = schema_of(key, version)
            assert schema in messages._readers and schema in guard._scanners
            assert schema in guard._field_scanners
            if encode:
                assert schema in messages._writers
            expected += 1
    assert count == expected
    lo, hi = codec_version_range(ApiKey.PRODUCE) or (0, -1)
    assert hi - lo >= 3  # several Produce versions, each prepared

