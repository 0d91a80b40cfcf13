"""The ``encryption`` report: what ``builtin:encrypt`` did, from ``record_batch`` events.

It reads only the telemetry schema: the encrypt filter's counters in a filter entry's
``detectors`` (docs/ENCRYPTION.md, *Audit*). One row per

- ``section = "encrypted"``: topic, partition, KEK name and version, the offset range the
  broker assigned to records sealed under that version (``offset_first`` .. ``offset_last``,
  from produce events), ``records`` and ``batches``;
- ``section = "read"``: topic and principal, with ``decrypted``, ``withheld`` (encrypted
  records that principal received as stored), ``unreadable`` (KEK deleted) and ``failures``
  (fetches of encrypted topics that ended in a partition error: KMS down, tampering).

A produce batch is sealed under one KEK version, so an event's offsets belong to that version.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

KEK_PREFIX = "kek:"
_READ_COUNTERS = ("decrypted", "withheld", "unreadable")


def _count(name: str) -> Column:
    return F.coalesce(F.col("f.detectors").getItem(name), F.lit(0)).cast("long")


def encryption(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """The report (see the module docstring); `frows` is unused (same signature as the
    other report builders)."""
    del frows
    rb = events.filter(F.col("type") == "record_batch").select(
        "api", "topic", "partition", "principal", "offset_first", "offset_last", "error_code",
        F.explode("filters").alias("f"))
    produced = (
        rb.filter(F.col("api") == "produce")
        .select("topic", "partition", "offset_first", "offset_last",
                F.explode(F.col("f.detectors")).alias("counter", "n"))
        .filter(F.col("counter").startswith(KEK_PREFIX))
        .withColumn("kek", F.split(F.substring(F.col("counter"), len(KEK_PREFIX) + 1, 1000),
                                   ":"))
        .groupBy("topic", "partition", F.col("kek")[0].alias("key_name"),
                 F.col("kek")[1].alias("key_version"))
        .agg(F.min("offset_first").alias("offset_first"),
             F.max("offset_last").alias("offset_last"),
             F.sum("n").cast("long").alias("records"),
             F.count(F.lit(1)).cast("long").alias("batches"))
        .select(F.lit("encrypted").alias("section"), "topic", "partition", "key_name",
                "key_version", F.lit(None).cast("string").alias("principal"),
                "offset_first", "offset_last", "records", "batches",
                *[F.lit(None).cast("long").alias(c) for c in (*_READ_COUNTERS, "failures")])
    )
    encrypting = (rb.filter(F.col("api") == "produce")
                  .filter(F.exists(F.map_keys(F.col("f.detectors")),
                                   lambda k: k.startswith(KEK_PREFIX)))
                  .select("topic").distinct())
    fetched = rb.filter(F.col("api") == "fetch")
    read = (
        fetched.join(encrypting, "topic", "left_semi")
        .groupBy("topic", F.coalesce(F.col("principal"), F.lit("User:ANONYMOUS"))
                 .alias("principal"))
        .agg(*[F.sum(_count(c)).cast("long").alias(c) for c in _READ_COUNTERS],
             F.sum(F.when(F.coalesce(F.col("error_code"), F.lit(0)) != 0, 1).otherwise(0))
             .cast("long").alias("failures"))
        .filter(sum((F.col(c) for c in (*_READ_COUNTERS, "failures")), F.lit(0)) > 0)
        .select(F.lit("read").alias("section"), "topic",
                F.lit(None).cast("int").alias("partition"),
                F.lit(None).cast("string").alias("key_name"),
                F.lit(None).cast("string").alias("key_version"), "principal",
                F.lit(None).cast("long").alias("offset_first"),
                F.lit(None).cast("long").alias("offset_last"),
                F.lit(None).cast("long").alias("records"),
                F.lit(None).cast("long").alias("batches"), *_READ_COUNTERS, "failures")
    )
    return produced.unionByName(read).orderBy("section", "topic", "partition", "key_name",
                                              "key_version", "principal")
