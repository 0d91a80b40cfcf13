"""{{NAME}}: a Sluice filter (Sluice ABI v1 layouts, Python SDK).

The @sluice.on_record function runs once per record and returns what becomes of it:

    sluice.keep() or None                    pass it on unchanged
    rec.with_value(b)                        pass it on with a new value (rec.with_key: new key)
    sluice.rewrite(key, value, headers)      ... or a new key, value and headers
    sluice.drop()                            silently remove it
    sluice.reject("why")                     refuse it (the producer gets INVALID_RECORD)
    an exception                             fail the whole batch (the on_error policy applies)

rec.key, rec.value and header values are bytes, None when null; header names are str.

This starter rejects records without a value, drops records whose "x-drop" header is "yes",
tags the rest by appending the configured suffix to the value, and counts what it did.
"""

import sluice_filter as sluice

suffix = b" [checked]"


@sluice.on_init
def configure(config: dict) -> None:
    global suffix
    value = config.get("suffix", " [checked]")
    if not isinstance(value, str):
        raise ValueError("config.suffix must be a string")  # refuses the config
    suffix = value.encode()


@sluice.on_record
def starter(rec: sluice.Record) -> sluice.Decision:
    if not rec.value:
        sluice.count("rejected_empty")
        return sluice.reject("{{NAME}}: a record needs a value")
    if rec.header("x-drop") == b"yes":
        sluice.count("dropped")
        return sluice.drop()
    sluice.count("tagged")
    return rec.with_value(rec.value + suffix)
