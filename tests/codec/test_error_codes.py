"""The project's error-code enum is Kafka's list, as kio generates it from the specs."""

from kio.schema.errors import ErrorCode as KioErrorCode

from sluice.codec.error_codes import ErrorCode, error_name


def test_enum_equals_kio_list() -> None:
    ours = {m.name: int(m) for m in ErrorCode}
    theirs = {m.name.upper(): int(m) for m in KioErrorCode}
    assert ours == theirs


def test_names() -> None:
    assert ErrorCode.POLICY_VIOLATION == 44
    assert error_name(100) == "UNKNOWN_TOPIC_ID"
    assert error_name(9999) == "UNKNOWN_CODE_9999"
