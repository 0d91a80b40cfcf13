"""Example (seeds 001/002): upper-case every record value, written with the Python SDK.

ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
(tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
filter as filters/examples/upper (Zig), upper-c, upper-rust, upper-as and upper-go.
"""

import sluice_filter as sluice

_LOWER = bytes(range(ord("a"), ord("z") + 1))
_TABLE = bytes.maketrans(_LOWER, _LOWER.upper())


@sluice.on_record
def upper(rec: sluice.Record) -> sluice.Decision:
    value = rec.value
    if value is None:
        return sluice.keep()
    out = value.translate(_TABLE)
    if out == value:
        return sluice.keep()  # empty or nothing to change
    sluice.count("upper_cased")
    return rec.with_value(out)
