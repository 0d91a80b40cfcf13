"""Example (seed 000, Sluice ABI): enrich JSON events with a timestamp and drop events without
a user_id, written with the Python SDK (the same filter as filters/examples/enrich in C).

- value not a JSON object  -> reject ("value is not a JSON object: <parser error>")
- no top-level "user_id"   -> drop
- no top-level "timestamp" -> add "timestamp": the record's own timestamp as RFC 3339 UTC with
  milliseconds (a Wasm filter has no clock; the record timestamp is what the producer set)
- otherwise                -> keep, byte for byte

The original text is kept as it is; the new member is appended before the closing brace.
"""

import sluice_filter as sluice
from sluice_filter.json_parse import JSONError, parse_json


def civil_from_days(z: int) -> tuple[int, int, int]:
    """Days since 1970-01-01 to a civil date (proleptic Gregorian)."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def rfc3339(ms: int) -> str:
    secs, milli = divmod(ms, 1000)
    days, sod = divmod(secs, 86400)
    y, m, d = civil_from_days(days)
    return (f"{y:04d}-{m:02d}-{d:02d}T{sod // 3600:02d}:{sod // 60 % 60:02d}:"
            f"{sod % 60:02d}.{milli:03d}Z")


@sluice.on_record
def enrich(rec: sluice.Record) -> sluice.Decision:
    value = rec.value
    if value is None:
        return sluice.reject("value is not a JSON object: null value")
    try:
        doc = parse_json(value)
    except JSONError as exc:
        return sluice.reject("value is not a JSON object: " + exc.message)
    if not isinstance(doc, dict):
        return sluice.reject("value is not a JSON object")
    if "user_id" not in doc:
        sluice.count("dropped_no_user_id")
        return sluice.drop()
    if "timestamp" in doc:
        return sluice.keep()
    # The object has a member (user_id), so a comma goes before the new one.
    closing = value.rindex(b"}")
    stamp = b',"timestamp":"' + rfc3339(rec.timestamp_ms).encode() + b'"'
    sluice.count("timestamp_added")
    return rec.with_value(value[:closing] + stamp + value[closing:])
