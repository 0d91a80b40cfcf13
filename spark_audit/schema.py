"""Spark schemas: the JSON events of telemetry schema version 1 (docs/TELEMETRY.md), read
explicitly, and the flat datasets of the columnar layout (``spark_schema``).

One flat struct holds the fields of every event type; a field an event type does not have is
null. Reading with an explicit schema (instead of inference) keeps a 10-million-line read to
one pass and makes the job independent of which fields happen to appear in a sample.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.telemetry_schema.columns import SCHEMAS

SCHEMA_VERSION = 1
# The column every table of the job carries (``sources``): null on the rows the reports use,
# else why the job skips the row; the aggregations count those rows and report none of them.
SKIP = "_skip"
MALFORMED = "malformed"
UNKNOWN_VERSION = "unknown_schema_version"


def spark_schema(dataset: str) -> StructType:
    """The Spark schema of one dataset of the columnar layout (from its Arrow schema)."""
    return from_arrow_schema(SCHEMAS[dataset])


_S = StringType()
_L = LongType()
_I = IntegerType()


def _f(name: str, dtype: object) -> StructField:
    return StructField(name, dtype, True)  # type: ignore[arg-type]


FILTER_STATS = StructType(
    [
        _f("name", _S),
        _f("module_sha256", _S),
        _f("kept", _L),
        _f("rewritten", _L),
        _f("dropped", _L),
        _f("rejected", _L),
        _f("detectors", MapType(_S, _L)),
        _f("time_ns", _L),
        _f("errors", ArrayType(_S)),
        # Only in events of signed fleet filters (null otherwise, and in older events).
        _f("signer_key_id", _S),
    ]
)

FILTER_REF = StructType([_f("name", _S), _f("module_sha256", _S)])

API_COUNTERS = StructType([_f("requests", _L), _f("bytes_in", _L), _f("bytes_out", _L)])

PROXY = StructType([_f("host", _S), _f("pid", _I), _f("instance_id", _S)])

TRANSFORM_INPUT = StructType(
    [_f("topic", _S), _f("partition", _I), _f("offset_first", _L), _f("offset_last", _L)]
)
TRANSFORM_OUTPUT = StructType(
    [_f("partition", _I), _f("offset_first", _L), _f("offset_last", _L), _f("records", _L)]
)

TELEMETRY_V1 = StructType(
    [
        # envelope
        _f("schema_version", _I),
        _f("type", _S),
        _f("event_id", _S),
        _f("time", _S),
        _f("time_ms", _L),
        _f("proxy", PROXY),
        # shared by record_batch, admin, connection
        _f("connection_id", _S),
        _f("client_address", _S),
        _f("client_id", _S),
        _f("principal", _S),
        # record_batch
        _f("api", _S),
        _f("topic", _S),
        _f("partition", _I),
        _f("offset_first", _L),
        _f("offset_last", _L),
        _f("records_in", _L),
        _f("records_out", _L),
        _f("bytes_in", _L),
        _f("bytes_out", _L),
        _f("batches", _L),
        _f("filters", ArrayType(FILTER_STATS)),
        _f("error_code", _I),
        _f("error_message", _S),
        _f("reject_reasons", MapType(_S, _L)),
        _f("dead_letters", _L),
        # admin
        _f("op", _S),
        _f("resource_type", _S),
        _f("resource", _S),
        _f("decision", _S),
        _f("message", _S),
        _f("filter", FILTER_REF),
        _f("time_ns", _L),
        # connection
        _f("phase", _S),
        _f("listener", _S),
        _f("upstream", _S),
        _f("tls", BooleanType()),
        _f("apis", MapType(_S, API_COUNTERS)),
        _f("duration_ms", _L),
        _f("throttle_ms", _L),
        # filter_loaded
        _f("module", _S),
        _f("function", _S),
        _f("topics", ArrayType(_S)),
        _f("apply_to", ArrayType(_S)),
        _f("on_error", _S),
        _f("principals", ArrayType(_S)),
        # telemetry_dropped
        _f("dropped", _L),
        _f("reason", _S),
        _f("since_ms", _L),
        _f("until_ms", _L),
        # transform_batch (records_in/out, dropped, dead_letters, filters, reject_reasons:
        # as above)
        _f("transform", _S),
        _f("group", _S),
        _f("guarantee", _S),
        _f("transactional_id", _S),
        _f("input", TRANSFORM_INPUT),
        _f("output_topic", _S),
        _f("outputs", ArrayType(TRANSFORM_OUTPUT)),
    ]
)

# The columns Spark's own Kafka source produces; the Python Kafka reader yields the same, so
# either can feed the job.
KAFKA_ROWS = StructType(
    [
        _f("key", BinaryType()),
        _f("value", BinaryType()),
        _f("topic", _S),
        _f("partition", _I),
        _f("offset", _L),
        _f("timestamp", TimestampType()),
        _f("timestampType", _I),
    ]
)
