"""Telemetry in: the flat datasets of the columnar layout, from whatever the user points at.

- a directory (local, ``file://``, ``s3a://``, ``hdfs://``...) holding the Parquet layout
  (``<dataset>/date=YYYY-MM-DD/hour=HH/*.parquet``, possibly several proxies' trees collected
  under one root) and/or JSON Lines files of the old sink (``*.jsonl``); both are read;
- ``kafka://HOST:PORT/TOPIC`` with Arrow IPC messages of the columnar Kafka sink and/or JSON
  messages of the old one.

Whatever the source, the job sees the same thing (``Inputs``): the Parquet files on a local
path as a list (``local_files``: the job's tasks read them with pyarrow, see ``rollups``), a
Kafka topic as its partitions (``kafka``: a task reads each and aggregates its Arrow messages;
the JSON messages, if any, become DataFrames through ``kafka_json_tables``), and everything
else as one DataFrame per dataset of ``telemetry_columns.SCHEMAS`` (``tables``),
restricted to the ``--from/--to`` window, with one more column, ``_skip`` (``SKIP``): null on
the rows the reports use, else why the job cannot use the row (``malformed``: no version or no
time; ``unknown_schema_version``; ``rollups.classify`` applies the same rule to the files).
Skipped rows stay in the tables so that the aggregation that reads a dataset for its report
also counts them (one scan per dataset); every aggregation keeps them apart. ``checks`` holds
one small row per JSON line the job cannot use (it never became a table row: unparsable,
unknown type or version), counted by its own aggregation, so that nothing is dropped without a
word.

Files are listed by the driver (Python for local paths, Hadoop's FileSystem API otherwise);
the same published file found twice (``<dataset>/date=/hour=/<name>``, e.g. a proxy's folder
collected twice) is read once. Hours outside ``--from/--to`` are not even listed for reading.

With trusted telemetry keys (a ``Verifier``) only files and messages whose tag verifies are
read. The tasks that read local Parquet files check each file as they read it (``rollups``);
files Spark reads itself (JSON Lines, ``--dedupe``, Hadoop URLs) are checked here first, and
only those that verify are handed to Spark (``Inputs.integrity`` counts the rest). Of the
copies of one published file, the first that verifies is read: a forged copy found first
does not hide the real one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from sluice.spark_audit import json_tables
from sluice.spark_audit.load import KafkaUrl, parse_kafka_url
from sluice.spark_audit.schema import (
    MALFORMED,
    SCHEMA_VERSION,
    SKIP,
    TELEMETRY_V1,
    UNKNOWN_VERSION,
    spark_schema,
)
from sluice.telemetry_schema.columns import (
    DATASETS,
    EVENT_TABLES,
    FIRST_ROW,
    HOUR_MS,
    ROLLUPS,
    SCHEMAS,
    time_column,
)
from sluice.telemetry_schema.integrity import TAG_SUFFIX, Verifier, read_sidecar

DEFAULT_GLOB = "*.jsonl"
_PARQUET_FILE = re.compile(
    r"(?:^|/)(?P<dataset>[a-z_]+)/date=(?P<date>\d{4}-\d{2}-\d{2})/hour=(?P<hour>\d{2})/"
    r"(?P<name>[^/._][^/]*\.parquet)$"
)
CORRUPT = "_corrupt_record"


@dataclass(frozen=True)
class LocalFile:
    """One published Parquet file of the layout on a path the executors see: its dataset, its
    hour (``YYYY-MM-DD/HH``) and its path."""

    dataset: str
    hour: str
    path: str


@dataclass(frozen=True)
class Window:
    """``--from/--to`` as epoch milliseconds (None: open)."""

    from_ms: int | None = None
    to_ms: int | None = None


@dataclass(frozen=True)
class KafkaInput:
    """A ``kafka://`` topic: the options of its reader (``KafkaArrowReader``) and its
    partitions, each read by one task."""

    options: dict[str, str]
    partitions: list[Any]


@dataclass
class Inputs:
    """``tables``: the datasets Spark reads (JSON Lines, Kafka, ``--dedupe``, Hadoop URLs),
    classified and restricted to the window; ``local_files``: the Parquet files the job's tasks
    read themselves (``rollups``), with ``window``."""

    tables: dict[str, DataFrame]
    checks: DataFrame | None
    files: dict[str, int] = field(default_factory=dict)
    duplicate_files: int = 0
    local_files: list[LocalFile] = field(default_factory=list)
    window: Window = field(default_factory=Window)
    # A ``kafka://`` topic (the python reader): its tasks read and aggregate the Arrow
    # messages themselves (``rollups.run_kafka_task``).
    kafka: KafkaInput | None = None
    # The trusted telemetry keys (None: nothing is verified), and the files checked here
    # (``rollups.integrity_table``'s rows: source, dataset, outcome, units).
    verifier: Verifier | None = None
    integrity: list[dict[str, Any]] = field(default_factory=list)


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path[len("file://") :] if path.startswith("file://") else path)


def list_files(spark: SparkSession, root: str) -> list[str]:
    """Every file under ``root`` (recursively); local paths without the JVM."""
    if is_local(root):
        base = local_path(root)
        if base.is_file():
            return [str(base)]
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            out.extend(os.path.join(dirpath, f) for f in filenames)
        return sorted(out)
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(root)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.getFileStatus(path).isFile():
        return [root]
    prefix = str(fs.makeQualified(path).toString()).rstrip("/") + "/"
    found = []
    files = fs.listFiles(path, True)
    while files.hasNext():
        text = str(files.next().getPath().toString())
        relative = text[len(prefix) :] if text.startswith(prefix) else text.rsplit("/", 1)[-1]
        # Hidden and underscore folders and files (the spool, temporary names) are not data.
        if not any(part.startswith((".", "_")) for part in relative.split("/")):
            found.append(text)
    return sorted(found)


def _hour_in_window(date: str, hour: str, from_ms: int | None, to_ms: int | None) -> bool:
    start = int(datetime.fromisoformat(f"{date}T{hour}:00:00+00:00").timestamp() * 1000)
    if from_ms is not None and start + HOUR_MS <= from_ms:
        return False
    return not (to_ms is not None and start >= to_ms)


def _window(col: Column, from_ms: int | None, to_ms: int | None) -> Column:
    cond = F.lit(True)
    if from_ms is not None:
        cond = cond & (col >= F.lit(from_ms))
    if to_ms is not None:
        cond = cond & (col < F.lit(to_ms))
    return cond


def read_inputs(
    spark: SparkSession,
    source: str,
    *,
    time_from_ms: int | None = None,
    time_to_ms: int | None = None,
    glob: str | None = DEFAULT_GLOB,
    dedupe: bool = False,
    kafka_reader: str = "python",
    input_format: str = "auto",
    verifier: Verifier | None = None,
    kafka_security: Mapping[str, str] | None = None,
) -> Inputs:
    """``input_format``: ``auto`` reads both layouts, ``columnar`` or ``json`` only one.
    ``kafka_security``: librdkafka settings (TLS, SASL) for a ``kafka://`` source.
    ``verifier``: read only what its keys authenticate (see the module's docstring)."""
    kafka = parse_kafka_url(source)
    if kafka is not None:
        if verifier is not None and kafka_reader == "spark":
            raise ValueError("--kafka-reader spark cannot verify telemetry tags: use the "
                             "python reader with --telemetry-key")
        found_kafka = _kafka_inputs(spark, kafka, time_from_ms, time_to_ms, kafka_reader,
                                    kafka_security or {})
        found_kafka.verifier = verifier
        return found_kafka
    parquet: dict[str, dict[tuple[str, str, str], str]] = {d: {} for d in DATASETS}
    jsonl: dict[str, str] = {}
    # Every copy of a published file (the first one in ``parquet``/``jsonl``), by its name.
    copies: dict[tuple[str, ...], list[str]] = {}
    duplicates = 0
    pattern = re.compile(_glob_regex(glob)) if glob else None
    listed = list_files(spark, source)
    for path in listed:
        match = _PARQUET_FILE.search(path)
        if match is not None and match["dataset"] in parquet and input_format != "json":
            key = (match["date"], match["hour"], match["name"])
            if not _hour_in_window(match["date"], match["hour"], time_from_ms, time_to_ms):
                continue
            copies.setdefault((match["dataset"], *key), []).append(path)
            if key in parquet[match["dataset"]]:
                duplicates += 1
                continue
            parquet[match["dataset"]][key] = path
            continue
        name = path.rsplit("/", 1)[-1]
        if name.endswith((".parquet", TAG_SUFFIX)) or input_format == "columnar":
            continue  # a tag is read with the file it tags
        if pattern is None or pattern.fullmatch(name):
            copies.setdefault(("jsonl", name), []).append(path)
            if name in jsonl:
                duplicates += 1
                continue
            jsonl[name] = path
    tables: dict[str, list[DataFrame]] = {d: [] for d in DATASETS}
    checks: list[DataFrame] = []
    files = {d: len(v) for d, v in parquet.items() if v}
    local: list[LocalFile] = []
    # Local files are read by the job's tasks with pyarrow, unless --dedupe needs them in a
    # DataFrame (de-duplication is a shuffle over every file).
    tasks_read = is_local(source) and not dedupe
    integrity: list[dict[str, Any]] = []
    if verifier is not None:
        parquet, jsonl, integrity = _verified(spark, verifier, parquet, jsonl, copies,
                                              set(listed), check_parquet=not tasks_read)
    for dataset, found in parquet.items():
        if not found:
            continue
        if tasks_read:
            local.extend(LocalFile(dataset, f"{date}/{hour}", path)
                         for (date, hour, _name), path in sorted(found.items()))
            continue
        df = spark.read.schema(spark_schema(dataset)).parquet(*sorted(found.values()))
        if dedupe and dataset not in ROLLUPS:
            df = dedupe_rows(df, _event_keys(dataset))
        tables[dataset].append(_classified(df, dataset, time_from_ms, time_to_ms))
    if jsonl:
        files["jsonl"] = len(jsonl)
        raw = spark.read.schema(_with_corrupt(TELEMETRY_V1)).json(sorted(jsonl.values()))
        if dedupe:
            raw = dedupe_rows(raw, ["event_id"])
        checks.append(_json_skipped(raw, with_key=dedupe))
        good = _good_json(raw, time_from_ms, time_to_ms)
        for dataset, df in json_tables.flatten(good).items():
            tables[dataset].append(df)
    merged = {
        d: _union(d, dfs, dedupe=dedupe, latest=dedupe) for d, dfs in tables.items() if dfs
    }
    checked = _union_all(checks) if checks else None
    if checked is not None and dedupe:
        checked = dedupe_rows(checked, ["type", "key"])
    return Inputs(
        tables=merged,
        checks=checked,
        files=files,
        duplicate_files=duplicates,
        local_files=local,
        window=Window(time_from_ms, time_to_ms),
        verifier=verifier,
        integrity=integrity,
    )


def _verified(
    spark: SparkSession,
    verifier: Verifier,
    parquet: dict[str, dict[tuple[str, str, str], str]],
    jsonl: dict[str, str],
    copies: dict[tuple[str, ...], list[str]],
    listed: set[str],
    *,
    check_parquet: bool,
) -> tuple[dict[str, dict[tuple[str, str, str], str]], dict[str, str], list[dict[str, Any]]]:
    """The files to read once tags are checked: of the copies of a file, the first that
    verifies. The Parquet files the tasks read (``check_parquet`` False) are checked by the
    tasks themselves: only those with several copies are checked here, to pick one. Returns
    the files and the counts of what was checked here."""
    todo: list[tuple[str, str]] = []  # (name the tag covers, path)
    for key, paths in copies.items():
        if key[0] == "jsonl":
            todo.extend((key[1], p) for p in paths)
        elif check_parquet or len(paths) > 1:
            dataset, date, hour, name = key
            todo.extend((f"{dataset}/date={date}/hour={hour}/{name}", p) for p in paths)
    if not todo:
        return parquet, jsonl, []
    outcome = check_files(spark, verifier, todo, listed)
    tally: dict[tuple[str, str, str], int] = {}
    for key, paths in copies.items():
        checked = [p for p in paths if p in outcome]
        if not checked:
            continue  # read and checked by a task
        kind = key[0]
        good = next((p for p in checked if outcome[p] is None), None)
        task_reads = kind != "jsonl" and not check_parquet
        for p in checked:
            reason = outcome[p]
            if reason is None:
                # Once a copy verified, its other copies are duplicates, not failures.
                if p == good and not task_reads:
                    tally[("files", kind, "verified")] = tally.get(("files", kind, "verified"),
                                                                   0) + 1
                continue
            if task_reads and good is None and p == paths[0]:
                continue  # the task reads it and counts it
            tally[("files", kind, reason)] = tally.get(("files", kind, reason), 0) + 1
        if kind == "jsonl":
            if good is None:
                jsonl.pop(key[1], None)
            else:
                jsonl[key[1]] = good
            continue
        dataset, date, hour, name = key
        if good is not None:
            parquet[dataset][(date, hour, name)] = good
        elif not task_reads:
            parquet[dataset].pop((date, hour, name), None)
    rows = [{"source": s, "dataset": d, "outcome": o, "units": n}
            for (s, d, o), n in sorted(tally.items()) if n]
    return parquet, jsonl, rows


def check_files(spark: SparkSession, verifier: Verifier, files: list[tuple[str, str]],
                listed: set[str]) -> dict[str, str | None]:
    """Each file's verdict (None: its tag verifies; else why not) from ``(name the tag
    covers, path)`` pairs: local files read by the driver, others by a Spark job (the
    ``binaryFile`` source), their sidecar tags too."""
    if all(is_local(p) for _n, p in files):
        out: dict[str, str | None] = {}
        for name, path in files:
            local = str(local_path(path))
            with open(local, "rb") as f:
                data = f.read()
            out[path] = verifier.check_file(name, data, read_sidecar(local))
        return out
    tag_paths = sorted({p + TAG_SUFFIX for _n, p in files} & listed)
    tags: dict[str, bytes] = {}
    if tag_paths:
        for row in spark.read.format("binaryFile").load(tag_paths).select(
                "path", "content").collect():
            tags[_same_path(row["path"], tag_paths)] = bytes(row["content"])
    by_path = {p: (n, tags.get(p + TAG_SUFFIX)) for n, p in files}
    paths = sorted(by_path)

    def check(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            found = [_same_path(p, paths) for p in batch.column("path").to_pylist()]
            verdicts = []
            for path, content in zip(found, batch.column("content").to_pylist(), strict=True):
                name, tag = by_path[path]
                verdicts.append(verifier.check_file(name, content, tag) or "")
            yield pa.RecordBatch.from_pydict({"path": found, "reason": verdicts})

    rows = (spark.read.format("binaryFile").load(paths).select("path", "content")
            .mapInArrow(check, "path string, reason string").collect())
    return {r["path"]: (r["reason"] or None) for r in rows}


def _same_path(seen: str, paths: list[str]) -> str:
    """The path of ``paths`` that Spark reported as ``seen`` (qualified: ``file:/x`` for
    ``/x``): the one it ends with."""
    if seen in paths:
        return seen
    best = [p for p in paths if seen.endswith(p.split("://", 1)[-1])]
    return max(best, key=len) if best else seen


def _glob_regex(glob: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)


def _with_corrupt(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(CORRUPT, StringType(), True)])


def _malformed_parquet(df: DataFrame, dataset: str) -> Column:
    # A row without a version or a time cannot be placed; rows of another schema version are
    # counted as such, whatever their columns hold. (Ids are not checked here: reading a
    # string column of every row would cost more than the rest of the check.)
    return F.col("schema_version").isNull() | (
        (F.col("schema_version") == SCHEMA_VERSION) & F.col(time_column(dataset)).isNull()
    )


def _good_json(raw: DataFrame, from_ms: int | None, to_ms: int | None) -> DataFrame:
    """The events of a JSON read that the reports use (the rest is counted by the checks)."""
    return raw.filter(
        F.col(CORRUPT).isNull()
        & (F.col("schema_version") == SCHEMA_VERSION)
        & F.col("type").isin(*EVENT_TABLES)
        & F.col("time_ms").isNotNull()
        & _window(F.col("time_ms"), from_ms, to_ms)
    ).drop(CORRUPT)


def _json_skipped(raw: DataFrame, with_key: bool = False) -> DataFrame:
    """One row per JSON event the job cannot use (the others are counted as table rows)."""
    bad = (
        F.col(CORRUPT).isNotNull()
        | F.col("type").isNull()
        | F.col("time_ms").isNull()
        | ~F.col("type").isin(*EVENT_TABLES)
        | F.col("schema_version").isNull()
    )
    return raw.filter(bad | (F.col("schema_version") != SCHEMA_VERSION)).select(
        F.when(F.col("type").isin(*EVENT_TABLES), F.col("type"))
        .otherwise(F.lit("(unreadable)"))
        .alias("type"),
        (F.col("event_id") if with_key else F.lit(None).cast("string")).alias("key"),
        F.when(bad, MALFORMED).otherwise(UNKNOWN_VERSION).alias(SKIP),
    )


def _classified(
    df: DataFrame, dataset: str, from_ms: int | None, to_ms: int | None
) -> DataFrame:
    """The rows of the window, and every row the job skips, with ``SKIP`` saying why."""
    skip = F.when(_malformed_parquet(df, dataset), MALFORMED).when(
        F.col("schema_version") != SCHEMA_VERSION, UNKNOWN_VERSION
    )
    return df.withColumn(SKIP, skip).filter(
        F.col(SKIP).isNotNull() | _window(F.col(time_column(dataset)), from_ms, to_ms)
    )


def _union_all(dfs: list[DataFrame]) -> DataFrame:
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out


def _union(dataset: str, dfs: list[DataFrame], *, dedupe: bool, latest: bool) -> DataFrame:
    df = _union_all([
        d.select(*SCHEMAS[dataset].names,
                 F.col(SKIP) if SKIP in d.columns else F.lit(None).cast("string").alias(SKIP))
        for d in dfs
    ])
    if dataset in ROLLUPS:
        # A Kafka topic holds several versions of a rollup row (a segment is sent again at
        # every flush while it grows): the highest is the row. Published files hold one
        # version per id already (the sink compacts them), so files skip this shuffle unless
        # --dedupe asks for it.
        if latest:
            df = latest_rollups(df)
    elif dedupe:
        # Also across layouts: the same event in a JSON Lines file and a Parquet file.
        # Skipped rows are all kept (each is counted).
        keys = _event_keys(dataset)
        df = (df.withColumn("_apart", _apart())
              .dropDuplicates([*keys, "_apart"]).drop("_apart"))
    return df


def _apart() -> Column:
    """A key part that is unique on skipped rows (so no de-duplication merges them), null on
    the others."""
    return F.when(F.col(SKIP).isNotNull(), F.monotonically_increasing_id())


def _event_keys(dataset: str) -> list[str]:
    if dataset == "connection_api":
        return ["event_id", "api"]
    if dataset in FIRST_ROW:
        return ["event_id", FIRST_ROW[dataset]]
    return ["event_id"]


def dedupe_rows(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key; rows without a key (malformed) are all kept, to be counted."""
    has_key = F.lit(True)
    for key in keys:
        has_key = has_key & F.col(key).isNotNull()
    return df.filter(has_key).dropDuplicates(keys).unionByName(df.filter(~has_key))


def latest_rollups(df: DataFrame) -> DataFrame:
    """The highest version of each rollup row id; skipped rows are all kept."""
    cols = [c for c in df.columns if c != "id"]
    best = df.groupBy("id", _apart().alias("_apart")).agg(
        F.max_by(F.struct(*cols), F.col("version")).alias("r"))
    return best.select("id", "r.*").select(*df.columns)


def _kafka_inputs(
    spark: SparkSession,
    kafka: KafkaUrl,
    from_ms: int | None,
    to_ms: int | None,
    kafka_reader: str,
    security: Mapping[str, str],
) -> Inputs:
    secured = security.get("security.protocol", "PLAINTEXT") != "PLAINTEXT"
    if kafka_reader == "spark" and secured:
        raise ValueError("--kafka-reader spark does not take --config's TLS/SASL settings: "
                         "use the python reader")
    if kafka_reader == "spark":
        # Spark's own connector (its jar must be on the classpath): JSON messages only.
        values = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", kafka.topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
            .select(F.col("value").cast("string").alias("value"))
        )
        merged, checks = _json_message_tables(values, from_ms, to_ms)
        return Inputs(tables=merged, checks=checks)
    if kafka_reader != "python":
        raise ValueError(f"kafka reader {kafka_reader!r}: expected python or spark")
    from sluice.spark_audit.kafka_arrow_source import RAW, KafkaArrowReader

    # The topic's partitions (a metadata request from the driver: a missing topic or no
    # broker is a clear error here); the job's tasks read them (``rollups``).
    # The tasks' consumers take ``kafka.``-prefixed options as librdkafka settings.
    reader = KafkaArrowReader({"bootstrap.servers": kafka.bootstrap, "subscribe": kafka.topic,
                               "dataset": RAW,
                               **{f"kafka.{key}": value for key, value in security.items()}})
    return Inputs(tables={}, checks=None,
                  kafka=KafkaInput(reader.options, list(reader.partitions())),
                  window=Window(from_ms, to_ms))


def kafka_json_tables(spark: SparkSession, kafka: KafkaInput, window: Window,
                      verifier: Verifier | None = None
                      ) -> tuple[dict[str, DataFrame], DataFrame]:
    """The JSON messages of the old Kafka sink in ``kafka``'s topic (a fleet half upgraded) as
    DataFrames of the datasets, and their checks: a second read of the topic, which the job
    makes only when its Arrow tasks found such messages (with ``verifier``: the messages that
    verify; the first read counted the others)."""
    from sluice.spark_audit.kafka_arrow_source import KafkaArrowReader

    options = kafka.options
    texts = spark.sparkContext.parallelize(kafka.partitions, len(kafka.partitions)).flatMap(
        lambda partition: [(text,) for batch
                           in KafkaArrowReader(options, verifier).json_texts(partition)
                           for text in batch.column("value").to_pylist()])
    return _json_message_tables(spark.createDataFrame(texts, "value string"), window.from_ms,
                                window.to_ms)


def _json_message_tables(values: DataFrame, from_ms: int | None, to_ms: int | None
                         ) -> tuple[dict[str, DataFrame], DataFrame]:
    """JSON messages (a ``value`` string column) as the datasets' DataFrames, and their
    checks."""
    tables: dict[str, list[DataFrame]] = {d: [] for d in DATASETS}
    checks: list[DataFrame] = []
    _add_json_messages(values, tables, checks, from_ms, to_ms)
    merged = {d: _union(d, dfs, dedupe=False, latest=True) for d, dfs in tables.items() if dfs}
    return merged, _union_all(checks)


def _add_json_messages(
    values: DataFrame,
    tables: dict[str, list[DataFrame]],
    checks: list[DataFrame],
    from_ms: int | None,
    to_ms: int | None,
) -> None:
    """JSON events (a ``value`` string column) into the datasets, de-duplicated by event id
    (the JSON sink delivers at least once)."""
    raw = values.select(
        F.from_json(
            F.col("value"),
            _with_corrupt(TELEMETRY_V1),
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        ).alias("e")
    ).select("e.*")
    raw = dedupe_rows(raw, ["event_id"])
    checks.append(_json_skipped(raw))
    good = _good_json(raw, from_ms, to_ms)
    for dataset, df in json_tables.flatten(good).items():
        tables[dataset].append(df)


def utc_iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO-8601 UTC with a ``Z``, whatever the machine's zone."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
